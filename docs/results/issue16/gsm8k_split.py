"""GSM8K on the default runtime, split into the first 202 questions (the run that gave McNemar p = 0.021) and the
questions after them (a replication with the same command, run afterwards), each scored two ways: the eval's
cascade (with the last-number fallback) and the stated answer only (no fallback). Prints a markdown table.

    python docs/results/issue16/gsm8k_split.py docs/results/issue16/gguf
"""

import sys
from pathlib import Path

from adaspec.compare import read_results
from adaspec.quality.evaluate import analyse, score_rows

folder = Path(sys.argv[1])
rows = [r for r in read_results(folder / "gsm8k.jsonl") if r["method"] in ("plain", "hybrid/goodput")]
scores = score_rows("gsm8k", rows, folder / "scores.jsonl", progress=False)
parts = {"questions 0-201 (first run)": lambda i: i < 202, "questions 202+ (replication)": lambda i: i >= 202,
         "all": lambda i: True}
print("| questions | n | cut (plain / default) | accuracy plain → default (cascade) | McNemar p | discordant "
      "(+/−) | accuracy plain → default (stated answer) | McNemar p | discordant (+/−) | identical |")
print("|---|---:|---|---|---:|---:|---|---:|---:|---:|")
for label, keep in parts.items():
    sub = [r for r in rows if keep(int(r["prompt_id"]))]
    out = analyse("gsm8k", sub, scores, threshold=float("inf"))
    plain, spec = out["plain"], out["hybrid/goodput"]
    v, sv = spec["vs_plain"], spec["stated"]["vs_plain"]
    print(f"| {label} | {spec['n']} | {100 * plain['truncated']:.0f} % / {100 * spec['truncated']:.0f} % | "
          f"{100 * plain['accuracy']:.1f} → {100 * spec['accuracy']:.1f} % | {v['p_mcnemar']:.3f} | {v['c']}/{v['b']} | "
          f"{100 * plain['stated']['accuracy']:.1f} → {100 * spec['stated']['accuracy']:.1f} % | "
          f"{sv['p_mcnemar']:.3f} | {sv['c']}/{sv['b']} | {100 * spec['identical']:.0f} % |")
