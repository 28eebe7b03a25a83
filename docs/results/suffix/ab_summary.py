"""Old vs new code on the same prompts (files FOLDER/{agentic,newtext}-{old,new}-{1,2}.jsonl from an alternated A/B):
per workload family and method, the mean per-prompt decode speedup over plain decoding of the same pass, its
K and τ, and whether the greedy outputs of old and new are identical.

    python docs/results/suffix/ab_summary.py FOLDER
"""

import collections
import json
import statistics
import sys
from pathlib import Path

folder = Path(sys.argv[1])
print(f"# Old vs new: {folder}\n\nmean over prompts of (method decode tokens/s ÷ plain's, same pass); pass 1 ran "
      "old then new, pass 2 new then old.\n")
print("| file | method | version | pass 1 | pass 2 | mean | mean K (speculative steps) | τ | identical old/new |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|")
for kind in ("agentic", "newtext"):
    data = {}
    for v in ("old", "new"):
        for p in ("1", "2"):
            f = folder / f"{kind}-{v}-{p}.jsonl"
            if f.is_file():
                data[v, p] = [json.loads(line) for line in f.open()]
    methods = [m for m in dict.fromkeys(r["method"] for rows in data.values() for r in rows) if m != "plain"]
    for m in methods:
        for v in ("old", "new"):
            cells, ks, taus = [], [], []
            for p in ("1", "2"):
                rows = data.get((v, p), [])
                plain = {r["prompt_id"]: r["decode_tokens"] / r["decode_ms"] for r in rows if r["method"] == "plain"}
                mine = [r for r in rows if r["method"] == m and r["prompt_id"] in plain]
                cells.append(statistics.fmean(r["decode_tokens"] / r["decode_ms"] / plain[r["prompt_id"]]
                                              for r in mine) if mine else float("nan"))
                ks += [k for r in mine for k in r["k_trace"] if k > 0]
                taus += [r["mean_accepted_tokens"] for r in mine if r["speculation_steps"]]
            same = ""
            if v == "new" and ("old", "1") in data and ("new", "1") in data:
                old = {r["prompt_id"]: r["token_ids"] for r in data["old", "1"] if r["method"] == m}
                new = {r["prompt_id"]: r["token_ids"] for r in data["new", "1"] if r["method"] == m}
                same = f"{sum(old[k] == new[k] for k in new if k in old)}/{len(new)}"
            print(f"| {kind} | {m} | {v} | {cells[0]:.3f}× | {cells[1]:.3f}× | {statistics.fmean(cells):.3f}× | "
                  f"{statistics.fmean(ks) if ks else 0:.2f} | {statistics.fmean(taus) if taus else 0:.2f} | {same} |")
