"""Measure one running engine configuration at a list of load levels, one result row per level, and turn a dead
engine or server errors into :class:`~adaspec.engines.process.EngineError` with the engine's log tail.

Each level is measured with :func:`adaspec.bench.endpoint.measure` (the same client, clocks, ``/metrics``
differencing and ``timings`` sums as ``adaspec bench --endpoint``); a level already in the results file is skipped,
so a rerun resumes at the first level not measured.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import httpx

from adaspec.bench import endpoint as ep
from adaspec.bench.endpoint_client import Arm, send
from adaspec.engines.acceptance import check_responses, llama_server_tau
from adaspec.engines.config import EngineConfig
from adaspec.engines.process import EngineError, EngineProcess, tail
from adaspec.engines.results import Results, key


@dataclass
class Phase:
    """What to send: ``name`` (``derive``, ``heldout``, ``profile``, ``confirm``), a workload (a JSONL of prompts),
    its prompt count, the endpoint settings (``api``, ``max_tokens``, greedy), the load levels and how many
    ``rounds`` of them (every level once per round, on the same server), numbered from ``first_round`` (a phase
    measured one round per server start gives each start its own round). ``pair`` names the comparison a
    ``confirm`` phase belongs to (:func:`adaspec.engines.scaleout_report.pair_tag`); it is part of each level's key
    and row."""

    name: str
    workload: str
    prompts: int
    max_tokens: int
    concurrency: list[int]
    rates: list[float]
    api: str = "chat"
    seed: int = 0
    rounds: int = 1
    first_round: int = 0
    pair: str = ""

    def levels(self) -> list[tuple[str, float, int]]:
        """(load, level, round) in the order they are measured."""
        loads = [("closed", c) for c in self.concurrency] + [("open", r) for r in self.rates]
        return [(load, level, rnd) for rnd in range(self.first_round, self.first_round + self.rounds)
                for load, level in loads]

    def level_key(self, cfg: EngineConfig, load: str, level: float, rnd: int = 0) -> str:
        extra = {"round": rnd} if rnd else {}  # round 0 keeps the key of runs made before rounds existed
        extra.update({"pair": self.pair} if self.pair else {})
        return key(phase=self.name, config=cfg.label, load=load, level=level, workload=self.workload,
                   prompts=self.prompts, max_tokens=self.max_tokens, api=self.api, seed=self.seed, **extra)


def pending(phase: Phase, cfg: EngineConfig, results: Results) -> list[tuple[str, float, int]]:
    """The (load, level, round) of ``phase`` not yet measured for ``cfg``."""
    done = results.done()
    return [(load, lv, rnd) for load, lv, rnd in phase.levels() if phase.level_key(cfg, load, lv, rnd) not in done]


def _endpoint(proc: EngineProcess, cfg: EngineConfig, phase: Phase, timeout_s: float
              ) -> tuple[list, ep.EndpointConfig, Arm]:
    """``phase``'s prompts, the endpoint bench's settings for them (greedy) and ``proc``'s arm."""
    from adaspec.workloads import load_workload

    prompts = load_workload(phase.workload)[:phase.prompts]
    ecfg = ep.EndpointConfig(url=proc.url, api=phase.api, workload=phase.workload, prompts=phase.prompts,
                             max_tokens=phase.max_tokens, temperature=0.0, seed=phase.seed, timeout_s=timeout_s)
    return prompts, ecfg, Arm(cfg.label, proc.url)


def settle(proc: EngineProcess, cfg: EngineConfig, phase: Phase, seconds: float, results: Results, *,
           log: Callable[[str], None] = print, timeout_s: float = 600.0) -> list[float]:
    """Decode ``seconds`` of full-length requests of ``phase``'s prompts on the freshly started ``proc``
    (:func:`adaspec.bench.endpoint.settle`) and write their decode rates as a ``settle`` row, so that the report
    shows the state each server was measured in (on a 2-vCPU VM, vLLM's plain decoding has run ~1.45× slower in
    spells, the first requests after a start among them).

    Raises:
        EngineError: the engine exited or a request failed (with the engine's log tail).
    """
    prompts, ecfg, arm = _endpoint(proc, cfg, phase, timeout_s)
    with httpx.Client() as client:
        try:
            rates = ep.settle(client, arm, ecfg, ep.probe(client, arm, ecfg), prompts, seconds)
        except ep.EndpointError as e:
            raise EngineError(f"{cfg.label}: {e}", tail(proc.log)) from None
    results.write({"kind": "settle", "config": cfg.label, "phase": phase.name, "seconds": seconds,
                   "decode_tok_s": [round(r, 2) for r in rates]})
    log(f"  settled {cfg.label} for {seconds:g} s: decode tok/s " + " ".join(f"{r:.1f}" for r in rates))
    return rates


def measure_levels(proc: EngineProcess, cfg: EngineConfig, phase: Phase, results: Results, *,
                   log: Callable[[str], None] = print, timeout_s: float = 600.0) -> None:
    """Measure every pending level of ``phase`` on the running ``proc`` serving ``cfg``, writing a ``scaleout`` row
    after each.

    Raises:
        EngineError: the engine exited, or a level had failed requests (HTTP 5xx, dropped connections, time-outs):
            the level is not written as done (a ``fault`` row is, by the caller) and the message carries the
            engine's log tail.
    """
    prompts, ecfg, arm = _endpoint(proc, cfg, phase, timeout_s)
    with httpx.Client(limits=httpx.Limits(max_connections=32)) as client:
        model = ep.probe(client, arm, ecfg)
        warm = send(client, arm, phase.api, {**ep.request_body(ecfg, model, prompts[0]), "max_tokens": 4},
                    prompts[0].id, timeout_s)
        if not warm.ok:
            raise EngineError(f"{cfg.label}: the warm-up request failed ({warm.error})", tail(proc.log))
        for load, level, rnd in pending(phase, cfg, results):
            proc.check()
            n = max(len(prompts), 2 * int(level)) if load == "closed" else max(len(prompts), 8)
            row = ep.measure(client, arm, replace(ecfg), prompts, model, load, level, n, float("inf"))
            proc.check(wait_s=3.0 if row["failed"] else 0.0)
            if row["failed"]:
                raise EngineError(f"{cfg.label} at {load} {level:g}: {row['failed']} of {n} requests failed "
                                  f"({row['errors']})", tail(proc.log))
            if row["spec"].get("source") == "counters" and "response_timings" in row:
                row["spec"]["responses_check"] = check_responses(row["spec"], row["response_timings"])
            elif cfg.engine == "llamacpp":  # a llama-server without speculative counters: τ from its timings
                row["spec"] = llama_server_tau(row["spec"], cfg)
            results.write({"kind": "scaleout", "key": phase.level_key(cfg, load, level, rnd), "phase": phase.name,
                           "engine": cfg.engine, "config": cfg.label, "method": cfg.method, "k": cfg.k,
                           "arm": "baseline" if cfg.method == "off" else "speculative", "load": load,
                           "concurrency": int(level) if load == "closed" else None,
                           "rate": level if load == "open" else None, "round": rnd, "workload": phase.workload,
                           "prompts": len(prompts), "requests": n, "max_tokens": phase.max_tokens, "model": model,
                           **({"pair": phase.pair} if phase.pair else {}), **row})
            alpha = row["spec"].get("acceptance_rate")
            log(f"  {phase.name} {cfg.label} {load} {level:g}" + (f" round {rnd}" if rnd else "") + f": {row['completed']} ok, "
                f"{row['throughput_tok_s'] or 0:.2f} tok/s, decode {row['decode_tok_s'] or 0:.2f} tok/s"
                + (f", α {alpha:.3f}" if alpha is not None else ""))
