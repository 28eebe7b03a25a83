"""Per method over a compare results file: decode tok/s summed over prompts, steps verified as trees, τ (tokens
emitted per speculation step), draft nodes verified per speculation step, and tokens accepted per verified node.

    python docs/results/issue14/tree_table.py docs/results/issue14/ngram-tree-2.jsonl
"""

import json
import sys
from collections import defaultdict

rows = [json.loads(line) for line in open(sys.argv[1])]
by = defaultdict(list)
for r in rows:
    by[r["method"]].append(r)
plain = sum(r["decode_tokens"] for r in by["plain"]) / (sum(r["decode_ms"] for r in by["plain"]) / 1e3)
print("| method | prompts | decode tok/s | speedup | tree steps / speculation steps | τ | nodes verified per step | "
      "accepted per verified node | identical to plain |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
ref = {r["prompt_id"]: r["token_ids"] for r in by["plain"]}
for m, rs in by.items():
    rate = sum(r["decode_tokens"] for r in rs) / (sum(r["decode_ms"] for r in rs) / 1e3)
    steps = [s for r in rs for s in r["step_records"] if s["drafted"]]
    trees = sum(1 for s in steps if s.get("tree"))
    tau = sum(s["emitted"] for s in steps) / len(steps) if steps else float("nan")
    nodes = sum(s["drafted"] for s in steps) / len(steps) if steps else float("nan")
    per_node = sum(s["accepted"] for s in steps) / max(1, sum(s["drafted"] for s in steps))
    same = sum(r["token_ids"] == ref.get(r["prompt_id"]) for r in rs)
    print(f"| {m} | {len(rs)} | {rate:.2f} | {rate / plain:.2f}x | {trees} / {len(steps)} | {tau:.2f} | {nodes:.2f} | "
          f"{per_node:.3f} | {same}/{len(rs)} |")
