"""Summarise controls_bench.py's JSONL: per (controls, method) the decode rate over all its runs (decode tokens over
decode time), its ratio to plain decoding with the same controls on the same prompts and rounds, α, τ, the controls' share of
decoding time and identity with plain decoding.

    .venv/bin/python docs/results/issue13/table.py docs/results/issue13/controls.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

rows = [json.loads(line) for line in open(sys.argv[1])]
plain = {(r["prompt_id"], r["controls"], r["round"]): r for r in rows if r["method"] == "plain"}
groups = defaultdict(list)
for r in rows:
    groups[(r["controls"], r["method"])].append(r)
print("| controls | method | runs | decode tok/s | vs plain (same controls) | α | τ | controls ms/token | "
      "controls share of decode | identical to plain |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
def rate(rs: list[dict]) -> float:
    """Decode tokens/s over a set of runs: all their decode tokens over all their decode time."""
    return sum(r["new_tokens"] - 1 for r in rs) / sum(r["decode_ms"] for r in rs) * 1e3


for (controls, method), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
    base = [plain[(r["prompt_id"], r["controls"], r["round"])] for r in rs
            if (r["prompt_id"], r["controls"], r["round"]) in plain]
    drafted = sum(r["draft_tokens"] for r in rs)
    alpha = sum(r["accepted_tokens"] for r in rs) / drafted if drafted else None
    spec = sum(r["speculation_steps"] for r in rs)
    tau = (sum(r["accepted_tokens"] for r in rs) + spec) / spec if spec else None
    tokens = sum(r["new_tokens"] for r in rs)
    ms = sum(r["controls_ms"] for r in rs)
    same = [r["identical_to_plain"] for r in rs if r["identical_to_plain"] is not None]
    print(f"| {controls or 'none'} | {method} | {len(rs)} | {rate(rs):.2f} | {rate(rs) / rate(base):.2f}× | "
          f"{'—' if alpha is None else f'{alpha:.2f}'} | {'—' if tau is None else f'{tau:.2f}'} | "
          f"{ms / tokens:.2f} | {100 * ms / sum(r['decode_ms'] for r in rs):.1f} % | {sum(same)}/{len(same)} |")
