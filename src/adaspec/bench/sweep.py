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
import time
from collections.abc import Callable
from pathlib import Path

from adaspec.backends.select import resolve_device
from adaspec.bench.costmodel import FittedCostModel
from adaspec.bench.grid import Point, Setting, expand, point_key
from adaspec.bench.groups import GroupRuns
from adaspec.bench.loading import Models, context_needed, default_loader, load_setting, on_backend, tokenizer_of
from adaspec.bench.measure import Meter, machine_info
from adaspec.bench.micro import measure_backend
from adaspec.bench.predict import fit_cost_model, is_number
from adaspec.bench.prompts import hf_builder
from adaspec.bench.results import read_results, record_hash, same_setting, tag_runs
from adaspec.drafters.suffix import remember, suffixes_in
from adaspec.errors import ConfigError

# Public names that lived here before issue 40, kept importable:
from adaspec.bench.loading import prefill_draft  # noqa: F401
from adaspec.bench.metrics import decode_tpot_ms  # noqa: F401
from adaspec.bench.predict import drafter_cost_key, predict_point, resolve_cost  # noqa: F401
from adaspec.bench.results import apply_baseline  # noqa: F401

Loader = Callable[[str, str], "object"]  # (spec, dtype) -> adaspec.api.LoadedModel


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

    def write(self, f, row: dict) -> None:
        if row["kind"] != "meta":
            row["run"] = self.run_id
        f.write(json.dumps(row) + "\n")
        f.flush()

    def over_time(self, start: float) -> bool:
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
            self.write(f, {"kind": "meta", "key": self.run_id, "time": time.time(), "argv": self.argv,
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
                    if self.over_time(start):
                        result["stopped"] = True
                        break
                    n_run, n_skip = GroupRuns(self, models, cost, f, rows, bar, start).run(group_pts)
                    result["run"] += n_run
                    result["skipped"] += n_skip
                    if self.over_time(start):
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
        self.write(f, memory)
        return models

    def _calibrate_batch(self, setting: Setting, models: Models, pts: list[Point], f) -> None:
        """The batch pricer's cost curve for ``setting`` (goodput points cap K by it), recorded as a
        ``batch_curve`` record."""
        from adaspec.controllers.batch import BatchPricer

        models.backend.drop()
        models.pricer = BatchPricer(k_max=max(8, max(p.k for p in pts)))
        self.log(f"batch cost curve: {setting.batch} rows x up to {models.pricer.k_max + 1} tokens")
        curve = models.pricer.calibrate(models.target.backend, setting.batch)
        self.write(f, {"kind": "batch_curve", "key": f"bc-{record_hash([setting.__dict__, time.time()])}",
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
                self.write(f, row)
                new_rows.append(row)
            micro_done.add(mkey)
        rows.extend(new_rows)
        return fit_cost_model([r for r in rows if r.get("kind") == "micro" and same_setting(r, setting)],
                              [r for r in rows if r.get("kind") == "plain" and same_setting(r, setting)])

    def _builder(self, models: Models):
        tok = models.target.tokenizer
        return hf_builder(tok, chat=self.bench["chat"])

    def prompts(self, first: Point, models: Models) -> list[list[int]]:
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
            prompts = prompts or self.prompts(p, models)
            answers = row["token_ids"] if p.setting.batch > 1 else [row["token_ids"]]
            for prompt, answer in zip(prompts, answers):
                remember(drafter, prompt, answer)



def run_bench(cfg: dict, out: Path, **kwargs) -> dict:
    """Run a normalised config (see :func:`adaspec.bench.grid.build_config`); see :class:`SweepRunner`."""
    return SweepRunner(cfg, out, **kwargs).run()
