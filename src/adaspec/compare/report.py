"""``adaspec compare``'s Markdown report: the target check, one table per (category, temperature), speedup per
session step, and the peers that failed or differed."""

from __future__ import annotations

from adaspec.compare.methods import DEFAULT_METHOD
from adaspec.compare.summary import oracle, step_table, summarize, target_check
from adaspec.peers import report as peer_report


def _step_lines(rows: list[dict]) -> list[str]:
    lines = []
    for (category, temp), steps in step_table(rows).items():
        methods = sorted({m for per in steps.values() for m in per if m != "plain"})
        lines += [f"### {category}, temperature {temp:g}: speedup over plain per session step (α)", "",
                  "| step | " + " | ".join(methods) + " |", "|---:|" + "---:|" * len(methods)]
        for step, per in steps.items():
            cells = [f"{_fmt(per[m]['speedup'], '.2f', 'x')} ({_fmt(per[m]['alpha'], '.2f')})" if m in per else "—"
                     for m in methods]
            lines.append(f"| {step} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def _fmt(x, spec: str = ".2f", suffix: str = "") -> str:
    return "—" if x is None or x != x else f"{x:{spec}}{suffix}"


def markdown_report(rows: list[dict], default_method: str = DEFAULT_METHOD) -> str:
    """The summary as Markdown: the target check (when the default method ran), then one table per (category,
    temperature) with every method, the oracle marked."""
    lines = []
    check = target_check(rows, default_method)
    if any(c["default"] is not None for c in check):
        lines += [f"## Target check: `{default_method}` against the oracle, plain decoding and transformers", "",
                  "tokens/s (decoding, after the prefills and the first step, when the rows time it; speedup for "
                  "the Spec-Bench average rows). Oracle = best fixed K in hindsight per category; transformers = "
                  "best assisted-generation peer (prompt lookup `hf:pld` is listed in the tables, not here).", "",
                  "| category | T | plain | oracle | oracle tok/s | default tok/s | default / oracle | default / plain "
                  "| transformers | its tok/s | default / transformers | identical |",
                  "|---|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---:|"]
        for c in check:
            ident = "n/a" if c["temperature"] > 0 or c["identical"] is None else _fmt(100 * c["identical"], ".0f", "%")
            lines.append(f"| {c['category']} | {c['temperature']:g} | {_fmt(c['plain'])} | {c['oracle'] or '—'} | "
                         f"{_fmt(c['oracle_tps'])} | {_fmt(c['default'])} | {_fmt(c['vs_oracle'], '.3f')} | "
                         f"{_fmt(c['vs_plain'], '.3f')} | {c['hf'] or '—'} | {_fmt(c['hf_tps'])} | "
                         f"{_fmt(c['vs_hf'], '.3f')} | {ident} |")
        lines.append("")
    for (category, temp), stats in summarize(rows).items():
        n = max((s["prompts"] for s in stats.values()), default=0)
        best_fixed = oracle(stats)
        unit = "decode tokens/s" if all(s["decode"] for s in stats.values()) else "tokens/s"
        lines += [f"### {category}, temperature {temp:g} ({n} prompts)", "",
                  f"| method | {unit} | speedup | α | τ | identical to plain "
                  "| time: prefill / draft / verify / other |", "|---|---:|---:|---:|---:|---:|---|"]
        for m, s in sorted(stats.items(), key=lambda kv: -kv[1]["tokens_per_s"]):
            shares = [s[f"{p}_share"] for p in ("prefill", "draft", "verify", "other")]
            split = "n/a" if None in shares else " / ".join(f"{100 * x:.0f}%" for x in shares)
            ident = "n/a" if s["identical"] != s["identical"] or temp > 0 else f"{100 * s['identical']:.0f}%"
            lines.append(f"| {m} | {s['tokens_per_s']:.2f} | {s.get('speedup', float('nan')):.2f}x | "
                         f"{_fmt(s['alpha'], '.3f')} | {_fmt(s['tau'])} | {ident} | {split} |")
        for m, status in peer_report.failed_in(rows, category, temp).items():
            lines.append(f"| {m} | {status} (see below) | — | — | — | — | — |")
        if best_fixed:
            lines += ["", f"Oracle (best fixed K in hindsight): {best_fixed}, "
                          f"{stats[best_fixed]['tokens_per_s']:.2f} tokens/s."]
        lines.append("")
    lines += _step_lines(rows)
    lines += peer_report.peer_lines(rows)
    return "\n".join(lines)
