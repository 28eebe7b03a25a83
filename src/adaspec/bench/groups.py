"""One group of a sweep (see :mod:`adaspec.bench.sweep`): its cold plain reference, its speculative points, and a
plain run again before every ``plain_every`` of them, at batch size 1 (one prompt through
:class:`~adaspec.engine.SpeculativeEngine`) or B > 1 (B prompts through :class:`~adaspec.batch.BatchEngine`). Each
record is written as soon as it is measured."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from adaspec.backends.prefix_cache import PrefixCacheBackend
from adaspec.bench.costmodel import FittedCostModel
from adaspec.bench.grid import Point, point_key
from adaspec.bench.loading import Models, prefill_draft, tokenizer_of
from adaspec.bench.metrics import batch_metrics, run_metrics
from adaspec.bench.micro import prefill_ms_at
from adaspec.bench.predict import predict_point, resolve_cost
from adaspec.bench.results import apply_baseline, record_hash, same_setting


@dataclass
class _Group:
    """One group's run: its generation config, key, prompt ids (one per batch row), the fields every record of the
    group carries, and how many plain runs of it the results hold (the next plain record's index)."""

    cfg: object  # adaspec.engine.GenerationConfig
    key: str
    prompts: list[list[int]]
    info: dict
    plains: int


def _label(p: Point) -> str:
    """A point in the progress bar."""
    batch = f"B={p.setting.batch} " if p.setting.batch > 1 else ""
    return f"{batch}ctx {p.context} {p.drafter}{'' if p.alpha is None else f' a={p.alpha:g}'} K={p.k} {p.controller}"


class GroupRuns:
    """Runs the groups of one hardware setting for ``runner`` (a :class:`~adaspec.bench.sweep.SweepRunner`: its
    ``bench`` settings, meter, ``write``, ``log``, ``prompts``, ``over_time`` and ``run_id``) with the setting's
    loaded ``models`` and fitted ``cost`` model, appending records to the open results file ``f`` and to ``rows``
    (every record read or written so far), ``bar`` the progress bar and ``start`` the run's start
    (``time.perf_counter()``) for the time limit."""

    def __init__(self, runner, models: Models, cost: FittedCostModel, f, rows: list[dict], bar, start: float) -> None:
        self.runner, self.models, self.cost, self.f, self.rows, self.bar, self.start = (
            runner, models, cost, f, rows, bar, start)
        self.bench, self.meter = runner.bench, runner.meter

    def run(self, pts: list[Point]) -> tuple[int, int]:
        """Run a group's points not yet in the results (see the module docstring); returns (run, skipped)."""
        group = self._start(pts)
        if group is None:
            return 0, len(pts)
        runs = self._single_runs if pts[0].setting.batch == 1 else self._batched_runs
        plain, point = runs(group, pts)
        n_run = 0
        for p in self._points_due(pts, plain):
            self.bar.set_postfix_str(_label(p) + (f" tree {p.tree_choice}:{p.tree}" if p.tree else ""), refresh=True)
            row, predicted = point(p)
            self._record_point(row, predicted)
            n_run += 1
            self.bar.update(1)
        return n_run, 0

    def _start(self, pts: list[Point]) -> _Group | None:
        """What every group starts with (see :class:`_Group`), or None (its points counted as skipped) when the
        longest prompt plus the run and the widest draft does not fit the target's window."""
        from adaspec.engine import GenerationConfig

        first = pts[0]
        max_new = int(self.bench["max_new_tokens"])
        prompts = self.runner.prompts(first, self.models)
        if max(map(len, prompts)) + max_new + max(p.k for p in pts) + 1 > self.models.target.backend.max_context:
            self.runner.log(f"skipping context {first.context}: beyond {first.setting.target}'s window")
            self.bar.update(len(pts))
            return None
        cfg = GenerationConfig(max_new_tokens=max_new, temperature=first.temperature, seed=int(self.bench["seed"]),
                               ignore_eos=True)
        gkey = record_hash([first.setting.__dict__, first.context, first.prompt_index, first.temperature,
                            self.bench["workload"], max_new, self.bench["seed"]])
        info = {"sweep": None, **first.setting.__dict__, "context": first.context,
                "prompt_tokens": round(statistics.fmean(map(len, prompts))), "prompt_index": first.prompt_index,
                "temperature": first.temperature, "workload": self.bench["workload"], "max_new_tokens": max_new,
                "seed": self.bench["seed"], "group": gkey}
        plains = sum(1 for r in self.rows if r.get("kind") == "plain" and r.get("group") == gkey)
        return _Group(cfg, gkey, prompts, info, plains)

    def _single_runs(self, group: _Group, pts: list[Point]):
        """A group at batch size 1: its greedy reference (a plain run, cold unless the prefix cache is on; TTFT
        measured when cold, else from the micro prefill) and the draft models' prompt prefill, run now; returns
        ``(plain, point)``: a new plain baseline, and one point's ``(record, predicted speedup)``."""
        from adaspec.controllers import make_controller
        from adaspec.drafters.calibrated import CalibratedDrafter
        from adaspec.drafters.model import ModelDrafter
        from adaspec.engine import SpeculativeEngine

        first, setting, (prompt,), cfg = pts[0], pts[0].setting, group.prompts, group.cfg
        tok = tokenizer_of(self.models.target)
        plain_engine = SpeculativeEngine(self.models.backend, None, None, tokenizer=tok)
        cold_start = not self.bench["prefix_cache"]
        micro_rows = [r for r in self.rows if r.get("kind") == "micro" and same_setting(r, setting)]
        ttft_est = prefill_ms_at([r for r in micro_rows if r["model"] == setting.target], len(prompt))

        def run_plain(cold: bool) -> dict:
            if cold:
                self.models.backend.drop()
            self.models.backend.record_top2 = [] if first.temperature == 0 else None
            self.meter.start()
            r = plain_engine.generate(prompt, cfg)
            reading = self.meter.stop()
            top2 = self.models.backend.record_top2 or []
            self.models.backend.record_top2 = None
            metrics = run_metrics(r, reading, self.meter)
            return self._write_plain(group, cold, metrics,
                                     ttft_ms=metrics["ttft_ms"] if cold or ttft_est is None else ttft_est,
                                     ttft_source="measured cold prefill" if cold or ttft_est is None
                                     else "micro prefill",
                                     ttft_run_ms=metrics["ttft_ms"], token_ids=r.token_ids,
                                     alternatives=[b for _, b in top2])

        self.bar.set_postfix_str(f"ctx {first.context} plain", refresh=True)
        reference = run_plain(cold=cold_start)
        self.cost.overhead_ms = statistics.median(r["step_other_ms"] for r in self.rows
                                             if r.get("kind") == "plain" and same_setting(r, setting))
        draft_prefill: dict[str, float] = {}
        for spec in sorted({p.drafter for p in pts} & set(self.models.drafts)):
            d = self.models.drafts[spec]
            if not isinstance(d, ModelDrafter):
                draft_prefill[spec] = 0.0
                continue
            # Feed the prompt to the draft model now, outside the timed runs (its cache then serves every point of
            # the group): decode numbers stay decode-only, and the prefill is charged to the end-to-end speedup.
            est = prefill_ms_at([r for r in micro_rows if r["model"] == spec], len(prompt) - 1)
            cold = cold_start or est is None  # no estimate from the micro-measurements: measure a cold prefill
            if cold:
                d.backend.drop()
            ms = prefill_draft(d, prompt)
            draft_prefill[spec] = ms if cold else est
        baseline = reference

        def new_baseline() -> None:
            nonlocal baseline
            self.bar.set_postfix_str(f"ctx {first.context} plain", refresh=True)
            baseline = run_plain(cold=False)

        def point(p: Point) -> tuple[dict, float]:
            if p.drafter == "calibrated":
                cost_ms = self._calibrated_cost(p, group)
                drafter = CalibratedDrafter(reference["token_ids"], p.alpha, cost_ms=cost_ms,
                                            alternatives=reference["alternatives"], seed=int(self.bench["seed"]),
                                            vocab_size=self.models.target.backend.vocab_size)
            else:
                cost_ms = None
                drafter = self.models.drafter_for(p)
            engine = SpeculativeEngine(self.models.backend, drafter, make_controller(p.controller, p.k), tokenizer=tok)
            self.meter.start()
            r = engine.generate(prompt, replace(cfg, tree_budget=p.tree, tree_choice=p.tree_choice) if p.tree else cfg)
            reading = self.meter.stop()
            row = self._point_row(p, group, run_metrics(r, reading, self.meter), cost_ms=cost_ms,
                                  timing={"ttft_ms": reference["ttft_ms"], "ttft_source": reference["ttft_source"],
                                          "draft_prefill_ms": draft_prefill.get(p.drafter, 0.0)},
                                  kv_tokens=len(prompt) + cfg.max_new_tokens, plain_key=baseline["key"],
                                  identical=r.token_ids == reference["token_ids"],
                                  offpath=getattr(drafter, "offpath", None), token_ids=r.token_ids)
            return row, predict_point(self.cost, row)

        return new_baseline, point

    def _batched_runs(self, group: _Group, pts: list[Point]):
        """A group at batch size B > 1: B requests (prompts ``prompt_index .. prompt_index + B - 1`` of the workload
        at the group's context) run together through a :class:`~adaspec.batch.BatchEngine`, plain (K = 0) first
        (run now), then each point with every row drafting, a plain batch again before every ``plain_every``
        points. Returns ``(plain, point)`` as :meth:`_single_runs` does.

        Metrics are the batch's: ``tpot_ms`` is decode time over every row's decoded tokens (the inverse of the
        batch's decode throughput, so ``speedup`` is a throughput ratio against plain batched decoding at the same
        B), ``row_tpot_ms`` the mean per-row time per token (what one client sees), ``ttft_ms`` the batch's
        prefill step. Draft models draft for all rows at once (batched drafting); their prompt prefill happens in
        the first proposals and is part of the decode time. A calibrated drafter charges its cost per row (rows
        draft one after another), an upper bound on the draft cost of a batch; it holds its α only while each row
        stays on the plain batch's greedy path, so on a runtime whose rows mix (ik_llama.cpp) its points record the
        positions drafted off that path (``offpath_positions``; the map leaves out points mostly off it)."""
        from adaspec.batch import BatchEngine
        from adaspec.controllers import make_controller
        from adaspec.drafters.calibrated import CalibratedDrafter

        first, b, prompts, cfg = pts[0], pts[0].setting.batch, group.prompts, group.cfg
        target = self.models.target.backend
        tok = tokenizer_of(self.models.target)
        self.models.backend.drop()  # the micro-measurements' prefix cache is not used by batched runs

        def run_batch(drafters: list | None, controller: str, k: int) -> tuple[list, dict]:
            fixed = controller == "fixed"
            engine = BatchEngine(target, max_batch=b, tokenizer=tok,
                                 pricer=None if fixed or self.models.pricer is None else self.models.pricer)
            for i, p in enumerate(prompts):
                engine.add(p, cfg, drafter_for=(lambda seq, d=drafters[i]: d) if drafters else None,
                           controller_factory=(lambda: make_controller(controller, k)) if drafters else None)
            self.meter.start()
            t0 = time.perf_counter()
            results: dict[int, object] = {}
            prefill_ms = None
            while engine:
                for rid, chunk in engine.step().items():
                    if chunk.error is not None:
                        raise chunk.error
                    if chunk.result is not None:
                        results[rid] = chunk.result
                if prefill_ms is None:
                    prefill_ms = (time.perf_counter() - t0) * 1e3
            wall_ms = (time.perf_counter() - t0) * 1e3
            reading = self.meter.stop()
            out = [results[i] for i in sorted(results)]
            return out, batch_metrics(out, reading, self.meter, wall_ms, prefill_ms or 0.0)

        def run_plain() -> dict:
            results, metrics = run_batch(None, "fixed", 0)
            return self._write_plain(group, True, metrics, ttft_source="measured batch prefill",
                                     ttft_run_ms=metrics["ttft_ms"], token_ids=[r.token_ids for r in results])

        self.bar.set_postfix_str(f"B={b} ctx {first.context} plain", refresh=True)
        reference = run_plain()

        def point(p: Point) -> tuple[dict, float]:
            cost_ms = None
            if p.drafter == "calibrated":
                cost_ms = self._calibrated_cost(p, group)
                drafters = [CalibratedDrafter(ref, p.alpha, cost_ms=cost_ms, seed=int(self.bench["seed"]) + i,
                                              vocab_size=target.vocab_size)
                            for i, ref in enumerate(reference["token_ids"])]
            else:
                template = self.models.drafter_for(p)
                if isinstance(getattr(template, "backend", None), PrefixCacheBackend):
                    template = type(template)(template.backend.inner)
                drafters = [template.for_sequence(i) for i in range(b)]
            results, metrics = run_batch(drafters, p.controller, p.k)
            token_ids = [r.token_ids for r in results]
            row = self._point_row(p, group, metrics, cost_ms=cost_ms,
                                  timing={"ttft_source": "measured batch prefill", "draft_prefill_ms": 0.0},
                                  kv_tokens=b * (group.info["prompt_tokens"] + cfg.max_new_tokens),
                                  plain_key=reference["key"], identical=token_ids == reference["token_ids"],
                                  offpath=sum(getattr(d, "offpath", 0) for d in drafters)
                                  if p.drafter == "calibrated" else None, token_ids=token_ids)
            return row, math.nan  # the cost model is a batch-1 model: no prediction

        return run_plain, point

    def _calibrated_cost(self, p: Point, group: _Group) -> float:
        """The calibrated drafter's ms per token for ``p``, at the group's mean context over the run."""
        return resolve_cost(p.cost, self.cost, statistics.fmean(map(len, group.prompts)) + group.cfg.max_new_tokens / 2)

    def _write_plain(self, group: _Group, cold: bool, metrics: dict, **fields) -> dict:
        """Write (and return) the group's next plain record: its metrics, then ``fields``."""
        row = {"kind": "plain", "key": f"g-{group.key}-{group.plains}", **group.info, "cold": cold,
               "drafter": None, "k": 0, "controller": "fixed", **metrics, **fields}
        group.plains += 1
        self.runner.write(self.f, row)
        self.rows.append(row)
        return row

    def _point_row(self, p: Point, group: _Group, metrics: dict, *, cost_ms: float | None,
                   timing: dict, kv_tokens: int, plain_key: str, identical: bool, offpath, token_ids) -> dict:
        """A point's record: the group's fields, the point's, its metrics, then ``timing`` (TTFT, draft prefill),
        the draft model's memory (its KV cache for ``kv_tokens`` tokens) and its comparison with the plain run."""
        mem = self.models.draft_bytes.get(p.drafter, {"param_bytes": 0, "rss_delta_bytes": 0, "kv_bytes_per_token": 0})
        return {"kind": "point", "key": point_key(p, self.bench), **group.info, **p.fields(), "group": group.key,
                "cost_ms": cost_ms, "alpha_dial": p.alpha, **metrics, **timing,
                "draft_param_bytes": mem["param_bytes"], "draft_rss_delta_bytes": mem["rss_delta_bytes"],
                "draft_kv_bytes": mem["kv_bytes_per_token"] * kv_tokens, "plain_key": plain_key,
                "identical_to_plain": identical if p.temperature == 0 else None,
                "offpath_positions": offpath, "token_ids": token_ids}

    def _points_due(self, pts: list[Point], plain: Callable[[], object]):
        """The group's points not yet in the results, in order, until the time limit; ``plain()`` runs a plain
        baseline before every ``plain_every`` of them."""
        since_plain = 0
        for p in pts:
            if any(r.get("key") == point_key(p, self.bench) for r in self.rows):
                self.bar.update(1)
                continue
            if self.runner.over_time(self.start):
                return
            if since_plain >= int(self.bench["plain_every"]):
                plain()
                since_plain = 0
            yield p
            since_plain += 1

    def _record_point(self, row: dict, predicted: float) -> None:
        """Speedups against the group's plain runs of this invocation, the prediction, then write it."""
        apply_baseline(row, [r for r in self.rows if r.get("kind") == "plain" and r.get("group") == row["group"]
                             and r.get("run") == self.runner.run_id])
        row["predicted_speedup"] = predicted
        self.runner.write(self.f, row)
        self.rows.append(row)
