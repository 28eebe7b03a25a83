"""``adaspec compare``: several decoding methods on the same prompts, interleaved, resumable, summarised.

Every method runs on the same target in the same process, prompt by prompt, with the method order rotated per
prompt so machine drift affects all methods alike. By default the target's prompt is prefilled once per prompt,
untimed, and every method starts from that KV cache (see :func:`run_compare`), so tokens/s measure decoding. One
JSON line per (workload, prompt, method, temperature) is appended to the results file as soon as it finishes; a
rerun skips the lines already there, so a killed run continues where it stopped. The Markdown summary reports, per
workload category and temperature: tokens/s (total new tokens / total wall time), speedup vs plain decoding, α, τ,
the fraction of outputs identical to plain decoding, and where the time went.

Method syntax: ``plain`` | ``fixed:K`` | ``CONTROLLER[:K]`` (any of :data:`adaspec.controllers.CONTROLLERS`, with
the default drafter), or ``DRAFTER/CONTROLLER[:K]`` with any drafter spec of :func:`adaspec.api.make_drafter`, e.g.
``ngram/fixed:4``; ``hybrid/...`` is n-gram lookup plus the default draft model, chosen per step, and
``hybrid-suffix/...`` suffix decoding, n-gram lookup and the default draft model. Each method gets its own suffix cache, which
lives across the run's prompts (so a session's later steps see its earlier answers; rows of session workloads carry
their ``step`` and the report adds speedup per step index). ``hf:KIND[:K]``
runs a Hugging Face transformers peer on the same models; ``llama-server:...``, ``llamacpp:pld[:N]``,
``openvino:...``, ``vllm@URL`` run other engines, each in its own process (:mod:`adaspec.peers`; a peer that is
not installed, crashes or times out gets a row with its error and log tail, listed apart in the report, and a
greedy peer answer that differs from plain decoding is listed with its first difference). Modifiers follow with ``+``:
``+strict`` (strict mode: a batch-invariant target, see :class:`~adaspec.engine.GenerationConfig`) and one lossy
acceptance rule of :data:`adaspec.verify.LOSSY_RULES` (``+typical[:ε]``, ``+topk[:k]``, ``+bild[:nats]``), e.g.
``plain+strict``, ``hybrid/goodput+strict``, ``hybrid/goodput+topk:2``; and ``+tree:N[:always][:expand=E]`` (token
trees of up to N draft nodes, e.g. ``ngram-tree/fixed:4+tree:12``, :mod:`adaspec.tree`; chain or tree chosen per
step from measured goodput, or a tree every step with ``:always``; a draft model's tree expands E nodes per level,
``expand=0`` one-level trees, :attr:`adaspec.engine.GenerationConfig.tree_expand`). A strict method's identity is
counted against ``plain+strict``.

The workload ``structured`` (:mod:`adaspec.structured_workload`: schema-constrained extraction and forced tool
calls) runs every adaspec method under each task's grammar; its rows also carry ``valid`` (schema-valid) and
``exact`` (the fraction of expected fields right). Transformers peers skip it (no grammar here).

The report adds, per category and temperature, the **oracle** (the best fixed K in hindsight, default drafter) and
a target check: the default method's tokens/s against the oracle, plain decoding and the best transformers
assisted-generation peer, plus the Spec-Bench average over its categories.
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from adaspec import spec_setting
from adaspec.backends.prefix_cache import PrefixCacheBackend
from adaspec.controllers import make_controller
from adaspec.defaults import DEFAULT_CONTROLLER, DEFAULT_DRAFTER
from adaspec.engine import GenerationConfig, SpeculativeEngine
from adaspec.errors import ConfigError
from adaspec.peers import PEER_LIBRARIES, is_combined_peer, parse_peer
from adaspec.peers import report as peer_report
from adaspec.spec_setting import SpecSetting, parse_modifiers, reference_method, split_method
from adaspec.structured import GrammarVocab

DEFAULT_METHOD = f"{DEFAULT_DRAFTER}/{DEFAULT_CONTROLLER}"
STRUCTURED = "structured"  # the structured-output workload (adaspec.structured_workload): rows carry valid, exact
"""What ``adaspec generate`` does by default (the method the target check is about)."""

FIXED_KS = (1, 2, 3, 4, 6, 8)
CONTROLLER_METHODS = ("goodput", "hybrid/goodput", "adaptive", "heuristic", "confidence", "entropy", "bandit",
                      "hybrid/bandit", "hybrid/fixed:4")
PEER_METHODS = ("hf:constant:4", "hf:heuristic", "hf:dynamic", "hf:pld")
SPECBENCH = "specbench"
WARMUP_PROMPT_TOKENS, WARMUP_TOKENS = 48, 24  # each adaspec method's untimed warm-up generation

PRESETS = {
    # About 15-20 minutes on 2 CPU cores (AVX2, bf16) with the default pair: three workloads (code, maths, and a
    # Spec-Bench category where speculation loses), one prompt each, greedy and sampling, 32 tokens; the fixed K that
    # can be the oracle there, the default and the goodput controller alone, and two transformers peers.
    "quick": dict(workloads=["humaneval", "gsm8k", "specbench:translation"], limit=1, max_new_tokens=32,
                  temperatures=[0.0, 1.0],
                  methods=["plain", "fixed:1", "fixed:2", "fixed:3", "goodput", "hybrid/goodput", "hf:dynamic",
                           "hf:pld"]),
    # Many hours here: every method of the issue, 10 prompts per category, 128 tokens, greedy and sampling.
    "full": dict(workloads=["humaneval", "gsm8k", SPECBENCH], limit=10, max_new_tokens=128, temperatures=[0.0, 1.0],
                 methods=["plain", *(f"fixed:{k}" for k in FIXED_KS), *CONTROLLER_METHODS, *PEER_METHODS]),
}


Method = SpecSetting  # a compare method is a labelled speculation setting (peers: controller = their library)


def parse_method(text: str, default_draft: str) -> SpecSetting:
    """Parse a method string (see module docstring). Raises ConfigError on a malformed one.

    A transformers peer is ``SpecSetting(draft model spec or None for prompt lookup, "hf", K, label=text)``; every
    other method is :func:`adaspec.spec_setting.parse_method`'s.
    """
    if is_combined_peer(text):  # llama-server:draft+ngram, vllm@http://...: no modifiers, no drafter prefix
        return _peer_method(text, parse_peer(text), default_draft)
    head, mods = split_method(text)
    parse_modifiers(text, mods)  # a malformed modifier is named before anything else
    if head != "plain":
        peer = parse_peer(head)
        if peer is not None:
            if mods:
                raise ConfigError(f"bad method {text!r}: modifiers apply to adaspec's methods, not to peers")
            return _peer_method(text, peer, default_draft)
    return spec_setting.parse_method(text, default_draft)


def _peer_method(text: str, peer, default_draft: str) -> SpecSetting:
    return SpecSetting(default_draft if peer.needs_draft_model else None, peer.library, peer.k, label=text)


def result_key(row: dict) -> tuple:
    """What identifies a row: a rerun skips the (workload, prompt, method, temperature, strict) already there."""
    return row["workload"], row["prompt_id"], row["method"], row["temperature"], bool(row.get("strict", False))


def read_results(path: Path) -> list[dict]:
    """Rows of a results file; a truncated last line (killed mid-write) is ignored."""
    if not path.exists():
        return []
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def run_compare(*, target: str, draft: str, methods: list[str], workloads: list[str], limit: int | None,
                max_new_tokens: int, temperatures: list[float], out: Path, dtype: str | None = None,
                threads: int | None = None, seed: int = 0, progress: bool = True,
                time_limit_s: float | None = None, prompt_cache: bool = True, backend: str = "auto",
                device: str = "auto", strict: bool = False, record_margins: bool = False) -> Path:
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
    divergence analysis (``adaspec eval``).
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
    done = {result_key(r) for r in read_results(out) if not r.get("error")}  # a failed peer is tried again
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
                                      backend=backend)
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
    runners.update(_peer_runners(peers, tgt, drafters, runners["plain"], dtype=dtype, progress=progress,
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


def _peer_runners(methods: list[SpecSetting], tgt, drafters: dict, plain: SpeculativeEngine, *, dtype: str | None,
                  progress: bool, device: str = "auto", draft: str = "", threads: int | None = None,
                  log_dir: Path | None = None) -> dict:
    """A runner per peer: transformers peers (:class:`~adaspec.peers.PeerRunner`) on the very model objects adaspec
    runs (the draft model is shared with a loaded ModelDrafter when there is one), which must be on PyTorch; every
    other peer in its own process (:func:`adaspec.peers.make_peer`), on the target's and draft's GGUF files (or the
    OpenVINO exports of the same zoo models), with its log in ``log_dir``.

    Raises:
        ConfigError: a transformers peer on a target that is not on PyTorch.
    """
    from adaspec.api import load_model, split_backend
    from adaspec.drafters import ModelDrafter, MultiDrafter
    from adaspec.peers import PeerRunner, make_peer

    def draft_model(spec: str):
        for d in drafters.values():
            subs = d.drafters.values() if isinstance(d, MultiDrafter) else [d]
            for sub in subs:
                if (isinstance(sub, ModelDrafter) and spec in (sub.name, sub.backend.name)
                        and hasattr(sub.backend, "model")):
                    return sub.backend.model
        model = getattr(load_model(spec, dtype=dtype, device=device, progress=progress).backend, "model", None)
        if model is None:
            raise ConfigError(f"transformers assisted generation needs a PyTorch draft model, not {spec}")
        return model

    runners = {}
    ctx = None
    for m in methods:
        peer = parse_peer(m.label)
        if peer.library != "hf":
            ctx = ctx or _peer_context(tgt, draft, threads, plain, log_dir or Path("peers-logs"), split_backend)
            runners[m.label] = make_peer(peer, ctx)
            continue
        if not hasattr(tgt.backend, "model"):
            raise ConfigError(f"{m.label} runs transformers' generate and needs a PyTorch target, not {tgt.name}")
        runners[m.label] = PeerRunner(peer, tgt.backend.model, draft_model(m.drafter) if m.drafter else None,
                                      eos_token_ids=plain.eos_token_ids, pad_token_id=tgt.tokenizer.pad_token_id)
    return runners


def _peer_context(tgt, draft: str, threads: int | None, plain: SpeculativeEngine, log_dir: Path, split_backend):
    """What the out-of-process peers start from: the target's GGUF (the file adaspec runs, when it runs one), the
    draft's GGUF (resolved on first use), zoo names, threads, stop tokens and the tokenizer."""
    import torch

    from adaspec.models import resolve_gguf
    from adaspec.peers import PeerContext

    target_name = split_backend(tgt.name)[0]
    draft_name = split_backend(draft)[0]
    path = getattr(tgt.backend, "path", None)
    return PeerContext(
        target=target_name, draft=draft_name, threads=threads or torch.get_num_threads(), log_dir=log_dir,
        eos_token_ids=tuple(plain.eos_token_ids),
        target_gguf=path if path is not None else (lambda: resolve_gguf(target_name, progress=False)[1]),
        draft_gguf=lambda: resolve_gguf(draft_name, progress=False)[1],
        tokenize=lambda text: tgt.tokenizer.encode(text, add_special_tokens=False),
        detokenize=lambda ids: tgt.tokenizer.decode(ids))


def summarize(rows: list[dict]) -> dict[tuple[str, float], dict[str, dict]]:
    """Aggregate rows per (category, temperature) and method into tokens/s, speedup, α, τ, identity and time split.

    tokens/s is decoding throughput (Σ decode_tokens / Σ decode_ms) when the rows time decoding apart from prefills
    (see :func:`_run_engine`), end to end (Σ new tokens / Σ total time) for older rows. Only prompts that every
    method of the group has finished are counted, so partial results compare like with like. Values a method does
    not report (a transformers peer's α, τ and time split) are None. Rows of peers that did not answer (``error``)
    are left out (:mod:`adaspec.peers.report` lists them).
    """
    groups: dict[tuple[str, float], list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("error"):
            continue
        groups[(r["category"], r["temperature"])].append(r)
    table: dict[tuple[str, float], dict[str, dict]] = {}
    for key, group in sorted(groups.items()):
        methods = sorted({r["method"] for r in group})
        by_prompt: dict[str, dict[str, dict]] = defaultdict(dict)
        for r in group:
            by_prompt[r["prompt_id"]][r["method"]] = r
        complete = {p: ms for p, ms in by_prompt.items() if len(ms) == len(methods)}
        stats: dict[str, dict] = {}
        for m in methods:
            rs = [ms[m] for ms in complete.values()]
            if not rs:
                continue
            total_ms = sum(r["total_ms"] for r in rs)
            decode = all(r.get("decode_ms") is not None for r in rs)
            decode_ms = sum(r["decode_ms"] for r in rs) if decode else 0.0
            tokens_per_s = (sum(r["decode_tokens"] for r in rs) / (decode_ms / 1e3) if decode and decode_ms > 0
                            else sum(r["new_tokens"] for r in rs) / (total_ms / 1e3))
            counted = all(r.get("draft_tokens") is not None for r in rs)
            stepped = counted and all(r.get("speculation_steps") is not None for r in rs)  # peers count no steps
            drafted = sum(r["draft_tokens"] for r in rs) if counted else 0
            spec_steps = sum(r["speculation_steps"] for r in rs) if stepped else 0
            accepted = sum(r["accepted_tokens"] for r in rs) if counted else 0
            ref = reference_method(m)
            same = [ms[m]["token_ids"] == ms[ref]["token_ids"] for ms in complete.values() if ref in ms]
            stats[m] = {
                "prompts": len(rs),
                "tokens_per_s": tokens_per_s,
                "decode": decode,
                "alpha": (accepted / drafted if drafted else 0.0) if counted else None,
                "tau": ((accepted + spec_steps) / spec_steps if spec_steps else 0.0) if stepped else None,
                "identical": sum(same) / len(same) if same else float("nan"),
                **{f"{part}_share": (sum(r[f"{part}_ms"] for r in rs) / total_ms
                                     if all(r.get(f"{part}_ms") is not None for r in rs) else None)
                   for part in ("prefill", "draft", "verify", "other")},
            }
        if "plain" in stats:
            for s in stats.values():
                s["speedup"] = s["tokens_per_s"] / stats["plain"]["tokens_per_s"]
        table[key] = stats
    return table


def step_table(rows: list[dict]) -> dict[tuple[str, float], dict[int, dict[str, dict]]]:
    """Per (category, temperature) of session workloads (rows with a ``step``: :attr:`Prompt.step
    <adaspec.workloads.Prompt.step>`), per step index and method: ``speedup`` (decode tokens/s over plain's on the
    same prompts of that step), ``alpha`` and ``identical`` (to plain, the fraction of prompts). How fast a cache of
    earlier answers (the suffix drafter's) warms up along a session."""
    out: dict[tuple[str, float], dict[int, dict[str, dict]]] = {}
    for (category, temp), _ in summarize([r for r in rows if r.get("step") is not None]).items():
        group = [r for r in rows if r.get("step") is not None and r["category"] == category
                 and r["temperature"] == temp]
        for step in sorted({r["step"] for r in group}):
            at = [dict(r, category=f"{category}#{step}") for r in group if r["step"] == step]
            stats = next(iter(summarize(at).values()), {})
            out.setdefault((category, temp), {})[step] = {
                m: {"speedup": v.get("speedup"), "alpha": v["alpha"], "identical": v["identical"]}
                for m, v in stats.items()}
    return out


def _step_lines(rows: list[dict]) -> list[str]:
    lines = []
    for (category, temp), steps in step_table(rows).items():
        methods = sorted({m for per in steps.values() for m in per if m != "plain"})
        lines += [f"### {category}, temperature {temp:g}: speedup over plain per session step (α)", "",
                  "| step | " + " | ".join(methods) + " |", "|---:|" + "---:|" * len(methods)]
        for step, per in steps.items():
            cells = [f"{_fmt(per[m]['speedup'], '.2f', 'x')} ({_fmt(per[m]['alpha'], '.2f')})" if m in per else "—"
                     for m in methods]
            lines.append(f"| {step} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def oracle(stats: dict[str, dict]) -> str | None:
    """The best fixed K > 0 (default drafter) of one group, in hindsight: its method label, or None."""
    fixed = [m for m in stats if m.startswith("fixed:") and m[6:].isdigit() and int(m[6:]) > 0]
    return max(fixed, key=lambda m: stats[m]["tokens_per_s"]) if fixed else None


def best_peer(stats: dict[str, dict], *, lookup: bool = False) -> str | None:
    """The fastest transformers assisted-generation peer of a group (``lookup``: prompt lookup instead)."""
    peers = [m for m in stats if m.startswith("hf:") and (m.startswith("hf:pld") == lookup)]
    return max(peers, key=lambda m: stats[m]["tokens_per_s"]) if peers else None


def target_check(rows: list[dict], default_method: str = DEFAULT_METHOD) -> list[dict]:
    """Per (category, temperature), and for the Spec-Bench average, the default method's ratios to the oracle,
    to plain decoding and to the best transformers assisted-generation peer (None where a method is missing)."""
    table = summarize(rows)
    specbench = {r["category"] for r in rows if str(r.get("workload", "")).startswith(SPECBENCH)}
    out = []

    def ratio(a, b):
        return a / b if a is not None and b else None

    def tps(stats, m):
        return stats[m]["tokens_per_s"] if m in stats else None

    for (category, temp), stats in table.items():
        o, hf = oracle(stats), best_peer(stats)
        d = tps(stats, default_method)
        out.append({"category": category, "temperature": temp, "prompts": stats.get("plain", {}).get("prompts"),
                    "plain": tps(stats, "plain"), "oracle": o, "oracle_tps": tps(stats, o),
                    "default": d, "vs_oracle": ratio(d, tps(stats, o)), "vs_plain": ratio(d, tps(stats, "plain")),
                    "hf": hf, "hf_tps": tps(stats, hf), "vs_hf": ratio(d, tps(stats, hf)),
                    "identical": stats[default_method]["identical"] if default_method in stats else None})
    for temp in sorted({t for _, t in table}):
        cats = [c for c, t in table if t == temp and c in specbench]
        if not cats:
            continue
        groups = [table[(c, temp)] for c in cats]

        def mean_speedup(pick):
            values = [g[m]["speedup"] for g in groups if (m := pick(g)) and "speedup" in g.get(m, {})]
            return sum(values) / len(values) if len(values) == len(groups) else None

        d = mean_speedup(lambda g: default_method)
        o = mean_speedup(oracle)
        hf = mean_speedup(best_peer)
        out.append({"category": f"Spec-Bench average ({len(cats)} categories, mean speedup)", "temperature": temp,
                    "prompts": None, "plain": 1.0, "oracle": "per category", "oracle_tps": o, "default": d,
                    "vs_oracle": ratio(d, o), "vs_plain": d, "hf": "best per category", "hf_tps": hf,
                    "vs_hf": ratio(d, hf), "identical": None})
    return out


def _fmt(x, spec: str = ".2f", suffix: str = "") -> str:
    return "—" if x is None or x != x else f"{x:{spec}}{suffix}"


def markdown_report(rows: list[dict], default_method: str = DEFAULT_METHOD) -> str:
    """The summary as Markdown: the target check (when the default method ran), then one table per (category,
    temperature) with every method, the oracle marked."""
    lines = []
    check = target_check(rows, default_method)
    if any(c["default"] is not None for c in check):
        lines += [f"## Target check: `{default_method}` against the oracle, plain decoding and transformers", "",
                  "tokens/s (decoding, after the prefills and the first step, when the rows time it; speedup for "
                  "the Spec-Bench average rows). Oracle = best fixed K in hindsight per category; transformers = "
                  "best assisted-generation peer (prompt lookup `hf:pld` is listed in the tables, not here).", "",
                  "| category | T | plain | oracle | oracle tok/s | default tok/s | default / oracle | default / plain "
                  "| transformers | its tok/s | default / transformers | identical |",
                  "|---|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---:|"]
        for c in check:
            ident = "n/a" if c["temperature"] > 0 or c["identical"] is None else _fmt(100 * c["identical"], ".0f", "%")
            lines.append(f"| {c['category']} | {c['temperature']:g} | {_fmt(c['plain'])} | {c['oracle'] or '—'} | "
                         f"{_fmt(c['oracle_tps'])} | {_fmt(c['default'])} | {_fmt(c['vs_oracle'], '.3f')} | "
                         f"{_fmt(c['vs_plain'], '.3f')} | {c['hf'] or '—'} | {_fmt(c['hf_tps'])} | "
                         f"{_fmt(c['vs_hf'], '.3f')} | {ident} |")
        lines.append("")
    for (category, temp), stats in summarize(rows).items():
        n = max((s["prompts"] for s in stats.values()), default=0)
        best_fixed = oracle(stats)
        unit = "decode tokens/s" if all(s["decode"] for s in stats.values()) else "tokens/s"
        lines += [f"### {category}, temperature {temp:g} ({n} prompts)", "",
                  f"| method | {unit} | speedup | α | τ | identical to plain "
                  "| time: prefill / draft / verify / other |", "|---|---:|---:|---:|---:|---:|---|"]
        for m, s in sorted(stats.items(), key=lambda kv: -kv[1]["tokens_per_s"]):
            shares = [s[f"{p}_share"] for p in ("prefill", "draft", "verify", "other")]
            split = "n/a" if None in shares else " / ".join(f"{100 * x:.0f}%" for x in shares)
            ident = "n/a" if s["identical"] != s["identical"] or temp > 0 else f"{100 * s['identical']:.0f}%"
            lines.append(f"| {m} | {s['tokens_per_s']:.2f} | {s.get('speedup', float('nan')):.2f}x | "
                         f"{_fmt(s['alpha'], '.3f')} | {_fmt(s['tau'])} | {ident} | {split} |")
        for m, status in peer_report.failed_in(rows, category, temp).items():
            lines.append(f"| {m} | {status} (see below) | — | — | — | — | — |")
        if best_fixed:
            lines += ["", f"Oracle (best fixed K in hindsight): {best_fixed}, "
                          f"{stats[best_fixed]['tokens_per_s']:.2f} tokens/s."]
        lines.append("")
    lines += _step_lines(rows)
    lines += peer_report.peer_lines(rows)
    return "\n".join(lines)
