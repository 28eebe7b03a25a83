"""Per category of a compare results file: each method's decode speedup over plain decoding (decode tokens/s over
the category's prompts), and each tree method against the best chain method of the same category.

    python docs/results/issue14/per_category.py docs/results/issue14/xeon-avx512/ngram-tree-ik-whatif.jsonl
"""

import json
import sys
from collections import defaultdict

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
tok = defaultdict(lambda: [0, 0.0])
for r in rows:
    t = tok[(r["category"], r["method"])]
    t[0] += r["decode_tokens"]
    t[1] += r["decode_ms"]
rate = {k: v[0] / v[1] * 1e3 for k, v in tok.items() if v[1] > 0}
categories = sorted({c for c, _ in rate})
methods = list(dict.fromkeys(r["method"] for r in rows))
chains = [m for m in methods if m != "plain" and "+tree" not in m]
trees = [m for m in methods if "+tree" in m]
print("| category | " + " | ".join(methods) + " | " + " | ".join(f"{m} vs best chain" for m in trees) + " |")
print("|---|" + "---:|" * (len(methods) + len(trees)))
for c in categories:
    plain = rate[(c, "plain")]
    best = max(rate[(c, m)] for m in chains)
    cells = [f"{rate[(c, m)] / plain:.2f}×" for m in methods]
    cells += [f"{(rate[(c, m)] / best - 1) * 100:+.1f} %" for m in trees]
    print(f"| {c} | " + " | ".join(cells) + " |")
