"""The run loop of ``adaspec compare``: every method on the same target, prompt by prompt, interleaved.

Every method runs on the same target in the same process, with the method order rotated per prompt so machine drift
affects all methods alike. By default the target's prompt is prefilled once per prompt, untimed, and every method
starts from that KV cache (see :func:`run_compare`), so tokens/s measure decoding. One JSON line per (workload,
prompt, method, temperature) is appended to the results file (:mod:`.results`) as soon as it finishes; a rerun skips
the lines already there, so a killed run continues where it stopped. Each method gets its own suffix cache, which
lives across the run's prompts (so a session's later steps see its earlier answers; rows of session workloads carry
their ``step``).

The workload ``structured`` (:mod:`adaspec.structured_workload`: schema-constrained extraction and forced tool
calls) runs every adaspec method under each task's grammar; its rows also carry ``valid`` (schema-valid) and
``exact`` (the fraction of expected fields right). Peers skip it (no grammar here); a peer that is not installed,
crashes or times out gets a row with its error and log tail.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from adaspec.backends.prefix_cache import PrefixCacheBackend
from adaspec.compare.methods import STRUCTURED, WARMUP_PROMPT_TOKENS, WARMUP_TOKENS, parse_method
from adaspec.compare.peer_runners import peer_runners
from adaspec.compare.results import read_results, result_key
from adaspec.controllers import make_controller
from adaspec.defaults import DEFAULT_DRAFT_CATCH_UP
from adaspec.engine import GenerationConfig, SpeculativeEngine
from adaspec.errors import ConfigError
from adaspec.peers import PEER_LIBRARIES
from adaspec.spec_setting import SpecSetting
from adaspec.structured.vocab import GrammarVocab


def run_compare(*, target: str, draft: str, methods: list[str], workloads: list[str], limit: int | None,
                max_new_tokens: int, temperatures: list[float], out: Path, dtype: str | None = None,
                threads: int | None = None, seed: int = 0, progress: bool = True,
                time_limit_s: float | None = None, prompt_cache: bool = True, backend: str = "auto",
                device: str = "auto", strict: bool = False, record_margins: bool = False,
                draft_catch_up: int | None = DEFAULT_DRAFT_CATCH_UP) -> Path:
    """Run the comparison and append rows to ``out`` (JSONL); returns ``out``. See the module docstring.

    Prompts are taken round-robin across categories (prompt 1 of every category, then prompt 2, ...), so a run
    stopped early (``time_limit_s``: start no new prompt after that many seconds, the first one always runs; or
    killed) covers every category.

    ``prompt_cache``: the target's prompt is prefilled once per prompt, outside the methods' timing, and adaspec's
    methods start from that KV cache; rows then carry ``decode_ms`` / ``decode_tokens``: the time after the first
    token (the target's prompt prefill) and the tokens after the first, drafter prefills included. Transformers
    peers cannot start from a cache (see :mod:`adaspec.peers`), so they prefill themselves and the prompt prefill
    measured here is subtracted from their time: identical work is left out of every method, which matters where
    prefill is slow (a CPU without fast bf16 matrix multiplication spends longer on a 150-token prompt than on 64 new
    tokens). False: every method prefills and tokens/s are end to end.

    ``strict``: every adaspec method runs in strict mode (as if each had ``+strict``; labels unchanged).
    ``record_margins``: rows also carry the target's top-1/top-2 logit margin per generated token (``margins``), for
    divergence analysis (``adaspec eval``). ``draft_catch_up``: every draft model's bounded catch-up
    (:func:`~adaspec.api.make_drafter`'s ``catch_up``), recorded in each row when set.

    Raises:
        ConfigError: ``out`` holds rows of another ``draft_catch_up`` or another target (one file, one setting).
    """
    from tqdm import tqdm

    from adaspec.api import SpeculativeLM, load_model, make_drafter, set_threads
    from adaspec.backends.gguf import GgufBackend
    from adaspec.backends.cpu import cpu_label
    from adaspec.structured_workload import score, workload_tasks
    from adaspec.drafters.suffix import with_own_cache
    from adaspec.workloads import load_workload

    parsed = [parse_method(m, draft) for m in methods]
    if strict:
        parsed = [m if m.controller in PEER_LIBRARIES else replace(m, strict=True)
                  for m in parsed]
    if not any(m.label == "plain" for m in parsed):
        parsed.insert(0, SpecSetting(None, "fixed", 0, strict, label="plain"))
    if not strict and any(m.strict for m in parsed) and not any(m.label == "plain+strict" for m in parsed):
        parsed.insert(1, parse_method("plain+strict", draft))  # the reference of the strict methods
    prompts = _round_robin([(w, p) for w in workloads for p in (workload_tasks(limit) if w == STRUCTURED
                                                                else load_workload(w, limit))])
    set_threads(threads)
    cpu = cpu_label()
    previous = read_results(out)
    other = {r.get("draft_catch_up") for r in previous} - {draft_catch_up}
    if other:
        raise ConfigError(f"{out} holds rows run with --draft-catch-up {other.pop() or 0}, this run uses "
                          f"{draft_catch_up or 0}: write to another --out (a report would mix them)")
    done = {result_key(r) for r in previous if not r.get("error")}  # a failed peer is tried again
    todo = [(w, p, t) for w, p in prompts for t in temperatures
            if any((w, p.id, m.label, t, m.strict) not in done for m in parsed)]
    if not todo:
        return out

    libraries = {m.controller for m in parsed if m.controller in PEER_LIBRARIES}
    if backend == "auto" and "hf" in libraries:  # transformers peers run on the very PyTorch model objects
        backend = "torch"
    tgt = load_model(target, backend=backend, dtype=dtype, device=device, progress=progress)
    others = sorted({r.get("target") for r in read_results(out)} - {tgt.name, None})
    if others:  # resuming would mix two targets (or one model on two backends) in one file
        raise ConfigError(f"{out} holds results of {', '.join(others)}, not {tgt.name}; write to another --out "
                          "(the backend is part of the target's name: NAME@ik, NAME@llamacpp)")
    if tgt.runtime_reason and progress:
        print(f"target runtime: {tgt.runtime_reason}", file=sys.stderr)
    target_backend = tgt.backend
    if prompt_cache:
        target_backend = PrefixCacheBackend(tgt.backend)
    drafters: dict = {}
    specs = {m.drafter for m in parsed if m.drafter and m.controller not in PEER_LIBRARIES}
    for spec in sorted(specs, key=lambda x: "+" in x):  # single drafters first: composites share them
        drafters[spec] = make_drafter(spec, tgt, dtype=dtype, device=device, progress=progress, reuse=drafters,
                                      backend=backend, catch_up=draft_catch_up)
    lm = SpeculativeLM(tgt, None, make_controller("fixed", 0))

    def engine(m: SpecSetting) -> SpeculativeEngine:
        # each method its own suffix cache, kept across its prompts (it must not read another method's answers)
        drafter = with_own_cache(drafters[m.drafter]) if m.drafter else None
        return SpeculativeEngine(target_backend, drafter, make_controller(m.controller, m.k),
                                 tokenizer=tgt.tokenizer)

    runners = {m.label: engine(m) for m in parsed if m.controller not in PEER_LIBRARIES}
    if STRUCTURED in workloads:  # one grammar vocabulary (read once, ~1 s) and grammar cache for every method
        vocab = runners["plain"].grammar_vocab or GrammarVocab.from_tokenizer(
            tgt.tokenizer, tgt.backend.vocab_size, runners["plain"].eos_token_ids)
        for r in runners.values():
            r.grammar_vocab = vocab
    _refill_suffix_caches(runners, read_results(out), prompts, lm)  # a resumed run's caches as they were
    peers = [m for m in parsed if m.controller in PEER_LIBRARIES]
    runners.update(peer_runners(peers, tgt, drafters, runners["plain"], dtype=dtype, progress=progress,
                                 device=device, draft=draft, threads=threads, log_dir=out.with_suffix(".peers")))
    # Warm up every method alike on the start of the first prompt: one-time allocations stay out of the timings, and
    # the controllers that learn this machine's costs (draft, catch-up, verify per n) learn them here, as a running
    # server would have before its first measured request.
    warm_ids = (lm.encode(todo[0][1].model_input(lm.has_chat_template))[:WARMUP_PROMPT_TOKENS] if todo
                else list(range(1, 9)))
    for r in runners.values():
        if isinstance(r, SpeculativeEngine):
            r.warmup(warm_ids, steps=WARMUP_TOKENS)
        else:
            r.warmup()
    out.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=len(todo) * len(parsed), desc="compare", unit="run", disable=not progress)
    start = time.monotonic()
    cached: list[int] = []
    prompt_prefill_ms = 0.0
    with open(out, "a", encoding="utf-8") as f, stopping(runners.values()):
        for i, (workload, prompt, temp) in enumerate(todo):
            if i and time_limit_s is not None and time.monotonic() - start > time_limit_s:
                break
            ids = lm.encode(prompt.model_input(lm.has_chat_template), tools=getattr(prompt, "template_tools", None))
            constraint = getattr(prompt, "constraint", None)  # the structured workload's tasks
            if prompt_cache and ids != cached:  # prefill this prompt once, outside every method's timing
                t = time.perf_counter()
                target_backend.reset()
                target_backend.forward(ids, 1)
                prompt_prefill_ms = (time.perf_counter() - t) * 1e3
                cached = ids
            order = parsed[i % len(parsed):] + parsed[:i % len(parsed)]
            for m in order:
                bar.update(1)
                if (workload, prompt.id, m.label, temp, m.strict) in done:
                    continue
                runner = runners[m.label]
                if m.controller in PEER_LIBRARIES and constraint is not None:
                    continue  # peers have no grammar here
                if m.controller in PEER_LIBRARIES:
                    result = runner.generate(ids, max_new_tokens=max_new_tokens, temperature=temp, seed=seed)
                    if prompt_cache and result.get("decode_ms") is None and not result.get("error"):
                        # transformers prefills itself: leave
                        # out the same work, measured above (never below zero)
                        result.update(decode_ms=round(max(result["total_ms"] - prompt_prefill_ms, 1.0), 2),
                                      decode_tokens=max(result["new_tokens"] - 1, 0))
                else:
                    cfg = GenerationConfig(max_new_tokens=max_new_tokens, temperature=temp, seed=seed,
                                           strict=m.strict, lossy=m.lossy, return_margins=record_margins,
                                           tree_budget=m.tree_budget, tree_choice=m.tree_choice,
                                           tree_expand=m.tree_expand, response_format=constraint)
                    _forget_drafts(runner.drafter)
                    result = _run_engine(runner, ids, cfg)
                    if constraint is not None:  # schema validity and exact fields (adaspec.structured_workload)
                        graded = score(prompt, result["text"], result["finish_reason"])
                        result.update(valid=graded["valid"], exact=graded["exact"])
                row = {"workload": workload, "category": prompt.category, "prompt_id": prompt.id,
                       **({"step": prompt.step} if prompt.step is not None else {}),
                       "method": m.label, "temperature": temp, "target": tgt.name, "drafter": m.drafter,
                       "controller": m.controller, "k": m.k, "threads": threads, "strict": m.strict,
                       "lossy": m.lossy, "tree_budget": m.tree_budget,
                       **({"tree_choice": m.tree_choice} if m.tree_budget else {}),
                       **({"tree_expand": m.tree_expand} if m.tree_expand is not None else {}),
                       "reference": m.reference,
                       "dtype": "gguf" if isinstance(tgt.backend, GgufBackend) else dtype or "bfloat16",
                       "prompt_cache": prompt_cache, "cpu": cpu,
                       **({"draft_catch_up": draft_catch_up} if draft_catch_up is not None else {}),
                       **({"runtime_simd": tgt.backend.simd} if getattr(tgt.backend, "simd", "") else {}),
                       "prompt_prefill_ms": round(prompt_prefill_ms, 2) if prompt_cache else None, **result}
                f.write(json.dumps(row) + "\n")
                f.flush()
    bar.close()
    return out


@contextmanager
def stopping(runners):
    """Stop every out-of-process peer's process when the comparison ends, however it ends."""
    try:
        yield
    finally:
        for r in runners:
            if hasattr(r, "stop"):
                r.stop()


def _refill_suffix_caches(runners: dict, rows: list[dict], prompts: list[tuple], lm) -> None:
    """Put the answers a resumed run already has back into each method's suffix caches
    (:func:`~adaspec.drafters.suffix.suffixes_in`), in the run's prompt order, so its later prompts see what they
    would have seen in one go. A no-op without suffix drafters or earlier rows."""
    from adaspec.drafters.suffix import suffixes_in

    caches = {label: suffixes_in(r.drafter) for label, r in runners.items()}
    if not rows or not any(caches.values()):
        return
    done = {(r["workload"], r["prompt_id"], r["method"]): r for r in rows if r.get("token_ids") is not None}
    for workload, prompt in prompts:
        ids = None
        for label, suffix in caches.items():
            row = done.get((workload, prompt.id, label))
            if not suffix or row is None:
                continue
            ids = ids or lm.encode(prompt.model_input(lm.has_chat_template))
            for d in suffix:
                d.prefill(ids)
                d.finish(ids + row["token_ids"])


def _forget_drafts(drafter) -> None:
    """Empty every draft model's cache: methods share drafter objects, and a draft model keeps its cache across
    requests, so without this the first method on a prompt would pay the draft prefill the later ones skip. Each
    row thus times a first request's draft prefill (lazy: only if the method drafts with the model)."""
    from adaspec.drafters import ModelDrafter, MultiDrafter

    for d in (drafter.drafters.values() if isinstance(drafter, MultiDrafter) else [drafter]):
        if isinstance(d, ModelDrafter):
            d.forget()


def _run_engine(engine: SpeculativeEngine, ids: list[int], cfg: GenerationConfig) -> dict:
    """Generate and return the row fields (statistics with every step record), with the decoding phase timed apart:
    ``decode_ms`` is the time after the first token (the target's prompt prefill), drafter prefills, drafting and
    verification included; ``decode_tokens`` the tokens after the first."""
    r = engine.generate(ids, cfg)
    s = r.stats
    margins = [round(x, 5) for x in r.margins] if r.margins is not None else None
    return {"finish_reason": r.finish_reason, "token_ids": r.token_ids, "text": r.text, "margins": margins,
            **s.to_dict(),
            "decode_ms": round(s.total_ms - s.ttft_ms, 2), "decode_tokens": max(s.new_tokens - 1, 0)}


def _round_robin(prompts: list[tuple]) -> list[tuple]:
    """Reorder (workload, prompt) pairs: the first prompt of every category, then every second one, ..."""
    groups: dict[tuple[str, str], list[tuple]] = {}
    for w, p in prompts:
        groups.setdefault((w, p.category), []).append((w, p))
    longest = max((len(g) for g in groups.values()), default=0)
    return [g[i] for i in range(longest) for g in groups.values() if i < len(g)]
