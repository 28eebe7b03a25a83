"""What sharing a prompt's prefill across the ``n`` choices of one request saves (adaspec.batch, Backend.share_prefix).

The default target on the default runtime, 2 threads, plain batched decoding (no drafter), ``n`` rows with one prompt
of ``--prompt-tokens`` token ids admitted together: time until every row has its first token and until all are done,
with shared prefixes (the default) and with the backend's ``shares_prefix`` turned off, interleaved ``--repeats``
times. Greedy outputs of the two settings are compared. Run on a quiet machine:

    python docs/results/server-hardening/share_prefix.py --out docs/results/server-hardening/share-prefix.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path

from adaspec.api import load_model
from adaspec.batch import BatchEngine
from adaspec.engine import GenerationConfig


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def run(engine: BatchEngine, prompt: list[int], n: int, new_tokens: int) -> dict:
    cfg = GenerationConfig(max_new_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    rids = [engine.add(prompt, cfg) for _ in range(n)]
    first: dict[int, float] = {}
    done: dict[int, list[int]] = {}
    prefilled = shared = 0
    while len(done) < n:
        out = engine.step()
        prefilled += engine.last_prefill_tokens
        shared += engine.last_shared_tokens
        for rid, chunk in out.items():
            if chunk.error is not None:
                raise chunk.error
            first.setdefault(rid, time.perf_counter() - start)
            if chunk.result is not None:
                done[rid] = chunk.result.token_ids
    return {"all_first_token_s": round(max(first.values()), 3), "all_done_s": round(time.perf_counter() - start, 3),
            "prefilled_tokens": prefilled, "shared_tokens": shared, "outputs": [done[r] for r in rids]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct@ik")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--prompt-tokens", type=int, default=600)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    target = load_model(args.target, progress=False, threads=args.threads, max_sequences=args.n).backend
    engine = BatchEngine(target, max_batch=args.n, prefill_chunk=64, prefill_step_ms=750.0)
    prompt = [(i * 37) % 20000 + 200 for i in range(args.prompt_tokens)]
    rows = []
    for rep in range(args.repeats):
        for shared in (True, False):
            type(target).shares_prefix = shared  # the class attribute: this backend only, for this run
            res = run(engine, prompt, args.n, args.new_tokens)
            rows.append({"repeat": rep, "shares_prefix": shared, **res})
            print({k: v for k, v in rows[-1].items() if k != "outputs"}, flush=True)
    type(target).shares_prefix = True
    on = [r for r in rows if r["shares_prefix"]]
    off = [r for r in rows if not r["shares_prefix"]]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    summary = {
        "command": "python docs/results/server-hardening/share_prefix.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
        "commit": commit, "machine": f"{cpu_model()} ({platform.machine()}), {os.cpu_count()} CPUs",
        "first_token_speedup": round(min(r["all_first_token_s"] for r in off) /
                                     min(r["all_first_token_s"] for r in on), 3),
        "all_done_speedup": round(min(r["all_done_s"] for r in off) / min(r["all_done_s"] for r in on), 3),
        "same_outputs": all(a["outputs"] == b["outputs"] for a, b in zip(on, off)),
        "rows": [{k: v for k, v in r.items() if k != "outputs"} for r in rows],
    }
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}, indent=2))


if __name__ == "__main__":
    main()
