"""Suffix decoding against the global cache's size, with other traffic between a session's requests (issue 37's study).

A busy server writes other answers between two requests of one agent session; with a small cache those answers
evict the session's earlier ones, and the next step of the session has nothing to draft from. This replays that:
the agentic sessions (``adaspec compare --workloads agentic``; first ``--steps`` steps of each category, run round
robin as compare does), and before each request ``--filler`` tokens of unrelated earlier answers (whole texts of the
shipped data, as ``tree_cost.py`` uses, tokenized by the target's tokenizer; the same draw for every cache size) are
put into each method's cache. Methods: plain decoding and ``suffix:tokens=SIZE/goodput`` for each ``--sizes``. Each
method keeps its own cache across the run.

Rows are ``adaspec compare`` rows (``adaspec.compare._run_engine``: decode time apart from the prompt prefill, which
runs once per prompt outside the timings; α, τ, identity with plain), in ``--out`` (JSONL, resumable: a rerun skips
the rows it has and puts their answers and the same filler back into the caches). ``--report`` gets Markdown:
acceptance, τ and speedup by cache size, and speedup (α) by session step, i.e. by the number of earlier requests of
the session that share its structure.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from tree_cost import texts  # noqa: E402  (the shipped texts that fill the cache)

from adaspec.compare import read_results, step_table, summarize  # noqa: E402
from adaspec.compare.methods import WARMUP_PROMPT_TOKENS, WARMUP_TOKENS  # noqa: E402
from adaspec.compare.run import _run_engine  # noqa: E402


def fill(drafter, pool: list[list[int]], tokens: int, seed: int) -> None:
    """Put about ``tokens`` tokens of whole texts from ``pool`` (drawn with ``seed``) into the drafter's cache."""
    rng = random.Random(seed)
    added = 0
    while added < tokens:
        text = rng.choice(pool)
        drafter.cache.add(text)
        added += len(text)


def pooled(rows: list[dict]) -> list[dict]:
    """Every row as one category ("all"): the tables pool the sessions."""
    return [dict(r, category="all", prompt_id=f"{r['category']}/{r['prompt_id']}") for r in rows]


def report(rows: list[dict], sizes: list[int], filler: int) -> str:
    methods = [f"suffix:tokens={s}/goodput" for s in sizes]
    lines = [f"# Suffix decoding by cache size, {filler} tokens of other answers before each request", "",
             "decode tokens/s over plain's on the same prompts; α = accepted / drafted; τ = tokens per speculative "
             "step; identical = greedy output equal to plain decoding.", "",
             "| cache tokens | prompts | speedup | α | τ | identical |", "|---:|---:|---:|---:|---:|---:|"]
    stats = next(iter(summarize(pooled(rows)).values()), {})
    for size, m in zip(sizes, methods):
        s = stats.get(m)
        if s:
            lines.append(f"| {size} | {s['prompts']} | {s.get('speedup', float('nan')):.2f}x | {s['alpha']:.3f} | "
                         f"{s['tau']:.2f} | {100 * s['identical']:.0f}% |")
    lines += ["", "### Speedup over plain (α) by session step: the number of earlier requests sharing the structure",
              "",
              "| step | " + " | ".join(f"{s} tokens" for s in sizes) + " |", "|---:|" + "---:|" * len(sizes)]
    for (_, _), steps in step_table(pooled(rows)).items():
        for step, per in steps.items():
            cells = [f"{per[m]['speedup']:.2f}x ({per[m]['alpha']:.2f})" if m in per and per[m]["speedup"] else "—"
                     for m in methods]
            lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    from adaspec.models import DEFAULT_TARGET

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4, help="session steps per agentic category")
    ap.add_argument("--tokens", type=int, default=48, help="new tokens per request")
    ap.add_argument("--sizes", default="1000,10000,100000", help="cache sizes in tokens")
    ap.add_argument("--filler", type=int, default=2000, help="tokens of other answers cached before each request")
    ap.add_argument("--time-limit", type=float, default=None, metavar="MIN", help="start no prompt after MIN minutes")
    ap.add_argument("--out", type=Path, default=Path("docs/results/suffix/cache-size.jsonl"))
    ap.add_argument("--report", type=Path, default=None)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]

    from adaspec.api import SpeculativeLM, load_model, set_threads
    from adaspec.backends.prefix_cache import PrefixCacheBackend
    from adaspec.compare.run import _round_robin
    from adaspec.controllers import make_controller
    from adaspec.drafters.suffix import SuffixDrafter, remember
    from adaspec.engine import GenerationConfig, SpeculativeEngine
    from adaspec.workloads import load_workload

    set_threads(args.threads)
    prompts = _round_robin([("agentic", p) for p in load_workload("agentic", args.steps)])
    tgt = load_model(args.target, backend=args.backend, progress=False, threads=args.threads)
    lm = SpeculativeLM(tgt, None, make_controller("fixed", 0))
    pool = [tgt.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts()]
    backend = PrefixCacheBackend(tgt.backend)
    labels = ["plain"] + [f"suffix:tokens={s}/goodput" for s in sizes]
    engines = {"plain": SpeculativeEngine(backend, None, None, tokenizer=tgt.tokenizer)}
    for size, label in zip(sizes, labels[1:]):
        engines[label] = SpeculativeEngine(backend, SuffixDrafter(max_tokens=size), make_controller("goodput", None),
                                           tokenizer=tgt.tokenizer)
    done = {(r["prompt_id"], r["method"]): r for r in read_results(args.out)}
    encoded = [lm.encode(p.model_input(lm.has_chat_template)) for _, p in prompts]
    for e in engines.values():
        e.warmup(encoded[0][:WARMUP_PROMPT_TOKENS], steps=WARMUP_TOKENS)
    cfg = GenerationConfig(max_new_tokens=args.tokens, temperature=0.0, seed=0)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(args.out, "a", encoding="utf-8") as f:
        for i, ((_, prompt), ids) in enumerate(zip(prompts, encoded)):
            todo = [m for m in labels if (prompt.id, m) not in done]
            if todo and args.time_limit is not None and time.monotonic() - start > 60 * args.time_limit:
                break
            if todo:  # the prompt's prefill once, outside every method's timing (as adaspec compare does)
                backend.reset()
                backend.forward(ids, 1)
            for label in labels:
                engine = engines[label]
                if engine.drafter is not None:
                    fill(engine.drafter, pool, args.filler, seed=i)  # the other traffic since the last request
                row = done.get((prompt.id, label))
                if row is not None:  # resumed: its answer goes back into the cache as it did the first time
                    remember(engine.drafter, ids, row["token_ids"])
                    continue
                result = _run_engine(engine, ids, cfg)
                row = {"workload": "agentic", "category": prompt.category, "prompt_id": prompt.id,
                       "step": prompt.step, "method": label, "temperature": 0.0, "target": tgt.name,
                       "threads": args.threads, "filler": args.filler,
                       "cache_tokens": engine.drafter.cache.tokens if engine.drafter else None,
                       "cache_bytes": engine.drafter.cache.memory_bytes() if engine.drafter else None, **result}
                row.pop("step_records", None)
                f.write(json.dumps(row) + "\n")
                f.flush()
    if args.report is not None:
        args.report.write_text(report(read_results(args.out), sizes, args.filler))


if __name__ == "__main__":
    main()
