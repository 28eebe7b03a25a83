"""Markdown table of docs/results/issue12/batch.jsonl: median over rounds per (batch, method), decode tokens/s, the
speedup over plain batched decoding at the same batch size and the scaling over B = 1.

    python docs/results/issue12/table.py docs/results/issue12/batch.jsonl
"""

import json
import statistics
import sys
from collections import defaultdict

rows = [json.loads(line) for line in open(sys.argv[1])]
by = defaultdict(list)
for r in rows:
    by[(r["batch"], r["method"])].append(r)
med = {k: {f: statistics.median(x[f] for x in v) for f in ("decode_tokens_per_s", "tokens_per_s")}
       | {"n": len(v), "acc": statistics.median([x["acceptance"] for x in v if x["acceptance"] is not None] or [0]),
          "cap": statistics.median([x["mean_cap"] for x in v if x["mean_cap"] is not None] or [0]),
          "spec": sum(x["speculation_steps"] for x in v) / max(1, sum(x["steps"] for x in v))}
       for k, v in by.items()}
print("| B | method | rounds | decode tok/s | vs plain at B | vs B = 1 (same method) | end-to-end tok/s | "
      "end-to-end vs plain | α | mean K cap | speculation steps |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for (b, m) in sorted(med, key=lambda k: (k[0], ["plain", "ngram", "draft", "draft-blind"].index(k[1]))):
    v = med[(b, m)]
    plain = med.get((b, "plain"), {}).get("decode_tokens_per_s")
    one = med.get((1, m), {}).get("decode_tokens_per_s")
    e2e = med.get((b, "plain"), {}).get("tokens_per_s")
    print(f"| {b} | {m} | {v['n']} | {v['decode_tokens_per_s']:.2f} | "
          f"{v['decode_tokens_per_s'] / plain:.2f}x | {v['decode_tokens_per_s'] / one:.2f}x | {v['tokens_per_s']:.2f} | "
          f"{v['tokens_per_s'] / e2e:.2f}x | {v['acc']:.2f} | {v['cap']:.2f} | {100 * v['spec']:.0f}% |")
