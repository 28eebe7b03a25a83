"""``adaspec bench``: run a sweep grid, one JSON line per measured point, resumable.

Run order: for each hardware setting (dtype, threads, backend, batch) the target and the draft models are loaded
(once per dtype and backend: the thread counts share a load; a llama.cpp setting loads ``NAME@llamacpp``), the
micro-measurements of the cost model are taken (:mod:`adaspec.bench.micro`), then the points run group by
group. A *group* is one prompt at one context length and temperature: it starts with a cold plain run (a real
prefill: TTFT, and the greedy reference continuation the calibrated drafter needs), then its speculative points,
with another plain run before every ``plain_every`` of them, so each point is compared with a plain run measured
minutes apart at most, on the same prompt, with the same settings.

Within a group every run reuses the prompt's KV cache (:class:`~adaspec.backends.prefix_cache.PrefixCacheBackend`),
so a 4K-token prompt is prefilled once per model instead of once per point; the draft model is fed the prompt before
the timed runs. Decode-phase numbers (TPOT, speedup) are unaffected; TTFT and the draft model's prefill are the cold
measurements of the group (or the micro-measurements' prefill times), stored in every record of the group, and the
end-to-end speedup for the run's length is computed from them.

Record kinds in the results file: ``meta`` (machine and config), ``memory`` (bytes per model), ``micro`` (cost
micro-measurements), ``plain`` (baselines), ``point`` (speculative points). Every record has a ``key``; a rerun
skips points whose key is present, so a killed run continues where it stopped. Every record also has ``run``, the
key of its invocation's ``meta`` record: a point is compared only with its group's plain runs of the same run.
"""

from __future__ import annotations

import functools
import gc
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from adaspec.backends.prefix_cache import PrefixCacheBackend
from adaspec.backends.select import resolve_device
from adaspec.bench.costmodel import FittedCostModel
from adaspec.bench.grid import Point, Setting, expand, point_key
from adaspec.bench.loading import (Models, context_needed, default_loader, load_setting,  # noqa: F401 (re-exported)
                                   on_backend, prefill_draft, tokenizer_of)
from adaspec.bench.measure import Meter, machine_info  # noqa: F401 (machine_info: re-exported)
from adaspec.bench.metrics import batch_metrics, decode_tpot_ms, run_metrics  # noqa: F401 (re-exported)
from adaspec.bench.micro import measure_backend, prefill_ms_at
from adaspec.bench.predict import (drafter_cost_key, fit_cost_model, is_number, predict_point,  # noqa: F401
                                   resolve_cost)
from adaspec.bench.prompts import hf_builder
from adaspec.bench.results import apply_baseline, read_results, record_hash, same_setting, tag_runs
from adaspec.drafters.suffix import remember, suffixes_in
from adaspec.errors import ConfigError

Loader = Callable[[str, str], "object"]  # (spec, dtype) -> adaspec.api.LoadedModel


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


class SweepRunner:
    """Runs an expanded config (see the module docstring). ``loader(spec, dtype)`` loads a model (tests inject
    tiny ones); ``tasks`` overrides the workload's prompts."""

    def __init__(self, cfg: dict, out: Path, *, loader: Loader | None = None, tasks: list[str] | None = None,
                 progress: bool = True, time_limit_s: float | None = None,
                 log: Callable[[str], None] | None = None, argv: list[str] | None = None) -> None:
        self.cfg = cfg
        self.bench = cfg["bench"]
        self.out = Path(out)
        self.loader = loader or functools.partial(default_loader, max_context=context_needed(cfg),
                                                  device=self.bench["device"])
        self._tasks = tasks
        self.progress = progress
        self.time_limit_s = time_limit_s
        self.log = log or (lambda msg: None)
        on_gpu = resolve_device(self.bench["device"]).startswith("cuda") and "torch" in self.bench["backend"]
        self.meter = Meter(gpu=on_gpu)
        self.argv = argv
        self._validate_costs()
        for setting in {p.setting for p in expand(cfg)}:  # a model pinned to another backend: say so now
            for spec in [setting.target, *cfg["micro"]["drafts"], *(d for s in cfg["sweep"] for d in s["drafter"])]:
                on_backend(str(spec), setting)
        if loader is None:  # a missing runtime: fail now, not hours in when its first setting loads
            from adaspec.backends.select import GGUF_RUNTIMES, require_runtime

            for runtime in set(self.bench["backend"]) & set(GGUF_RUNTIMES):
                require_runtime(runtime)

    def _validate_costs(self) -> None:
        drafts = set(self.cfg["micro"]["drafts"])
        for s in self.cfg["sweep"]:
            if "calibrated" not in s["drafter"]:
                continue
            for c in s["cost"]:
                c = str(c)
                if c.startswith("ratio:") or is_number(c) or c in drafts:
                    continue
                raise ConfigError(f"sweep {s['name']!r}: calibrated cost {c!r} is neither ms, ratio:C, nor a draft "
                                  f"model listed in micro.drafts ({sorted(drafts) or 'none'})")

    # Helpers ------------------------------------------------------------------------------------------------
    def tasks(self) -> list[str]:
        if self._tasks is None:
            from adaspec.workloads import load_workload

            self._tasks = [p.as_text() for p in load_workload(self.bench["workload"], int(self.bench["prompts"]))]
        return self._tasks

    def _write(self, f, row: dict) -> None:
        if row["kind"] != "meta":
            row["run"] = self.run_id
        f.write(json.dumps(row) + "\n")
        f.flush()

    def _over_time(self, start: float) -> bool:
        return self.time_limit_s is not None and time.perf_counter() - start > self.time_limit_s

    # Run ----------------------------------------------------------------------------------------------------
    def run(self) -> dict:
        """Measure every point not yet in the results file. Returns counts: ``done``, ``run``, ``skipped``,
        ``stopped`` (True when the time limit stopped the run early)."""
        from tqdm import tqdm

        points = expand(self.cfg)
        rows = tag_runs(read_results(self.out))
        done = {r["key"] for r in rows if "key" in r}
        micro_done = {r.get("micro_key") for r in rows if r.get("kind") == "micro"}
        todo = [p for p in points if point_key(p, self.bench) not in done]
        result = {"points": len(points), "done": len(points) - len(todo), "run": 0, "skipped": 0, "stopped": False}
        if not todo:
            return result
        self.out.parent.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        bar = tqdm(total=len(todo), desc="bench", unit="point", disable=not self.progress,
                   bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} points [{elapsed}<{remaining}] {postfix}")
        self.run_id = f"meta-{time.time():.0f}"
        with open(self.out, "a", encoding="utf-8") as f:
            self._write(f, {"kind": "meta", "key": self.run_id, "time": time.time(), "argv": self.argv,
                            "machine": machine_info(), "config": self.cfg, "energy_source": self.meter.energy_source})
            by_setting: dict[Setting, list[Point]] = {}
            for p in todo:
                by_setting.setdefault(p.setting, []).append(p)
            models: Models | None = None
            loaded = None
            for setting, pts in by_setting.items():
                if models is None or loaded != (setting.dtype, setting.backend, setting.batch):
                    models = None  # free the previous setting's weights before loading the next
                    gc.collect()
                    loaded = (setting.dtype, setting.backend, setting.batch)
                    models = self._load(setting, [p for p in todo if (p.setting.dtype, p.setting.backend,
                                                                      p.setting.batch) == loaded], f)
                from adaspec.api import set_threads

                threads = set_threads(setting.threads)  # 0: all cores
                for backend in [models.backend] + [getattr(d, "backend", None) for d in models.drafts.values()]:
                    if backend is not None:
                        backend.set_threads(threads)
                cost = self._micro(setting, models, f, micro_done, rows)
                if setting.batch > 1:
                    self._calibrate_batch(setting, models, pts, f)
                groups: dict[tuple, list[Point]] = {}
                for p in points:  # the done ones too: their answers go back into the suffix caches, in order
                    if p.setting == setting:
                        groups.setdefault(p.group, []).append(p)
                for group_pts in groups.values():
                    self._remember(group_pts, models, rows)
                    group_pts = [p for p in group_pts if point_key(p, self.bench) not in done]
                    if not group_pts:
                        continue
                    if self._over_time(start):
                        result["stopped"] = True
                        break
                    n_run, n_skip = self._group(group_pts, models, cost, f, rows, bar, start)
                    result["run"] += n_run
                    result["skipped"] += n_skip
                    if self._over_time(start):
                        result["stopped"] = True
                        break
                if result["stopped"]:
                    break
        bar.close()
        return result

    def _load(self, setting: Setting, pts: list[Point], f) -> Models:
        """Load ``setting``'s target and every drafter its points (and the micro-measurements) use; writes the
        ``memory`` record."""
        specs = {p.drafter for p in pts if p.drafter != "calibrated"} | set(self.cfg["micro"]["drafts"])
        models, memory = load_setting(self.loader, setting, specs, self.log)
        self._write(f, memory)
        return models

    def _calibrate_batch(self, setting: Setting, models: Models, pts: list[Point], f) -> None:
        """The batch pricer's cost curve for ``setting`` (goodput points cap K by it), recorded as a
        ``batch_curve`` record."""
        from adaspec.controllers.batch import BatchPricer

        models.backend.drop()
        models.pricer = BatchPricer(k_max=max(8, max(p.k for p in pts)))
        self.log(f"batch cost curve: {setting.batch} rows x up to {models.pricer.k_max + 1} tokens")
        curve = models.pricer.calibrate(models.target.backend, setting.batch)
        self._write(f, {"kind": "batch_curve", "key": f"bc-{record_hash([setting.__dict__, time.time()])}",
                        **setting.__dict__, "curve": {str(n): ms for n, ms in curve.items()}})

    def _micro(self, setting: Setting, models: Models, f, micro_done: set, rows: list[dict]) -> FittedCostModel:
        """Take (or reuse) the micro-measurements for ``setting`` and fit the cost model.

        The context ids are the prefix every prompt of the first task shares (chat header + real padding), and
        each model's cache is left holding them, so the sweep's prompts reuse this prefill.
        """
        from adaspec.engine import SpeculativeEngine

        micro = self.cfg["micro"]
        width = max(micro["verify_tokens"])
        contexts = [c for c in micro["contexts"] if c + width + 1 <= models.target.backend.max_context]
        builder = self._builder(models)
        ids = builder.prefix_ids(self.tasks()[0], max(contexts) + width + 1)
        base = {**setting.__dict__, "contexts": contexts, "widths": micro["verify_tokens"],
                "repeats": micro["repeats"]}
        new_rows: list[dict] = []
        jobs = [(setting.target, "target", models.backend, micro["verify_tokens"])]
        jobs += [(d, "draft", models.drafts[d].backend, [1]) for d in micro["drafts"]]
        for model_name, role, backend, widths in jobs:
            mkey = "m-" + record_hash({**base, "model": model_name, "widths": widths})  # widths tell target from draft
            if mkey in micro_done:
                continue
            if backend is models.backend:
                SpeculativeEngine(models.backend, None, None, tokenizer=tokenizer_of(models.target)).warmup()
            self.log(f"micro-measurements: {model_name} at contexts {contexts}")
            backend.drop()
            self.meter.start()
            measured = measure_backend(backend, ids, contexts, widths, int(micro["repeats"]), keep=True)
            other = self.meter.stop().other_cpu
            for i, r in enumerate(measured):
                row = {"kind": "micro", "key": f"{mkey}-{i}", "micro_key": mkey, **setting.__dict__,
                       "model": model_name, "role": role, **r,
                       "other_cpu": other}
                self._write(f, row)
                new_rows.append(row)
            micro_done.add(mkey)
        rows.extend(new_rows)
        return fit_cost_model([r for r in rows if r.get("kind") == "micro" and same_setting(r, setting)],
                              [r for r in rows if r.get("kind") == "plain" and same_setting(r, setting)])

    def _builder(self, models: Models):
        tok = models.target.tokenizer
        return hf_builder(tok, chat=self.bench["chat"])

    def _group_start(self, pts: list[Point], models: Models, rows: list[dict], bar) -> _Group | None:
        """What every group starts with (see :class:`_Group`), or None (its points counted as skipped) when the
        longest prompt plus the run and the widest draft does not fit the target's window."""
        from adaspec.engine import GenerationConfig

        first = pts[0]
        max_new = int(self.bench["max_new_tokens"])
        prompts = self._prompts(first, models)
        if max(map(len, prompts)) + max_new + max(p.k for p in pts) + 1 > models.target.backend.max_context:
            self.log(f"skipping context {first.context}: beyond {first.setting.target}'s window")
            bar.update(len(pts))
            return None
        cfg = GenerationConfig(max_new_tokens=max_new, temperature=first.temperature, seed=int(self.bench["seed"]),
                               ignore_eos=True)
        gkey = record_hash([first.setting.__dict__, first.context, first.prompt_index, first.temperature,
                            self.bench["workload"], max_new, self.bench["seed"]])
        info = {"sweep": None, **first.setting.__dict__, "context": first.context,
                "prompt_tokens": round(statistics.fmean(map(len, prompts))), "prompt_index": first.prompt_index,
                "temperature": first.temperature, "workload": self.bench["workload"], "max_new_tokens": max_new,
                "seed": self.bench["seed"], "group": gkey}
        plains = sum(1 for r in rows if r.get("kind") == "plain" and r.get("group") == gkey)
        return _Group(cfg, gkey, prompts, info, plains)

    def _group(self, pts: list[Point], models: Models, cost: FittedCostModel, f, rows: list[dict], bar,
               start: float) -> tuple[int, int]:
        """Run a group's points not yet in the results (see the module docstring); returns (run, skipped)."""
        group = self._group_start(pts, models, rows, bar)
        if group is None:
            return 0, len(pts)
        runs = self._single_runs if pts[0].setting.batch == 1 else self._batched_runs
        plain, point = runs(group, pts, models, cost, f, rows, bar)
        n_run = 0
        for p in self._points_due(pts, rows, bar, start, plain):
            bar.set_postfix_str(_label(p) + (f" tree {p.tree_choice}:{p.tree}" if p.tree else ""), refresh=True)
            row, predicted = point(p)
            self._record_point(f, rows, row, predicted)
            n_run += 1
            bar.update(1)
        return n_run, 0

    def _single_runs(self, group: _Group, pts: list[Point], models: Models, cost: FittedCostModel, f,
                     rows: list[dict], bar):
        """A group at batch size 1: its greedy reference (a plain run, cold unless the prefix cache is on; TTFT
        measured when cold, else from the micro prefill) and the draft models' prompt prefill, run now; returns
        ``(plain, point)``: a new plain baseline, and one point's ``(record, predicted speedup)``."""
        from adaspec.controllers import make_controller
        from adaspec.drafters.calibrated import CalibratedDrafter
        from adaspec.drafters.model import ModelDrafter
        from adaspec.engine import SpeculativeEngine

        first, setting, (prompt,), cfg = pts[0], pts[0].setting, group.prompts, group.cfg
        tok = tokenizer_of(models.target)
        plain_engine = SpeculativeEngine(models.backend, None, None, tokenizer=tok)
        cold_start = not self.bench["prefix_cache"]
        micro_rows = [r for r in rows if r.get("kind") == "micro" and same_setting(r, setting)]
        ttft_est = prefill_ms_at([r for r in micro_rows if r["model"] == setting.target], len(prompt))

        def run_plain(cold: bool) -> dict:
            if cold:
                models.backend.drop()
            models.backend.record_top2 = [] if first.temperature == 0 else None
            self.meter.start()
            r = plain_engine.generate(prompt, cfg)
            reading = self.meter.stop()
            top2 = models.backend.record_top2 or []
            models.backend.record_top2 = None
            metrics = run_metrics(r, reading, self.meter)
            return self._write_plain(f, rows, group, cold, metrics,
                                     ttft_ms=metrics["ttft_ms"] if cold or ttft_est is None else ttft_est,
                                     ttft_source="measured cold prefill" if cold or ttft_est is None
                                     else "micro prefill",
                                     ttft_run_ms=metrics["ttft_ms"], token_ids=r.token_ids,
                                     alternatives=[b for _, b in top2])

        bar.set_postfix_str(f"ctx {first.context} plain", refresh=True)
        reference = run_plain(cold=cold_start)
        cost.overhead_ms = statistics.median(r["step_other_ms"] for r in rows
                                             if r.get("kind") == "plain" and same_setting(r, setting))
        draft_prefill: dict[str, float] = {}
        for spec in sorted({p.drafter for p in pts} & set(models.drafts)):
            d = models.drafts[spec]
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
            bar.set_postfix_str(f"ctx {first.context} plain", refresh=True)
            baseline = run_plain(cold=False)

        def point(p: Point) -> tuple[dict, float]:
            if p.drafter == "calibrated":
                cost_ms = self._calibrated_cost(p, cost, group)
                drafter = CalibratedDrafter(reference["token_ids"], p.alpha, cost_ms=cost_ms,
                                            alternatives=reference["alternatives"], seed=int(self.bench["seed"]),
                                            vocab_size=models.target.backend.vocab_size)
            else:
                cost_ms = None
                drafter = models.drafter_for(p)
            engine = SpeculativeEngine(models.backend, drafter, make_controller(p.controller, p.k), tokenizer=tok)
            self.meter.start()
            r = engine.generate(prompt, replace(cfg, tree_budget=p.tree, tree_choice=p.tree_choice) if p.tree else cfg)
            reading = self.meter.stop()
            row = self._point_row(p, group, models, run_metrics(r, reading, self.meter), cost_ms=cost_ms,
                                  timing={"ttft_ms": reference["ttft_ms"], "ttft_source": reference["ttft_source"],
                                          "draft_prefill_ms": draft_prefill.get(p.drafter, 0.0)},
                                  kv_tokens=len(prompt) + cfg.max_new_tokens, plain_key=baseline["key"],
                                  identical=r.token_ids == reference["token_ids"],
                                  offpath=getattr(drafter, "offpath", None), token_ids=r.token_ids)
            return row, predict_point(cost, row)

        return new_baseline, point

    def _batched_runs(self, group: _Group, pts: list[Point], models: Models, cost: FittedCostModel, f,
                      rows: list[dict], bar):
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
        target = models.target.backend
        tok = tokenizer_of(models.target)
        models.backend.drop()  # the micro-measurements' prefix cache is not used by batched runs

        def run_batch(drafters: list | None, controller: str, k: int) -> tuple[list, dict]:
            fixed = controller == "fixed"
            engine = BatchEngine(target, max_batch=b, tokenizer=tok,
                                 pricer=None if fixed or models.pricer is None else models.pricer)
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
            return self._write_plain(f, rows, group, True, metrics, ttft_source="measured batch prefill",
                                     ttft_run_ms=metrics["ttft_ms"], token_ids=[r.token_ids for r in results])

        bar.set_postfix_str(f"B={b} ctx {first.context} plain", refresh=True)
        reference = run_plain()

        def point(p: Point) -> tuple[dict, float]:
            cost_ms = None
            if p.drafter == "calibrated":
                cost_ms = self._calibrated_cost(p, cost, group)
                drafters = [CalibratedDrafter(ref, p.alpha, cost_ms=cost_ms, seed=int(self.bench["seed"]) + i,
                                              vocab_size=target.vocab_size)
                            for i, ref in enumerate(reference["token_ids"])]
            else:
                template = models.drafter_for(p)
                if isinstance(getattr(template, "backend", None), PrefixCacheBackend):
                    template = type(template)(template.backend.inner)
                drafters = [template.for_sequence(i) for i in range(b)]
            results, metrics = run_batch(drafters, p.controller, p.k)
            token_ids = [r.token_ids for r in results]
            row = self._point_row(p, group, models, metrics, cost_ms=cost_ms,
                                  timing={"ttft_source": "measured batch prefill", "draft_prefill_ms": 0.0},
                                  kv_tokens=b * (group.info["prompt_tokens"] + cfg.max_new_tokens),
                                  plain_key=reference["key"], identical=token_ids == reference["token_ids"],
                                  offpath=sum(getattr(d, "offpath", 0) for d in drafters)
                                  if p.drafter == "calibrated" else None, token_ids=token_ids)
            return row, math.nan  # the cost model is a batch-1 model: no prediction

        return run_plain, point

    def _calibrated_cost(self, p: Point, cost: FittedCostModel, group: _Group) -> float:
        """The calibrated drafter's ms per token for ``p``, at the group's mean context over the run."""
        return resolve_cost(p.cost, cost, statistics.fmean(map(len, group.prompts)) + group.cfg.max_new_tokens / 2)

    def _write_plain(self, f, rows: list[dict], group: _Group, cold: bool, metrics: dict, **fields) -> dict:
        """Write (and return) the group's next plain record: its metrics, then ``fields``."""
        row = {"kind": "plain", "key": f"g-{group.key}-{group.plains}", **group.info, "cold": cold,
               "drafter": None, "k": 0, "controller": "fixed", **metrics, **fields}
        group.plains += 1
        self._write(f, row)
        rows.append(row)
        return row

    def _point_row(self, p: Point, group: _Group, models: Models, metrics: dict, *, cost_ms: float | None,
                   timing: dict, kv_tokens: int, plain_key: str, identical: bool, offpath, token_ids) -> dict:
        """A point's record: the group's fields, the point's, its metrics, then ``timing`` (TTFT, draft prefill),
        the draft model's memory (its KV cache for ``kv_tokens`` tokens) and its comparison with the plain run."""
        mem = models.draft_bytes.get(p.drafter, {"param_bytes": 0, "rss_delta_bytes": 0, "kv_bytes_per_token": 0})
        return {"kind": "point", "key": point_key(p, self.bench), **group.info, **p.fields(), "group": group.key,
                "cost_ms": cost_ms, "alpha_dial": p.alpha, **metrics, **timing,
                "draft_param_bytes": mem["param_bytes"], "draft_rss_delta_bytes": mem["rss_delta_bytes"],
                "draft_kv_bytes": mem["kv_bytes_per_token"] * kv_tokens, "plain_key": plain_key,
                "identical_to_plain": identical if p.temperature == 0 else None,
                "offpath_positions": offpath, "token_ids": token_ids}

    def _prompts(self, first: Point, models: Models) -> list[list[int]]:
        """The prompt ids of ``first``'s group: one, or one per row of a batch."""
        tasks = self.tasks()
        builder = self._builder(models)
        return [builder.build(tasks[(first.prompt_index + i) % len(tasks)], first.context)
                for i in range(first.setting.batch)]

    def _remember(self, pts: list[Point], models: Models, rows: list[dict]) -> None:
        """Put the answers of ``pts`` already in the results back into their methods' suffix caches
        (:func:`~adaspec.drafters.suffix.remember`): a resumed run's later prompts see what they would have seen in
        one go. A no-op for points without a suffix drafter."""
        done = {r["key"]: r for r in rows if r.get("kind") == "point" and r.get("token_ids") is not None}
        prompts = None
        for p in pts:
            row = done.get(point_key(p, self.bench))
            drafter = models.drafter_for(p)
            if row is None or not suffixes_in(drafter):
                continue
            prompts = prompts or self._prompts(p, models)
            answers = row["token_ids"] if p.setting.batch > 1 else [row["token_ids"]]
            for prompt, answer in zip(prompts, answers):
                remember(drafter, prompt, answer)

    def _points_due(self, pts: list[Point], rows: list[dict], bar, start: float, plain: Callable[[], object]):
        """The group's points not yet in the results, in order, until the time limit; ``plain()`` runs a plain
        baseline before every ``plain_every`` of them."""
        since_plain = 0
        for p in pts:
            if any(r.get("key") == point_key(p, self.bench) for r in rows):
                bar.update(1)
                continue
            if self._over_time(start):
                return
            if since_plain >= int(self.bench["plain_every"]):
                plain()
                since_plain = 0
            yield p
            since_plain += 1

    def _record_point(self, f, rows: list[dict], row: dict, predicted: float) -> None:
        """Speedups against the group's plain runs of this invocation, the prediction, then write it."""
        apply_baseline(row, [r for r in rows if r.get("kind") == "plain" and r.get("group") == row["group"]
                             and r.get("run") == self.run_id])
        row["predicted_speedup"] = predicted
        self._write(f, row)
        rows.append(row)


def run_bench(cfg: dict, out: Path, **kwargs) -> dict:
    """Run a normalised config (see :func:`adaspec.bench.grid.build_config`); see :class:`SweepRunner`."""
    return SweepRunner(cfg, out, **kwargs).run()
