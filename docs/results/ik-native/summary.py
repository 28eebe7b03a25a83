"""Median of each build's curves (curves.jsonl from run.sh) as a Markdown table, with native / wheel per width."""

import json
import statistics
import sys

rows = [json.loads(line) for line in open(sys.argv[1])]
by: dict[str, list[dict]] = {}
for r in rows:
    by.setdefault(r["label"], []).append(r)
widths = sorted({int(n) for r in rows for n in r["ms"]})
print(f"# ik_llama.cpp: prebuilt wheel vs a build for this CPU\n\n{rows[0]['cpu']}, {rows[0]['model']}, "
      f"{rows[0]['threads']} threads, {rows[0]['context']} tokens of context; ms per verification-like forward of n "
      f"tokens, median over {len(by.get('wheel', []))} alternated processes per build (each a median of "
      f"{rows[0]['repeats']} samples).\n")
print("| build (SIMD) | " + " | ".join(f"n={n}" for n in widths) + " |")
print("|---|" + "---:|" * len(widths))
med = {}
for label, rs in by.items():
    med[label] = {n: statistics.median(r["ms"][str(n)] for r in rs) for n in widths}
    print(f"| {label} ({rs[0]['simd']}) | " + " | ".join(f"{med[label][n]:.1f}" for n in widths) + " |")
if {"wheel", "native"} <= med.keys():
    print("| native / wheel | " + " | ".join(f"{med['native'][n] / med['wheel'][n]:.2f}" for n in widths) + " |")
    for label in ("wheel", "native"):
        m = med[label]
        print(f"\n{label}: t(8)/t(1) = {m[8] / m[1]:.2f}, t(16)/t(1) = {m[16] / m[1]:.2f}; ceiling on speedup at "
              f"α = 1 (n·t(1)/t(n)): n=8 {8 * m[1] / m[8]:.2f}×, n=16 {16 * m[1] / m[16]:.2f}×" if 8 in m and 16 in m
              else "")
