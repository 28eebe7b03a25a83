"""Endpoint vs compare agreement with drift controlled (issue 15, run-4.sh).

Usage: agreement.py COMPARE.jsonl [COMPARE.jsonl ...] -- ENDPOINT.jsonl [...]

The compare runs and the endpoint runs alternate in time (c0, e0, c1, e1, ...); each endpoint run is set against the
mean of the compare runs on either side of it. Decode tokens/s on both sides: compare's Σ decode tokens / Σ decode
time over the 4 prompts (its report's number), the endpoint's decode rate from the streamed responses (bench's
``decode_tok_s``). Prints a markdown table.
"""
import json
import statistics
import sys
from pathlib import Path

from adaspec.compare import read_results, summarize

ARMS = {"plain": "baseline", "hybrid/goodput": "speculative"}


def compare_rates(path: str) -> dict[str, float]:
    table = summarize(read_results(Path(path)))
    (stats,) = table.values()
    return {m: stats[m]["tokens_per_s"] for m in ARMS}


def endpoint_rates(path: str) -> dict[str, float]:
    rows = [json.loads(line) for line in open(path)]
    return {m: statistics.median(r["decode_tok_s"] for r in rows if r.get("kind") == "endpoint" and r["arm"] == arm)
            for m, arm in ARMS.items()}  # the median over rounds, as run-2/run-3 reported


def main(argv: list[str]) -> None:
    cut = argv.index("--")
    comps = [compare_rates(p) for p in argv[:cut]]
    ends = [endpoint_rates(p) for p in argv[cut + 1:]]
    if len(comps) != len(ends) + 1:
        raise SystemExit("need one more compare run than endpoint runs (they alternate, compare first and last)")
    print("| method | run | compare before / after | endpoint | endpoint vs mean of neighbours |")
    print("|---|---:|---:|---:|---:|")
    summary = {}
    for m in ARMS:
        ratios = []
        for i, e in enumerate(ends):
            ref = (comps[i][m] + comps[i + 1][m]) / 2
            ratios.append(e[m] / ref - 1)
            print(f"| {m} | {i + 1} | {comps[i][m]:.2f} / {comps[i + 1][m]:.2f} | {e[m]:.2f} | {ratios[-1]:+.1%} |")
        allc = statistics.mean(c[m] for c in comps)
        alle = statistics.mean(e[m] for e in ends)
        summary[m] = (allc, alle, ratios)
    print()
    print("| method | compare mean | endpoint mean | difference | per-run differences |")
    print("|---|---:|---:|---:|---|")
    for m, (allc, alle, ratios) in summary.items():
        print(f"| {m} | {allc:.2f} | {alle:.2f} | {alle / allc - 1:+.1%} | "
              + ", ".join(f"{r:+.1%}" for r in ratios) + " |")
    sp_c = [c["hybrid/goodput"] / c["plain"] for c in comps]
    sp_e = [e["hybrid/goodput"] / e["plain"] for e in ends]
    print()
    print(f"Speedup (default / plain, decode): compare {', '.join(f'{s:.2f}x' for s in sp_c)}; "
          f"endpoint {', '.join(f'{s:.2f}x' for s in sp_e)}.")


if __name__ == "__main__":
    main(sys.argv[1:])
