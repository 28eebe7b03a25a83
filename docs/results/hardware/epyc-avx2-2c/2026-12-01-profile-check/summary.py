"""Issue 17 item 8: profile's expected speedup and interval against compare's per-prompt decode speedups.

Usage: python summary.py DIR   (DIR as written by run-2.sh). Prints a Markdown table.
"""
import json
import statistics
import sys
from pathlib import Path


def per_prompt(path: Path, method: str) -> dict[str, float]:
    """Decode speedup of ``method`` over plain per prompt: (plain ms per decoded token) / (method's)."""
    rows = [json.loads(line) for line in path.open() if line.strip()]
    tpot = {(r["prompt_id"], r["method"]): r["decode_ms"] / max(r["decode_tokens"], 1) for r in rows}
    return {p: tpot[(p, "plain")] / tpot[(p, m)] for p, m in tpot if m == method and (p, "plain") in tpot}


def main(out: Path) -> None:
    print("| workload | recommended | profile: expected (95 % CI), 5 prompts | compare, same 5 prompts | vs profile |"
          " inside | compare, 8 other prompts | vs profile | inside |")
    print("|---|---|---:|---:|---:|---|---:|---:|---|")
    for w in ("humaneval", "code-edit", "gsm8k"):
        a = json.loads((out / f"profile-{w}.json").read_text())
        r = a["recommended"]
        method = r["drafter"] + "/" + r["controller"] + ("" if r["controller"] == "goodput" else f":{r['k']}")
        cells = [w, method, f"{a['expected_speedup']:.2f}× ({a['ci95'][0]:.2f}–{a['ci95'][1]:.2f})"]
        for s in ("sampled", "others"):
            sp = per_prompt(out / f"compare-{w}-{s}.jsonl", method)
            m = statistics.fmean(sp.values())
            cells += [f"{m:.2f}× ({len(sp)})", f"{(a['expected_speedup'] / m - 1) * 100:+.1f} %",
                      "yes" if a["ci95"][0] <= m <= a["ci95"][1] else "no"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
