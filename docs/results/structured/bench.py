"""Structured-output benchmark (issue 38): constrained plain decoding vs speculative decoding under the same grammar.

Methods, on the structured workload (adaspec.structured_workload; greedy, one target, one runtime):

* ``plain``: constrained plain decoding (no drafter), the reference output;
* ``speculative``: the default speculation (the default drafter, ``hybrid-suffix``: suffix decoding, prompt lookup
  and the default draft model; goodput controller) with the grammar's forced tokens drafted on top (the engine's
  default under a grammar); the controller prices K behind the forced tokens and counts the acceptance of
  drafts behind forced tokens apart from its other drafts;
* ``speculative-pooled``: the same with one acceptance per drafter (``GoodputConfig.forced_apart=False``);
* ``speculative-unpriced``: the same with a controller that plans K and books steps as if nothing were forced
  (``GoodputConfig.price_forced=False``: the controller before 2026-12-06, though the engine now routes its
  lookups after the forced tokens);
* ``speculative-noforced``: the same without forced drafts (what the grammar-forced drafts add);
* ``forced``: grammar-forced drafts alone (no other drafter, no draft model).

Each speculative method reads and writes its own partition of the suffix drafter's cache across requests
(``cache_partition``), so no method drafts from the answers another method wrote for the same task.

Per method and task: tokens/s, identity with ``plain`` (token for token), schema validity, exact match of the
expected fields, α, and the grammar engine's time (masks, cuts, forced tokens) as a share of decoding time. One JSON
line per (method, task) is appended to --out as it finishes; a rerun skips the rows already there. --report writes
the markdown table. Timing numbers mean something only on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

METHODS = ("plain", "speculative", "speculative-pooled", "speculative-unpriced", "speculative-noforced", "forced")
SPECULATIVE = ("speculative", "speculative-pooled", "speculative-unpriced", "speculative-noforced")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--draft", default=None, help="drafter of the speculative methods (default: the default drafter)")
    p.add_argument("--backend", default="ik")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--limit", type=int, default=9, help="tasks (interleaved by category)")
    p.add_argument("--max-new-tokens", type=int, default=160)
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--out", default="docs/results/structured/results.jsonl")
    p.add_argument("--report", default="docs/results/structured/results.md")
    args = p.parse_args(argv)

    from adaspec.api import SpeculativeLM, load_model, make_drafter, set_threads
    from adaspec.controllers import GoodputController, make_controller
    from adaspec.defaults import DEFAULT_DRAFTER
    from adaspec.drafters.forced import ForcedDrafter
    from adaspec.engine import GenerationConfig, SpeculativeEngine
    from adaspec.structured import GrammarVocab
    from adaspec.structured_workload import load_tasks, score

    methods = [m for m in args.methods.split(",") if m]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if out.is_file():
        for line in out.read_text().splitlines():
            row = json.loads(line)
            done.add((row["method"], row["task"]))
    set_threads(args.threads)
    target = load_model(args.target, backend=args.backend, progress=True)
    lm = SpeculativeLM(target, None, make_controller("fixed", 0))
    tasks = load_tasks(args.limit)
    plain_engine = SpeculativeEngine(target.backend, None, None, tokenizer=target.tokenizer)
    engines = {"plain": plain_engine}
    if set(SPECULATIVE) & set(methods):
        drafter = make_drafter(args.draft or DEFAULT_DRAFTER, target, backend=args.backend, progress=True)
        engines["speculative"] = SpeculativeEngine(target.backend, drafter, make_controller("goodput", None),
                                                   tokenizer=target.tokenizer)
        engines["speculative-noforced"] = engines["speculative"]
        engines["speculative-pooled"] = SpeculativeEngine(target.backend, drafter,
                                                          GoodputController(forced_apart=False),
                                                          tokenizer=target.tokenizer)
        engines["speculative-unpriced"] = SpeculativeEngine(target.backend, drafter,
                                                            GoodputController(price_forced=False),
                                                            tokenizer=target.tokenizer)
    if "forced" in methods:
        engines["forced"] = SpeculativeEngine(target.backend, ForcedDrafter(None), make_controller("fixed", 0),
                                              tokenizer=target.tokenizer)
    methods = ["plain"] + [m for m in methods if m != "plain"]  # plain first: the reference output
    vocab = GrammarVocab.from_tokenizer(target.tokenizer, target.backend.vocab_size, plain_engine.eos_token_ids)
    for engine in dict.fromkeys(engines[m] for m in methods):
        engine.warmup()
        engine.grammar_vocab = vocab  # one vocabulary (and grammar cache) per model
    plain_ids: dict[str, list[int]] = {}
    if out.is_file():
        for line in out.read_text().splitlines():
            row = json.loads(line)
            if row["method"] == "plain":
                plain_ids[row["task"]] = row["token_ids"]
    with out.open("a") as f:
        for i, task in enumerate(tasks):
            ids = lm.encode(list(task.messages), chat=True, tools=task.template_tools)
            rest = methods[1:]  # after plain (the reference), the methods in turns: each leads one task in a few
            for method in methods[:1] + rest[i % max(len(rest), 1):] + rest[:i % max(len(rest), 1)]:
                if (method, task.id) in done:
                    continue
                cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, response_format=task.constraint,
                                       forced_drafts=method != "speculative-noforced",
                                       cache_partition=method if method in SPECULATIVE else None)
                t = time.perf_counter()
                r = engines[method].generate(ids, cfg)
                wall = time.perf_counter() - t
                s = r.stats
                decode_ms = max(s.total_ms - s.prefill_ms, 1e-9)
                sc = score(task, r.text, r.finish_reason)
                if method == "plain":
                    plain_ids[task.id] = r.token_ids
                row = {"method": method, "task": task.id, "category": task.category, "runtime": args.backend,
                       "threads": args.threads, "new_tokens": s.new_tokens, "finish_reason": r.finish_reason,
                       "tokens_per_s": s.tokens_per_s, "decode_tokens_per_s": s.new_tokens / decode_ms * 1e3,
                       "wall_s": round(wall, 3), "steps": len(s.steps), "draft_tokens": s.draft_tokens,
                       "accepted_tokens": s.accepted_tokens, "acceptance_rate": s.acceptance_rate,
                       "grammar_ms": round(s.grammar_ms, 3), "grammar_share": s.grammar_ms / decode_ms,
                       "identical": r.token_ids == plain_ids.get(task.id), "valid": sc["valid"],
                       "exact": sc["exact"], "token_ids": r.token_ids, "text": r.text}
                f.write(json.dumps(row) + "\n")
                f.flush()
                print(f"{method:22s} {task.id:24s} {s.new_tokens:4d} tok {s.tokens_per_s:7.2f} tok/s "
                      f"valid={sc['valid']} identical={row['identical']}", file=sys.stderr)
    report(out, Path(args.report))
    return 0


def report(results: Path, path: Path) -> None:
    rows = [json.loads(x) for x in results.read_text().splitlines() if x.strip()]
    by = {}
    for r in rows:
        by.setdefault(r["method"], []).append(r)
    plain_tps = {r["task"]: r["tokens_per_s"] for r in by.get("plain", [])}
    plain_decode = {r["task"]: r.get("decode_tokens_per_s") for r in by.get("plain", [])}
    lines = ["| method | tasks | tokens/s (sum tokens / sum time) | speedup vs constrained plain (median per task) | "
             "decode speedup (median per task; prefill left out) | "
             "identical to plain | schema-valid | exact fields | α | grammar time / decode time |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for method in METHODS:
        rs = by.get(method)
        if not rs:
            continue
        tokens = sum(r["new_tokens"] for r in rs)
        secs = sum(r["new_tokens"] / r["tokens_per_s"] for r in rs if r["tokens_per_s"])
        speed = [r["tokens_per_s"] / plain_tps[r["task"]] for r in rs if plain_tps.get(r["task"])]
        decode = [r["decode_tokens_per_s"] / plain_decode[r["task"]] for r in rs
                  if r.get("decode_tokens_per_s") and plain_decode.get(r["task"])]
        drafted = sum(r["draft_tokens"] for r in rs)
        lines.append(f"| {method} | {len(rs)} | {tokens / secs:.2f} | "
                     f"{statistics.median(speed):.2f}x | {f'{statistics.median(decode):.2f}x' if decode else '–'} | {sum(r['identical'] for r in rs)}/{len(rs)} | "
                     f"{sum(r['valid'] for r in rs)}/{len(rs)} | {statistics.mean(r['exact'] for r in rs):.2f} | "
                     f"{(sum(r['accepted_tokens'] for r in rs) / drafted) if drafted else 0:.2f} | "
                     f"{statistics.mean(r['grammar_share'] for r in rs) * 100:.1f} % |")
    meta = rows[0] if rows else {}
    path.write_text(f"# Structured output: constrained plain vs speculative ({meta.get('runtime')}, "
                    f"{meta.get('threads')} threads)\n\nWritten by docs/results/structured/bench.py from "
                    f"{results.name}.\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
