"""Per workload family: plain and the file's speculative method (its first method other than plain: hybrid/goodput in
runs before 2026-12-06, hybrid-suffix/goodput since) decode tokens/s, speedup, α, and identity with plain, one column
group per results file. Usage: table.py FILE.jsonl [FILE.jsonl ...]"""

import json
import statistics
import sys
from pathlib import Path

FAMILY = {"coding": "new code (Spec-Bench coding)", "writing": "chat (Spec-Bench writing)", "humaneval": "HumanEval",
          "gsm8k": "GSM8K"}


def family(row: dict) -> str:
    return FAMILY.get(row["category"], "code edits" if row["workload"] == "code-edit" else row["category"])


files = [Path(p) for p in sys.argv[1:]]
cells: dict[str, dict[str, str]] = {}
for path in files:
    rows = [json.loads(line) for line in path.open() if line.strip()]
    plain = {r["prompt_id"]: r for r in rows if r["method"] == "plain"}
    method = next(r["method"] for r in rows if r["method"] != "plain")
    by_family: dict[str, list[tuple[dict, dict]]] = {}
    for r in rows:
        if r["method"] == method and r["prompt_id"] in plain:
            by_family.setdefault(family(r), []).append((plain[r["prompt_id"]], r))
    for fam, pairs in by_family.items():
        p_tps = statistics.mean(p["tokens_per_s"] for p, _ in pairs)
        d_tps = statistics.mean(d["tokens_per_s"] for _, d in pairs)
        same = sum(p["token_ids"] == d["token_ids"] for p, d in pairs)
        alpha = statistics.mean(d["acceptance_rate"] for _, d in pairs)
        cells.setdefault(fam, {})[path.stem] = (f"{p_tps:.1f} | {d_tps:.1f} | {d_tps / p_tps:.2f}× | {alpha:.2f} | "
                                               f"{same}/{len(pairs)}")
print("decode tokens/s after the prompt (means over prompts); speedup = default / plain in the same run; identical = "
      "greedy output equal to plain decoding on the same runtime\n")
head = " | ".join(f"{p.stem}: plain | default | speedup | α | identical" for p in files)
print(f"| family | {head} |")
print("|---|" + "---:|" * (5 * len(files)))
for fam, by_file in cells.items():
    print(f"| {fam} | " + " | ".join(by_file.get(p.stem, "– | – | – | – | –") for p in files) + " |")
