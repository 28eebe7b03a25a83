"""The tables of docs/results/structured/endpoint.sh: per pair and task category, each arm's time to first token,
decode rate and end-to-end time, the end-to-end speedup of the pair's first arm over its second (geometric mean
over the tasks, paired by task), and each arm's schema-valid share.

    python docs/results/structured/endpoint_table.py OUTDIR > OUTDIR/README.md
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

PAIRS = {"adaspec": ("adaspec default", "adaspec plain"), "llama": ("llama-server n-gram", "llama-server plain"),
         "cross": ("adaspec default", "llama-server plain"),
         "prefix": ("adaspec default, prefix cache", "adaspec default, --no-prefix-cache")}
CATEGORIES = {"sig": "signatures (JSON schema)", "gsm8k": "GSM8K answers (JSON schema)",
              "tool": "tool calls (required)"}


def arms(path: Path) -> dict[str, dict]:
    rows = [json.loads(line) for line in path.open() if line.strip()]
    return {r["arm"]: r for r in rows if r.get("kind") == "endpoint"}


def per_task(row: dict) -> dict[str, tuple[int, float, float]]:
    """task id -> (output tokens, TTFT ms, end-to-end ms) of the requests that answered."""
    return {pid: (n, ttft, e2e) for pid, ok, n, ttft, e2e in row["requests_detail"] if ok}


def main(out: Path) -> None:
    commit = (out / "commit.txt").read_text().strip()[:7] if (out / "commit.txt").exists() else "?"
    print(f"# Structured outputs beside llama-server ({out.name})\n")
    print(f"Commit `{commit}`. Command: `bash docs/results/structured/endpoint.sh {out}`; each pair's servers started "
          "fresh and measured interleaved (one client, greedy, 160 tokens at most, streamed). TTFT and end-to-end "
          "time: medians over the category's tasks; decode: output tokens after the first over the time after the "
          "first streamed piece, summed over the tasks; speedup: geometric mean over the tasks of the second arm's "
          "end-to-end time over the first's.\n")
    for pair in [p + tail for tail in ("", "-tools") for p in PAIRS]:
        first, second = PAIRS[pair.removesuffix("-tools")]
        path = out / f"{pair}.jsonl"
        if not path.exists():
            continue
        got = arms(path)
        a, b = got.get("speculative"), got.get("baseline")
        if a is None or b is None:
            continue
        ta, tb = per_task(a), per_task(b)
        print(f"## {first} vs {second}{', tool calls alone' if pair.endswith('-tools') else ''} (`{pair}.jsonl`)\n")
        print(f"Schema-valid: {first} {a['structured']['valid']:.0%}, {second} {b['structured']['valid']:.0%} "
              f"(exact fields {a['structured']['exact_fields']:.2f} / {b['structured']['exact_fields']:.2f}).\n")
        print(f"| tasks | TTFT ms ({first} / {second}) | decode tok/s | end-to-end ms | speedup, end to end |")
        print("|---|---|---|---|---:|")
        for key, label in CATEGORIES.items():
            ids = [t for t in ta if t.startswith(key) and t in tb]
            if not ids:
                continue

            def med(table, i):
                return statistics.median(table[t][i] for t in ids)

            def decode(table):
                ms = sum(table[t][2] - table[t][1] for t in ids)
                return sum(table[t][0] - 1 for t in ids) / (ms / 1e3) if ms > 0 else float("nan")

            speedup = statistics.geometric_mean(tb[t][2] / ta[t][2] for t in ids)
            print(f"| {label} ({len(ids)}) | {med(ta, 1):.0f} / {med(tb, 1):.0f} | {decode(ta):.1f} / {decode(tb):.1f} "
                  f"| {med(ta, 2):.0f} / {med(tb, 2):.0f} | {speedup:.2f}× |")
        ids = [t for t in ta if t in tb]
        speedup = statistics.geometric_mean(tb[t][2] / ta[t][2] for t in ids)
        print(f"| all ({len(ids)}) | {statistics.median(ta[t][1] for t in ids):.0f} / "
              f"{statistics.median(tb[t][1] for t in ids):.0f} | | {statistics.median(ta[t][2] for t in ids):.0f} / "
              f"{statistics.median(tb[t][2] for t in ids):.0f} | {speedup:.2f}× |\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
