"""Per-category and per-step decode speedups of an agentic ``compare`` file (agentic.jsonl) as Markdown.

    python docs/results/suffix/steps_summary.py RUN/agentic.jsonl [--late 3]

Speedup = the method's decode tokens/s over plain decoding's on the same prompt (``vs default``: over
``hybrid/goodput``'s), averaged over prompts; ``late`` = session steps >= --late (the cache holds earlier answers).
"""

import argparse
import collections
import json
import statistics

p = argparse.ArgumentParser()
p.add_argument("jsonl")
p.add_argument("--late", type=int, default=3)
args = p.parse_args()
rate: dict[str, dict[str, float]] = collections.defaultdict(dict)
ident: dict[str, list[bool]] = collections.defaultdict(list)
plain_ids: dict[str, list[int]] = {}
rows = [json.loads(line) for line in open(args.jsonl)]
for r in rows:
    rate[r["prompt_id"]][r["method"]] = r["decode_tokens"] / r["decode_ms"] * 1e3
    if r["method"] == "plain":
        plain_ids[r["prompt_id"]] = r["token_ids"]
for r in rows:
    if r["method"] != "plain":
        ident[r["method"]].append(r["token_ids"] == plain_ids[r["prompt_id"]])
methods = [m for m in dict.fromkeys(r["method"] for r in rows) if m != "plain"]
cats = sorted({pid.split(":")[0] for pid in rate})
step = {pid: int(pid.split(":")[1]) for pid in rate}
mean = lambda xs: statistics.fmean(xs) if xs else float("nan")  # noqa: E731
print(f"# {args.jsonl}\n\nDecode speedup over plain decoding on the same prompt, mean over prompts; `late` = steps "
      f">= {args.late}; `vs default` = over hybrid/goodput.\n")
print("| category | method | all steps | late steps | late, vs default | identical to plain |")
print("|---|---|---:|---:|---:|---:|")
for c in cats:
    ids = [p for p in rate if p.startswith(c + ":")]
    late = [p for p in ids if step[p] >= args.late]
    for m in methods:
        same = sum(r["token_ids"] == plain_ids[r["prompt_id"]] for r in rows
                   if r["method"] == m and r["prompt_id"] in ids)
        vs_default = [rate[p][m] / rate[p]["hybrid/goodput"] for p in late if "hybrid/goodput" in rate[p]]
        print(f"| {c} | {m} | {mean([rate[p][m] / rate[p]['plain'] for p in ids]):.2f}× | "
              f"{mean([rate[p][m] / rate[p]['plain'] for p in late]):.2f}× | "
              f"{f'{mean(vs_default):.2f}×' if vs_default else '–'} | {same}/{len(ids)} |")
print("\n| method | " + " | ".join(f"step {s}" for s in sorted(set(step.values()))) + " |")
print("|---|" + "---:|" * len(set(step.values())))
for m in methods:
    cells = []
    for s in sorted(set(step.values())):
        cells.append(f"{mean([rate[p][m] / rate[p]['plain'] for p in rate if step[p] == s]):.2f}×")
    print(f"| {m} | " + " | ".join(cells) + " |")
print("\nidentical to plain (greedy token ids): " + ", ".join(f"{m} {sum(v)}/{len(v)}" for m, v in ident.items()))
