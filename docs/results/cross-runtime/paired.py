"""Per-mode summary of a measure.py run, paired by round: mean ± standard deviation over a mode's processes, and the
geometric mean over rounds of each mode's ratio to ik alone in the same round (modes are interleaved within a round).

    python docs/results/cross-runtime/paired.py OUT/measure.jsonl > OUT/paired.md
"""
from __future__ import annotations

import json
import statistics as st
import sys


def main(path: str) -> None:
    rows = [json.loads(line) for line in open(path) if "error" not in line]
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["mode"], []).append(r)
    base = {r["round"]: r for r in by["ik"]}
    print(f"Per mode over its {len(by['ik'])} processes (one per round): mean ± standard deviation, and the geometric "
          "mean over rounds of the ratio to ik alone in the same round (modes interleaved within each round).\n")
    print("| mode | one-token step ms | 5-token verify ms | step ÷ alone (paired) | verify ÷ alone (paired) | "
          "step ÷ alone per round | verify per process |")
    print("|---|---:|---:|---:|---:|---|---|")
    for mode, rs in by.items():
        s, v = [r["step_ms"] for r in rs], [r["verify5_ms"] for r in rs]
        rs_ = [r["step_ms"] / base[r["round"]]["step_ms"] for r in rs if r["round"] in base]
        rv = [r["verify5_ms"] / base[r["round"]]["verify5_ms"] for r in rs if r["round"] in base]
        print(f"| {mode} | {st.mean(s):.1f} ± {st.stdev(s):.1f} | {st.mean(v):.1f} ± {st.stdev(v):.1f} | "
              f"{st.geometric_mean(rs_):.3f} | {st.geometric_mean(rv):.3f} | "
              f"{', '.join(f'{x:.2f}' for x in rs_)} | {', '.join(str(round(x)) for x in v)} |")


if __name__ == "__main__":
    main(sys.argv[1])
