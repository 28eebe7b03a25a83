"""Suffix decoding's own costs: the global tree's lookup + update per decoding step at a given cache size, against a
target step, and the memory per cached token.

The cache is filled with real token streams: the shipped HumanEval solutions, GSM8K answers and Spec-Bench
questions, tokenized with the target's tokenizer and repeated (shuffled in whole texts) until ``--cached`` tokens are
held. Then ``--steps`` decoding steps are replayed over held-out text: each step proposes (local + global tree
lookup, ``SuffixDrafter.propose`` at K = ``--k``) and appends ``--emit`` tokens (the request tree's update), and each
finished request commits its response to the global tree (the insertion cost per token is timed too and reported
per step, amortised over the tokens a step emits). The target step is timed as plain decoding on the target
(``--target``, ``--threads``), 32 tokens after a short prompt.

Writes JSON (``--out``): cached tokens, bytes per cached token, lookup ms per step, update ms per step, commit ms per
token, target ms per step, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from adaspec.drafters.suffix import SuffixDrafter
from adaspec.sampling import SamplingParams
from adaspec.workloads import load_workload


def texts() -> list[str]:
    import json as j

    from adaspec.workloads import FILES, data_dir

    out = []
    for row in map(j.loads, (data_dir() / FILES["humaneval"]).read_text().splitlines()):
        out.append(row["prompt"] + row["canonical_solution"])
    for row in map(j.loads, (data_dir() / FILES["gsm8k"]).read_text().splitlines()):
        out.append(row["answer"])
    out += [p.text for p in load_workload("specbench")]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cached", type=int, default=100_000, help="tokens in the global tree")
    ap.add_argument("--depth", type=int, default=24)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--emit", type=int, default=3, help="tokens appended per step")
    ap.add_argument("--no-target", action="store_true", help="skip timing the target")
    ap.add_argument("--out", default="docs/results/suffix/tree_cost.json")
    args = ap.parse_args()

    from adaspec.api import load_model, set_threads

    set_threads(args.threads)
    tgt = load_model(args.target, backend="auto", progress=False, threads=args.threads)
    tok = tgt.tokenizer
    streams = [tok(t, add_special_tokens=False)["input_ids"] for t in texts()]
    rng = random.Random(0)
    held_out = streams[:20]
    pool = streams[20:]
    drafter = SuffixDrafter(max_tokens=args.cached, max_depth=args.depth, context_tokens=0)
    commit_s, committed = 0.0, 0
    while drafter.cache.tokens < args.cached * 0.98:
        s = rng.choice(pool)
        t = time.perf_counter()
        drafter.cache.add(s)
        commit_s += time.perf_counter() - t
        committed += len(s)
    greedy = SamplingParams()
    lookup, update = [], []
    steps = 0
    for s in held_out:
        prompt, rest = s[:32], s[32:]
        drafter.prefill(prompt)
        ids = list(prompt)
        while rest and steps < args.steps:
            t0 = time.perf_counter()
            drafter._sync(ids)  # the request tree's update for the tokens the last step appended
            t1 = time.perf_counter()
            drafter.propose(ids, args.k, greedy)
            t2 = time.perf_counter()
            update.append((t1 - t0) * 1e3)
            lookup.append((t2 - t1) * 1e3)
            ids += rest[:args.emit]
            rest = rest[args.emit:]
            steps += 1
    commit_ms_per_token = commit_s * 1e3 / committed
    row = {"target": tgt.name, "threads": args.threads, "cached_tokens": drafter.cache.tokens,
           "responses": drafter.cache.responses, "depth": args.depth, "k": args.k, "emit_per_step": args.emit,
           "steps": steps, "bytes_per_cached_token": round(drafter.cache.bytes_per_token(), 1),
           "memory_mb": round(drafter.cache.memory_bytes() / 2**20, 1),
           "lookup_ms_per_step": round(statistics.mean(lookup), 4),
           "lookup_ms_p99": round(sorted(lookup)[int(0.99 * len(lookup))], 4),
           "update_ms_per_step": round(statistics.mean(update), 4),
           "commit_ms_per_token": round(commit_ms_per_token, 4)}
    per_step = row["lookup_ms_per_step"] + row["update_ms_per_step"] + args.emit * commit_ms_per_token
    row["suffix_ms_per_step"] = round(per_step, 4)
    if not args.no_target:
        from adaspec.engine import GenerationConfig, SpeculativeEngine

        engine = SpeculativeEngine(tgt.backend, None, None, tokenizer=tok)
        ids = tok("def fibonacci(n):", add_special_tokens=False)["input_ids"]
        engine.generate(ids, GenerationConfig(max_new_tokens=4, ignore_eos=True))  # warm-up
        r = engine.generate(ids, GenerationConfig(max_new_tokens=32, ignore_eos=True))
        target_ms = (r.stats.total_ms - r.stats.ttft_ms) / max(r.stats.new_tokens - 1, 1)
        row["target_ms_per_step"] = round(target_ms, 3)
        row["suffix_share_of_target_step"] = round(per_step / target_ms, 5)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(row, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
