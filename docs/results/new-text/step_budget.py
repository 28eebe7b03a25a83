"""Where a draft-model step's time goes on new text: the draft model alone at fixed K = 3 against plain decoding, per
request, one after the other in one process (3 GSM8K prompts, 3-5, and the first 3 Spec-Bench coding prompts; 128
tokens, greedy, ik_llama.cpp, 2 threads, the draft cache emptied before each request). The summary splits a
speculative step into drafting, verification (K + 1 = 4 tokens) and the rest, measures the acceptance per draft
position, and checks that the step's own numbers account for the measured speed:
predicted speedup = E[tokens per step] / step ms × plain step ms.

    PYTHONPATH=src python docs/results/new-text/step_budget.py rows.jsonl     # from the repository root
    python docs/results/new-text/step_budget.py --summary rows.jsonl
"""

from __future__ import annotations

import json
import statistics
import sys

K = 3
PROMPTS = (("gsm8k", (3, 6)), ("specbench:coding", (0, 3)))


def run(out_path: str) -> None:
    from adaspec.api import SpeculativeLM, load_model, make_drafter, set_threads
    from adaspec.controllers import FixedController
    from adaspec.engine import GenerationConfig, SpeculativeEngine
    from adaspec.models import DEFAULT_DRAFT
    from adaspec.workloads import load_workload

    set_threads(2)
    target = load_model("qwen2.5-coder-1.5b-instruct", backend="ik")
    lm = SpeculativeLM(target, None, None)
    drafter = make_drafter(DEFAULT_DRAFT, target, backend="ik")
    engines = {"plain": SpeculativeEngine(target.backend, None, None, tokenizer=target.tokenizer),
               f"k{K}": SpeculativeEngine(target.backend, drafter, FixedController(K), tokenizer=target.tokenizer)}
    for engine in engines.values():
        engine.warmup()
    with open(out_path, "a") as out:
        for workload, take in PROMPTS:
            for p in load_workload(workload)[slice(*take)]:
                ids = lm.encode(list(p.messages) if p.messages else [{"role": "user", "content": p.text}], chat=True)
                for arm, engine in engines.items():
                    drafter.forget()
                    s = engine.generate(ids, GenerationConfig(max_new_tokens=128)).stats
                    steps = [dict(drafted=st.drafted, accepted=st.accepted, emitted=st.emitted, ctx=st.context_len,
                                  draft_ms=st.draft_ms, verify_ms=st.verify_ms, total_ms=st.total_ms)
                             for st in s.steps]
                    out.write(json.dumps(dict(workload=workload, arm=arm, prompt_len=len(ids), steps=steps)) + "\n")
                    out.flush()
                    print(workload, arm, len(ids), f"{sum(x['emitted'] for x in steps) / sum(x['total_ms'] for x in steps) * 1e3:.1f} tokens/s",
                          flush=True)


def summary(path: str) -> None:
    rows = [json.loads(line) for line in open(path)]
    print(f"| prompt | plain step ms | K = {K}: α per position | E tokens/step | draft ms | verify ms | other ms | "
          "first draft step ms (prompt catch-up) | predicted ÷ plain | measured ÷ plain |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    plain = None
    for r in rows:
        steps = r["steps"]
        tps = sum(x["emitted"] for x in steps) / sum(x["total_ms"] for x in steps)
        if r["arm"] == "plain":
            plain = (statistics.median(x["total_ms"] for x in steps), tps)
            continue
        full = [x for x in steps[1:] if x["drafted"] == K]  # after the first draft step (its prompt catch-up)
        if plain is None or not full:
            print(f"| {r['workload']} ({r['prompt_len']} tokens) | no plain row before it, or no step of K = {K} |")
            continue
        reached, accepted = [0] * K, [0] * K
        for x in full:
            for i in range(min(x["accepted"] + 1, K)):
                reached[i] += 1
                accepted[i] += i < x["accepted"]
        alphas = " ".join(f"{a / max(n, 1):.2f}" for a, n in zip(accepted, reached))
        e = statistics.mean(x["accepted"] + 1 for x in full)
        d, v, t = (statistics.mean(x[key] for x in full) for key in ("draft_ms", "verify_ms", "total_ms"))
        first = next(x for x in steps if x["drafted"])  # there is one: full is not empty
        print(f"| {r['workload']} ({r['prompt_len']} tokens) | {plain[0]:.1f} | {alphas} | {e:.2f} | {d:.1f} | "
              f"{v:.1f} | {t - d - v:.1f} | {first['draft_ms']:.0f} | {e / t * plain[0]:.2f}× | {tps / plain[1]:.2f}× |")


if __name__ == "__main__":
    if sys.argv[1] == "--summary":
        summary(sys.argv[2])
    else:
        run(sys.argv[1])
