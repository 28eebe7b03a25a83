"""The prompt's other spellings on against off (``suffix:views=0``) in one interleaved ``compare`` file, as Markdown.

    python docs/results/suffix/views_summary.py RUN/agentic-48.jsonl [more.jsonl ...]

Per category and method pair: decode speedup over plain decoding on the same prompt (mean over prompts; ``late`` =
session steps >= 3 where the prompts have steps), τ, the on ÷ off ratio of the mean speedups, and greedy outputs
identical to plain.
"""

import json
import statistics
import sys

PAIRS = (("suffix/goodput", "suffix:views=0/goodput"),
         ("hybrid-suffix/goodput", "suffix:views=0+ngram+qwen2.5-coder-0.5b-instruct-q4_0/goodput"))

for path in sys.argv[1:]:
    rows = [json.loads(line) for line in open(path)]
    rate = {(r["prompt_id"], r["method"]): r["decode_tokens"] / r["decode_ms"] * 1e3 for r in rows}
    tau = {(r["prompt_id"], r["method"]): r["mean_accepted_tokens"] for r in rows}
    ids = {(r["prompt_id"], r["method"]): r["token_ids"] for r in rows}
    step = {r["prompt_id"]: r.get("step") for r in rows}
    cats = sorted({r["category"] for r in rows})
    cat_of = {r["prompt_id"]: r["category"] for r in rows}
    print(f"# {path}\n\nDecode speedup over plain on the same prompt, mean over prompts; `late` = steps >= 3.\n")
    print("| category | method | prompts | speedup | late | τ | on ÷ off (all) | identical to plain |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for cat in [*cats, "all"]:
        prompts = [p for p in step if (cat == "all" or cat_of[p] == cat) and (p, "plain") in rate]
        for on, off in PAIRS:
            means = {}
            for m in (on, off):
                ps = [p for p in prompts if (p, m) in rate]
                if not ps:
                    continue
                sp = [rate[(p, m)] / rate[(p, "plain")] for p in ps]
                late = [rate[(p, m)] / rate[(p, "plain")] for p in ps if (step[p] or 0) >= 3]
                means[m] = statistics.mean(sp)
                same = sum(ids[(p, m)] == ids[(p, "plain")] for p in ps)
                ratio = f"{means[on] / means[off]:.3f}" if m == off and on in means else ""
                late_s = f"{statistics.mean(late):.2f}×" if late and step[ps[0]] is not None else "–"
                print(f"| {cat} | {m} | {len(ps)} | {means[m]:.2f}× | {late_s} | "
                      f"{statistics.mean(tau[(p, m)] for p in ps):.2f} | {ratio} | {same}/{len(ps)} |")
    print()
