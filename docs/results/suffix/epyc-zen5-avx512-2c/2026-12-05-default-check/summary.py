"""hybrid-suffix/goodput against hybrid/goodput per workload family, both passes pooled (pass1/2.jsonl here)."""
import collections, json, statistics
from pathlib import Path
here = Path(__file__).parent
res = collections.defaultdict(lambda: collections.defaultdict(list))
same, tot = collections.Counter(), collections.Counter()
for p in (1, 2):
    rows = [json.loads(line) for line in open(here / f"pass{p}.jsonl")]
    by = {(r["prompt_id"], r["method"]): r for r in rows}
    for (pid, m), r in by.items():
        if m == "plain":
            continue
        pl = by[(pid, "plain")]
        fam = f"{r['workload']}:{r['category']}" if r["workload"] == "specbench" else r["workload"]
        res[fam][m].append((r["decode_tokens"] / r["decode_ms"]) / (pl["decode_tokens"] / pl["decode_ms"]))
        tot[m] += 1
        same[m] += r["token_ids"] == pl["token_ids"]
print("| workload | runs per method | hybrid/goodput ÷ plain | hybrid-suffix/goodput ÷ plain | hybrid-suffix ÷ hybrid |")
print("|---|---:|---:|---:|---:|")
for fam, d in res.items():
    h, s = statistics.fmean(d["hybrid/goodput"]), statistics.fmean(d["hybrid-suffix/goodput"])
    print(f"| {fam} | {len(d['hybrid/goodput'])} | {h:.2f}× | {s:.2f}× | {s / h:.3f} |")
print("\nidentical to plain (greedy): " + ", ".join(f"{m} {same[m]}/{tot[m]}" for m in tot))
