"""Summarise study.sh's outputs (docs/results/suffix: rule.jsonl, cache-size.md, study-cost.json) as Markdown."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from cache_study import pooled  # noqa: E402

from adaspec.compare import read_results, summarize  # noqa: E402

RULES = {
    "suffix/fixed:16": "the paper's rule alone (max_spec_factor 1, min_token_prob 0.1; K never binds)",
    "suffix/goodput": "the rule sets the proposal, the goodput controller K from its acceptance counts (default)",
    "suffix:factor=16;prob=0;stop=1/goodput": "the goodput controller prices each candidate token's frequency "
                                               "(confidence stop), no rule",
    "suffix:factor=16;prob=0/goodput": "neither: the goodput controller's K over the most frequent chain",
}


def fmt(x, spec: str = ".2f", suffix: str = "") -> str:
    return "—" if x is None or x != x else f"{x:{spec}}{suffix}"


def main(folder: Path) -> None:
    print("# Suffix decoding study (issue 37): results of docs/results/suffix/study.sh\n")
    rows = read_results(folder / "rule.jsonl")
    print("## Speculation length: the paper's rule or the goodput controller (agentic sessions)\n")
    if not rows:
        print("no results (run study.sh)\n")
    else:
        print("decode tokens/s over plain's on the same prompts, all sessions pooled; α = accepted / drafted; "
              "τ = tokens per speculative step; identical = greedy output equal to plain decoding.\n")
        print("| method | what sets the length | prompts | speedup | α | τ | identical |")
        print("|---|---|---:|---:|---:|---:|---:|")
        stats = next(iter(summarize(pooled(rows)).values()), {})
        for m, what in RULES.items():
            s = stats.get(m)
            if s:
                print(f"| `{m}` | {what} | {s['prompts']} | {fmt(s.get('speedup'), '.2f', 'x')} | "
                      f"{fmt(s['alpha'], '.3f')} | {fmt(s['tau'])} | {fmt(100 * s['identical'], '.0f', '%')} |")
        print("\nPer category (speedup, α): see [rule.md](rule.md).\n")
    size = folder / "cache-size.md"
    print("## Cache size and earlier requests sharing the structure\n")
    print(size.read_text().split("\n", 2)[2] if size.exists() else "no results (run study.sh)\n")
    cost = folder / "study-cost.json"
    print("## Memory and cost of the global tree\n")
    if cost.exists():
        c = json.loads(cost.read_text())
        print("| cached tokens | bytes per cached token | lookup + update + commit per step | of a target step |")
        print("|---:|---:|---:|---:|")
        print(f"| {c.get('cached_tokens')} | {fmt(c.get('bytes_per_cached_token'), '.0f')} | "
              f"{fmt(c.get('suffix_ms_per_step'), '.3f', ' ms')} | "
              f"{fmt(c.get('suffix_share_of_target_step'), '.2%')} (target ≤ 2 %) |")
    else:
        print("no results (run study.sh)")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
