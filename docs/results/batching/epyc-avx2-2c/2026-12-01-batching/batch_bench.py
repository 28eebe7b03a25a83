"""Issue 12: throughput of the batched engine (adaspec.batch) by batch size, speculation on and off.

For each batch size B in --batches, B requests (code-edit prompts, greedy, --new-tokens each) run together through a
BatchEngine on the default runtime and models; methods: plain batched decoding, n-gram drafts and the draft model,
both with the batch pricer calibrated on this machine. Methods are interleaved per round (--rounds) and every
result is appended to --out (JSONL) as it is measured; a rerun skips what the file holds.

``draft`` rows' controllers are seeded with the draft model's measured costs per token (drafting, and feeding a
catch-up such as the prompt), as ``BatchEngine.calibrate`` does, so each row prices its first proposal before paying
the draft's prompt prefill; ``draft-blind`` is the same without the seed (each row tries the draft model once,
blind, at its second step: the behaviour before 2026-12-01).

    .venv/bin/python docs/results/issue12/batch_bench.py --out docs/results/issue12/batch.jsonl

PyTorch (``--runtime torch``): the 0.5B model as target (it has no smaller draft model; methods plain and ngram),
``--pad N`` = TorchBackend's ``pad_batch_max_tokens`` (0: rows one after another, the old path; 32: one padded
forward per step), so both paths can be interleaved in one file:

    .venv/bin/python docs/results/issue12/batch_bench.py --runtime torch --dtype float32 --methods plain,ngram \
        --pads 0,32 --batches 1,2,4 --out docs/results/issue12/batch-torch.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from adaspec.api import SpeculativeLM, load_model, set_threads
from adaspec.batch import BatchEngine
from adaspec.controllers import FixedController, make_controller
from adaspec.controllers.batch import BatchPricer
from adaspec.drafters.model import ModelDrafter
from adaspec.drafters.multi import measure_drafters
from adaspec.drafters.ngram import NgramDrafter
from adaspec.engine import GenerationConfig
from adaspec.workloads import load_workload

DEFAULT_TARGET, DEFAULT_DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"  # README's models


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runtime", default="ik")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--methods", default="plain,ngram,draft")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="docs/results/issue12/batch.jsonl")
    ap.add_argument("--dtype", default="float32", help="PyTorch dtype (--runtime torch)")
    ap.add_argument("--pads", default="32", help="PyTorch: pad_batch_max_tokens values to interleave (0 = rows "
                                                 "one after another)")
    args = ap.parse_args()
    set_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    top = max(batches)
    pads = [int(p) for p in args.pads.split(",")] if args.runtime == "torch" else [None]
    if args.runtime == "torch":
        from adaspec.backends.torch_backend import TorchBackend

        tgt = load_model(f"{DEFAULT_DRAFT}@torch", dtype=args.dtype, progress=False, threads=args.threads)
        target = TorchBackend(tgt.backend.model, "target", max_context=2048, max_sequences=top)
        draft = None
    else:
        tgt = load_model(f"{DEFAULT_TARGET}@{args.runtime}", progress=False, threads=args.threads)
        drf = load_model(f"{DEFAULT_DRAFT}@{args.runtime}", progress=False, threads=args.threads)
        cls = type(tgt.backend)
        target = cls(tgt.backend.path, max_context=2048, threads=args.threads, max_sequences=top)
        draft = cls(drf.backend.path, max_context=2048, threads=args.threads, max_sequences=top)
        tgt.backend.close()
        drf.backend.close()
    lm = SpeculativeLM(tgt, None, FixedController(0))
    prompts = [lm.encode(p.text) for p in load_workload("code-edit", limit=top * args.rounds)][:top * args.rounds]
    pricer = BatchPricer()
    t = time.perf_counter()
    curve = BatchEngine(target, max_batch=top, pricer=pricer).calibrate()
    print(f"cost curve (ms by tokens in the forward, {time.perf_counter() - t:.0f} s): "
          + ", ".join(f"{n}: {ms:.0f}" for n, ms in curve.items()), flush=True)
    draft_costs = measure_drafters(ModelDrafter(draft.sequence(0))) if draft is not None else {}
    print(f"draft costs (ms per token: drafting, feeding): {draft_costs}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if out.exists():
        done = {(r["batch"], r["method"], r["round"], r.get("pad")) for r in map(json.loads,
                                                                                   out.read_text().splitlines())}
    makers = {
        "plain": (None, None),
        "ngram": (lambda seq: NgramDrafter(), lambda: make_controller("goodput", None)),
        "draft": (lambda seq: ModelDrafter(draft.sequence(seq)), lambda: make_controller("goodput", None)),
        "draft-blind": (lambda seq: ModelDrafter(draft.sequence(seq)), lambda: make_controller("goodput", None)),
    }
    cfg = GenerationConfig(max_new_tokens=args.new_tokens, ignore_eos=True)
    for rnd in range(args.rounds):
        for b in batches:
            for method, pad in [(m, p) for m in args.methods.split(",") for p in pads]:
                if (b, method, rnd, pad) in done:
                    continue
                if pad is not None:
                    target.pad_batch_max_tokens = pad
                drafter_for, controllers = makers[method]
                engine = BatchEngine(target, drafter_for, controllers, max_batch=b, pricer=pricer)
                if method == "draft":
                    engine.draft_costs.update(draft_costs)
                batch = prompts[rnd * top:rnd * top + b]
                start = time.perf_counter()
                caps = []
                rids = [engine.add(p, cfg) for p in batch]
                results = {}
                while len(results) < len(rids):
                    for rid, chunk in engine.step().items():
                        if chunk.result is not None:
                            results[rid] = chunk.result
                    caps.append(engine.last_cap)
                wall = time.perf_counter() - start
                res = [results[r] for r in rids]
                tokens = sum(len(r.token_ids) for r in res)
                drafted = sum(r.stats.draft_tokens for r in res)
                row = {"batch": b, "method": method, "round": rnd, "runtime": args.runtime, "threads": args.threads,
                       "pad": pad, "dtype": args.dtype if pad is not None else None,
                       "new_tokens": args.new_tokens, "tokens": tokens, "wall_s": round(wall, 3),
                       "tokens_per_s": round(tokens / wall, 3),
                       # after every row's prefill (all rows join at the first step): the decoding rate
                       "decode_tokens_per_s": round((tokens - len(res)) / (wall - max(r.stats.ttft_ms for r in res)
                                                                            / 1e3), 3),
                       "ttft_ms_p50": round(statistics.median(r.stats.ttft_ms for r in res), 1),
                       "acceptance": round(sum(r.stats.accepted_tokens for r in res) / drafted, 3) if drafted else None,
                       "speculation_steps": sum(r.stats.speculation_steps for r in res),
                       "steps": sum(len(r.stats.steps) for r in res),
                       "mean_cap": round(statistics.mean(c for c in caps if c is not None), 2)
                       if any(c is not None for c in caps) else None, "cpu": os.cpu_count()}
                print(json.dumps(row), flush=True)
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
