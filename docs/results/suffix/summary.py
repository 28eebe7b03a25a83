"""Summarise docs/results/suffix (run.sh's outputs) against issue 37's targets, as Markdown on stdout."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from adaspec.compare import read_results, step_table, summarize

DEFAULT, SUFFIX, HYBRID_SUFFIX = "hybrid/goodput", "suffix/goodput", "hybrid-suffix/goodput"
METHODS = (DEFAULT, SUFFIX, HYBRID_SUFFIX)


def fmt(x, spec=".2f", suffix="") -> str:
    return "—" if x is None else f"{x:{spec}}{suffix}"


def main(folder: Path) -> None:
    print("# Suffix decoding: results of docs/results/suffix/run.sh\n")
    for name, title in (("agentic", "Agentic sessions"), ("edits-novel", "Code edits and novel prompts")):
        rows = read_results(folder / f"{name}.jsonl")
        if not rows:
            print(f"## {title}\n\nno results (run run.sh)\n")
            continue
        print(f"## {title}\n")
        print("decode tokens/s ratios; `vs default` = the method over `hybrid/goodput` (today's default) on the same "
              "prompts; identical = greedy output equal to plain decoding.\n")
        print("| category | prompts | method | vs plain | vs default | α | identical |")
        print("|---|---:|---|---:|---:|---:|---:|")
        for (category, _), stats in summarize(rows).items():
            d = stats.get(DEFAULT, {}).get("tokens_per_s")
            for m in METHODS:
                s = stats.get(m)
                if not s:
                    continue
                print(f"| {category} | {s['prompts']} | {m} | {fmt(s.get('speedup'), '.2f', 'x')} | "
                      f"{fmt(s['tokens_per_s'] / d if d else None, '.2f', 'x')} | {fmt(s['alpha'], '.3f')} | "
                      f"{fmt(100 * s['identical'], '.0f', '%')} |")
        print()
        steps = step_table(rows)
        if steps:
            print("### Speedup over plain per session step (all agentic categories, mean of the per-category "
                  "ratios)\n")
            print("| step | " + " | ".join(METHODS) + " |\n|---:|" + "---:|" * len(METHODS))
            by_step: dict[int, dict[str, list[float]]] = {}
            for per_cat in steps.values():
                for step, per in per_cat.items():
                    for m in METHODS:
                        if m in per and per[m]["speedup"] is not None:
                            by_step.setdefault(step, {}).setdefault(m, []).append(per[m]["speedup"])
            for step in sorted(by_step):
                cells = [fmt(sum(v) / len(v), ".2f", "x") if (v := by_step[step].get(m)) else "—" for m in METHODS]
                print(f"| {step} | " + " | ".join(cells) + " |")
            print()
    tree = folder / "tree_cost.json"
    if tree.exists():
        t = json.loads(tree.read_text())
        print("## The global tree's cost\n")
        print("| cached tokens | bytes / cached token | lookup ms / step | update ms / step | commit ms / token "
              "| suffix ms / step | target ms / step | share of a target step |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        print(f"| {t['cached_tokens']} | {t['bytes_per_cached_token']} | {t['lookup_ms_per_step']} | "
              f"{t['update_ms_per_step']} | {t['commit_ms_per_token']} | {t['suffix_ms_per_step']} | "
              f"{t.get('target_ms_per_step', '—')} | {fmt(100 * t['suffix_share_of_target_step'], '.2f', '%') if 'suffix_share_of_target_step' in t else '—'} |")
        print()
    print("Targets (issue 37): agentic requests after the first few >= 2.5x plain and >= 1.3x the default; code "
          "edits no worse than the default; novel prompts >= 0.97x the default; tree cost <= 2 % of a target step "
          "at 100k cached tokens; every output identical to plain decoding.")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/results/suffix"))
