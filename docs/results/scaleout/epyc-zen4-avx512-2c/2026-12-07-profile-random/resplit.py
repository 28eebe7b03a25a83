"""How far apart two disjoint random prompt sets of one workload put the same speedup: every per-prompt paired
speedup of a live profile's file, split at random into two sets of n many times (and drawn with replacement for
larger n), the prediction error |mean(set A) / mean(set B) − 1| for the mean of per-prompt speedups (what
`profile --endpoint` reports), the median, the geometric mean and the ratio of summed times per token.

    PYTHONPATH=src .venv/bin/python resplit.py PROFILE.jsonl [--sizes 20,41,60,80]

No measurement: it re-reads recorded requests."""
import argparse
import json
import random
import statistics

from adaspec.bench.advise import paired_speedups
from adaspec.bench.endpoint_load import decode_rate

ap = argparse.ArgumentParser()
ap.add_argument("profile")
ap.add_argument("--sizes", default="20,41,60,80")
ap.add_argument("--draws", type=int, default=20000)
a = ap.parse_args()
rows = [json.loads(line) for line in open(a.profile)]
ratios = paired_speedups(rows)
tpt = {}
for r in rows:
    if r.get("kind") == "endpoint":
        for pid, ok, tokens, ttft, e2e in r.get("requests_detail", []):
            rate = decode_rate(tokens, ttft, e2e) if ok else None
            if rate:
                tpt.setdefault(pid, {}).setdefault(r["arm"], []).append(1 / rate)
pairs = [(statistics.median(v["baseline"]), statistics.median(v["speculative"])) for v in tpt.values()
         if v.get("baseline") and v.get("speculative")]
print(f"{len(ratios)} prompts; per-prompt speedups: min {min(ratios):.2f}, median {statistics.median(ratios):.2f}, "
      f"max {max(ratios):.2f}, mean {statistics.fmean(ratios):.3f}, sd {statistics.stdev(ratios):.3f}")
rng = random.Random(0)
est = {"mean": lambda idx: statistics.fmean(ratios[i] for i in idx),
       "median": lambda idx: statistics.median(ratios[i] for i in idx),
       "geometric mean": lambda idx: statistics.geometric_mean(ratios[i] for i in idx),
       "summed times": lambda idx: sum(pairs[i][0] for i in idx) / sum(pairs[i][1] for i in idx)}
half = len(ratios) // 2
print(f"\nrandom disjoint halves ({half} + {half}), {a.draws} splits:")
print("| estimator | median |error| | 90th percentile | P(|error| <= 10 %) |\n|---|---:|---:|---:|")
for name, f in est.items():
    errs = []
    for _ in range(a.draws):
        idx = list(range(len(ratios)))
        rng.shuffle(idx)
        errs.append(abs(f(idx[:half]) / f(idx[half:2 * half]) - 1))
    errs.sort()
    print(f"| {name} | {statistics.median(errs):.3f} | {errs[int(0.9 * len(errs))]:.3f} | "
          f"{sum(e <= 0.1 for e in errs) / len(errs):.2f} |")
print("\nmean of per-prompt speedups, two sets of n drawn with replacement from these prompts:")
print("| n per set | P(|error| <= 10 %) | P(|error| <= 5 %) |\n|---:|---:|---:|")
for n in [int(x) for x in a.sizes.split(",")]:
    errs = [abs(statistics.fmean(rng.choices(ratios, k=n)) / statistics.fmean(rng.choices(ratios, k=n)) - 1)
            for _ in range(a.draws)]
    print(f"| {n} | {sum(e <= 0.1 for e in errs) / len(errs):.2f} | {sum(e <= 0.05 for e in errs) / len(errs):.2f} |")
