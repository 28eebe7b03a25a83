"""Issue 13: what the sampling controls cost under speculation, and what a draft that follows them buys.

For each prompt (HumanEval, greedy, --new-tokens) and round, the methods run interleaved on the default runtime and
models (1.5B target, 0.5B draft model, n-gram lookup), each with a fresh controller:

* ``plain`` / ``plain+<controls>``: no speculation, without and with the controls: the controls' own cost;
* ``draft`` / ``draft+<controls>``: the draft model following the controls (ModelDrafter's default);
* ``draft-raw+<controls>``: the same draft proposing from its raw logits (``follow_controls=False``);
* ``ngram`` / ``ngram+<controls>``: prompt lookup (it copies text; the controls cannot guide it).

Control sets: ``openai`` = presence_penalty 0.5 + frequency_penalty 0.5 (a chat front end's common setting),
``hf`` = repetition_penalty 1.1. Each row records decode tokens/s, α, τ and the milliseconds spent in
``LogitsControls.apply`` (the target's and the draft's). Rows are appended to --out as measured; a rerun skips what
the file holds. Every speculative output is checked against plain decoding with the same controls.

    .venv/bin/python docs/results/issue13/controls_bench.py --out docs/results/issue13/controls.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from adaspec.api import SpeculativeLM, load_model, set_threads
from adaspec.controllers import make_controller
from adaspec.drafters.model import ModelDrafter
from adaspec.drafters.ngram import NgramDrafter
from adaspec.engine import GenerationConfig, SpeculativeEngine
from adaspec.processors import LogitsControls
from adaspec.workloads import load_workload

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"  # the README's default models
CONTROL_SETS = {"": {}, "openai": {"presence_penalty": 0.5, "frequency_penalty": 0.5},
                "hf": {"repetition_penalty": 1.1}}

apply_ms = [0.0]  # time inside LogitsControls.apply, all callers
_apply = LogitsControls.apply


def timed_apply(self, *args, **kwargs):
    start = time.perf_counter()
    try:
        return _apply(self, *args, **kwargs)
    finally:
        apply_ms[0] += (time.perf_counter() - start) * 1e3


LogitsControls.apply = timed_apply


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runtime", default="auto")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--controller", default="fixed:4", help="goodput, or fixed:K")
    ap.add_argument("--methods", default="plain,draft,draft-raw,ngram")
    ap.add_argument("--controls", default=",openai,hf")
    ap.add_argument("--out", default="docs/results/issue13/controls.jsonl")
    args = ap.parse_args()
    set_threads(args.threads)
    tgt = load_model(TARGET, backend=args.runtime, progress=False, threads=args.threads)
    drf = load_model(DRAFT, backend=args.runtime, progress=False, threads=args.threads)
    lm = SpeculativeLM(tgt, None, make_controller("fixed", 0))
    prompts = [(p.id, lm.encode(p.text)) for p in load_workload("humaneval", limit=args.prompts)]
    kind, _, k = args.controller.partition(":")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if out.exists():
        done = {(r["prompt_id"], r["method"], r["controls"], r["round"])
                for r in map(json.loads, out.read_text().splitlines())}
    drafters = {"draft": ModelDrafter(drf.backend), "draft-raw": ModelDrafter(drf.backend, follow_controls=False),
                "ngram": NgramDrafter()}
    reference: dict[tuple[str, str], list[int]] = {}
    for rnd in range(args.rounds):
        for pid, ids in prompts:
            for controls in args.controls.split(","):
                cfg = GenerationConfig(max_new_tokens=args.new_tokens, **CONTROL_SETS[controls])
                for method in args.methods.split(","):
                    if method == "draft-raw" and not controls:
                        continue  # the same as "draft" without controls
                    if (pid, method, controls, rnd) in done:
                        continue
                    drafter = drafters.get(method)
                    controller = make_controller(kind, int(k) if k else None) if drafter else None
                    engine = SpeculativeEngine(tgt.backend, drafter, controller)
                    apply_ms[0] = 0.0
                    r = engine.generate(ids, cfg)
                    st = r.stats
                    decode_ms = st.total_ms - st.ttft_ms
                    key = (pid, controls)
                    if method == "plain":
                        reference[key] = r.token_ids
                    row = {"prompt_id": pid, "method": method, "controls": controls, "round": rnd,
                           "controller": args.controller, "runtime": type(tgt.backend).__name__,
                           "threads": args.threads, "new_tokens": st.new_tokens,
                           "decode_tokens_per_s": round((st.new_tokens - 1) / decode_ms * 1e3, 3),
                           "acceptance": round(st.acceptance_rate, 4) if st.draft_tokens else None,
                           "tau": round(st.mean_accepted_tokens, 3) if st.draft_tokens else None,
                           "draft_tokens": st.draft_tokens, "accepted_tokens": st.accepted_tokens,
                           "steps": len(st.steps), "speculation_steps": st.speculation_steps,
                           "controls_ms": round(apply_ms[0], 2), "decode_ms": round(decode_ms, 1),
                           "identical_to_plain": r.token_ids == reference[key] if key in reference else None,
                           "token_ids": r.token_ids, "cpu": os.cpu_count()}
                    print(json.dumps({k: v for k, v in row.items() if k != "token_ids"}), flush=True)
                    with out.open("a") as f:
                        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
