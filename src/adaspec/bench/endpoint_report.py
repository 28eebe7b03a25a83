"""The report of ``adaspec bench --endpoint`` results: tables, speedup vs load, throughput–latency curves and
acceptance per draft position (``adaspec map results.jsonl`` routes endpoint results here).

Speedup at a load level is the speculative arm's output throughput over the baseline arm's at the same level and
round, the median over rounds; the decode speedup uses the per-request decode rates instead (what ``adaspec
compare`` reports). A row without acceptance data is labelled with the reason (a server without ``/metrics``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from adaspec.bench.plots import pyplot as _plt
from adaspec.bench.plots import save as _save
from adaspec.bench.endpoint import read_rows
from adaspec.errors import AdaspecError


@dataclass
class Level:
    """One load level (``closed`` with a concurrency, or ``open`` with a rate) of one run, both arms' rows."""

    load: str
    level: float
    rows: dict[str, list[dict]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        if self.load == "closed":
            return f"{self.level:g} client" + ("s" if self.level != 1 else "")
        return f"{self.level:g} req/s"

    @property
    def failures(self) -> int:
        """Failed requests over both arms (a level with failures has no trustworthy speedup)."""
        return sum(r.get("failed", 0) for rs in self.rows.values() for r in rs)

    def median(self, arm: str, getter) -> float | None:
        values = [v for v in (getter(r) for r in self.rows.get(arm, [])) if v is not None]
        return statistics.median(values) if values else None

    def ratio(self, getter) -> float | None:
        """Median over rounds of speculative / baseline (rounds paired by index)."""
        spec, base = self.rows.get("speculative", []), self.rows.get("baseline", [])
        by_round = {r["round"]: r for r in base}
        ratios = [getter(s) / getter(by_round[s["round"]]) for s in spec
                  if s["round"] in by_round and getter(s) and getter(by_round[s["round"]])]
        return statistics.median(ratios) if ratios else None


def _p(name: str, q: str = "p50"):
    return lambda r: (r.get(name) or {}).get(q)


def levels(rows: list[dict]) -> list[Level]:
    """Endpoint rows grouped by (load, level), in order of load then level."""
    out: dict[tuple, Level] = {}
    for r in rows:
        if r.get("kind") != "endpoint":
            continue
        level = r["concurrency"] if r["load"] == "closed" else r["rate"]
        lv = out.setdefault((r["load"], level), Level(r["load"], level))
        lv.rows.setdefault(r["arm"], []).append(r)
    return [out[k] for k in sorted(out, key=lambda k: (k[0] != "closed", k[1]))]


def _f(x: float | None, fmt: str = ".2f", suffix: str = "") -> str:
    return "–" if x is None else f"{x:{fmt}}{suffix}"


def _spec_cell(r: dict) -> tuple[str, str, str]:
    s = r.get("spec") or {}
    if s.get("acceptance_rate") is None:
        return "–", "–", "–"
    label = {"counters": "", "window": " (window)", "responses": " (responses)"}.get(s.get("source"), "")
    return _f(s["acceptance_rate"], ".3f") + label, _f(s.get("mean_acceptance_length")), _f(s.get("mean_draft_length"))


def markdown(rows: list[dict], figures: dict[str, Path], rel, title: str, commands: list[str]) -> str:
    """The report text (``rel`` maps a figure path to the link written in the report)."""
    lvls = levels(rows)
    metas = [r for r in rows if r.get("kind") == "meta"]
    ep = [r for r in rows if r.get("kind") == "endpoint"]
    arms = {r["arm"]: (r["url"], r.get("body") or {}, r.get("model")) for r in ep}
    lines = [f"# {title}", "", "Measured with `adaspec bench --endpoint` from the client side (streamed responses; "
             "times are what a user of the endpoint sees).", ""]
    for name, (url, body, model) in arms.items():
        lines.append(f"- **{name}**: `{url}`, model `{model}`" + (f", request fields `{body}`" if body else ""))
    if metas:
        c = metas[-1]["config"]
        lines += ["", f"Workload `{c['workload']}` ({c['prompts']} prompts), `{c['api']}` API, max_tokens "
                      f"{c['max_tokens']}, temperature {c['temperature']}, {c['rounds']} round(s)."]
    if commands:
        lines += ["", "Produced by:", "", "```bash", *commands, "```"]
    lines += ["", "## Speculation on vs off", "",
              "| load | throughput speedup | decode speedup | TPOT p50 ratio | TTFT p50 ratio | α (spec.) |",
              "|---|---:|---:|---:|---:|---|"]
    for lv in lvls:
        spec_rows = lv.rows.get("speculative", [])
        alpha = _spec_cell(spec_rows[-1])[0] if spec_rows else "–"
        label = lv.label + (f" ({lv.failures} failed requests)" if lv.failures else "")
        lines.append(f"| {label} | {_f(lv.ratio(lambda r: r.get('throughput_tok_s')), '.2f', '×')} | "
                     f"{_f(lv.ratio(lambda r: r.get('decode_tok_s')), '.2f', '×')} | "
                     f"{_f(lv.ratio(_p('tpot_ms')), '.2f')} | {_f(lv.ratio(_p('ttft_ms')), '.2f')} | {alpha} |")
    lines += ["", "## Every configuration", "",
              "| load | arm | round | ok / failed | tok/s | req/s | decode tok/s | TTFT p50 / p95 ms | "
              "TPOT p50 / p95 ms | ITL p50 ms | e2e p95 ms | α | τ | K̄ | goodput req/s |",
              "|---|---|---:|---|---:|---:|---:|---|---|---:|---:|---|---:|---:|---:|"]
    for lv in lvls:
        for arm, rs in lv.rows.items():
            for r in sorted(rs, key=lambda r: r["round"]):
                a, tau, k = _spec_cell(r)
                good = (r.get("goodput") or {}).get("req_s")
                lines.append(
                    f"| {lv.label} | {arm} | {r['round']} | {r['completed']} / {r['failed']} | "
                    f"{_f(r.get('throughput_tok_s'))} | {_f(r.get('request_rate'), '.3f')} | "
                    f"{_f(r.get('decode_tok_s'))} | "
                    f"{_f(_p('ttft_ms')(r), '.0f')} / {_f(_p('ttft_ms', 'p95')(r), '.0f')}"
                    f" | {_f(_p('tpot_ms')(r), '.1f')} / {_f(_p('tpot_ms', 'p95')(r), '.1f')} | "
                    f"{_f(_p('itl_ms')(r), '.1f')} | {_f(_p('e2e_ms', 'p95')(r), '.0f')} | {a} | {tau} | {k} | "
                    f"{_f(good, '.3f')} |")
    notes = sorted({f"{r['arm']}: {r['spec']['note']}" for r in ep if (r.get("spec") or {}).get("note")})
    if notes:
        lines += ["", "Acceptance data:", ""] + [f"- {n}" for n in notes]
    failed = [r for r in ep if r.get("errors")]
    if failed:
        lines += ["", "Failed requests: " + "; ".join(f"{r['arm']} {r.get('concurrency') or r.get('rate')}: "
                                                    f"{', '.join(f'{k} ×{v}' for k, v in r['errors'].items())}"
                                                    for r in failed)]
    if figures:
        lines += ["", "## Figures", ""] + [f"![{name}]({rel(p)})" for name, p in figures.items()]
    lines += ["", "Tokens are the servers' `usage.completion_tokens` where they report it, else content chunks "
                  "(`tokens_counted` in the rows). α = accepted / drafted tokens, τ = 1 + accepted / speculation "
                  "steps, K̄ = drafted tokens / steps, from the difference of the `/metrics` counters before and "
                  "after each configuration (SGLang: its gauges' latest window; llama-server: each response's "
                  "timings)."]
    return "\n".join(lines) + "\n"


def draw(rows: list[dict], img_dir: Path, prefix: str = "endpoint") -> dict[str, Path]:
    """Speedup vs load, throughput vs TPOT per arm, and acceptance per draft position (when known)."""

    plt = _plt()
    lvls = levels(rows)
    figs: dict[str, Path] = {}
    for load in ("closed", "open"):
        these = [lv for lv in lvls if lv.load == load]
        pairs = [(lv.level, lv.ratio(lambda r: r.get("throughput_tok_s"))) for lv in these]
        pairs = [(x, y) for x, y in pairs if y is not None]
        if not pairs:
            continue
        fig, ax = plt.subplots(figsize=(5.6, 3.4))
        ax.plot([x for x, _ in pairs], [y for _, y in pairs], "o-", color="tab:blue", label="throughput")
        dec = [(lv.level, lv.ratio(lambda r: r.get("decode_tok_s"))) for lv in these]
        dec = [(x, y) for x, y in dec if y is not None]
        if dec:
            ax.plot([x for x, _ in dec], [y for _, y in dec], "s--", color="tab:green", label="decode rate")
        ax.axhline(1.0, color="grey", lw=0.8)
        if load == "closed" and len(pairs) > 1:
            ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients" if load == "closed" else "arrival rate (req/s)")
        ax.set_ylabel("speculation on / off")
        ax.set_title("Speedup vs load (measured)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        figs[f"speedup-{load}"] = _save(fig, img_dir / f"{prefix}-speedup-{load}.png")
    fig, ax = plt.subplots(figsize=(5.6, 3.6))
    drawn = False
    for arm, colour in (("speculative", "tab:red"), ("baseline", "tab:grey")):
        pts = [(lv.median(arm, lambda r: r.get("throughput_tok_s")), lv.median(arm, _p("tpot_ms")), lv.label)
               for lv in lvls]
        pts = [p for p in pts if p[0] is not None and p[1] is not None]
        if pts:
            drawn = True
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=colour, label=arm)
            for x, y, label in pts:
                ax.annotate(label, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    if drawn:
        ax.set_xlabel("output throughput (tokens/s)")
        ax.set_ylabel("TPOT p50 (ms)")
        ax.set_title("Throughput–latency (measured)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        figs["throughput-latency"] = _save(fig, img_dir / f"{prefix}-throughput-latency.png")
    else:
        plt.close(fig)
    per_pos = [(lv.label, r["spec"]["acceptance_per_pos"]) for lv in lvls for r in lv.rows.get("speculative", [])[-1:]
               if (r.get("spec") or {}).get("acceptance_per_pos")]
    if per_pos:
        fig, ax = plt.subplots(figsize=(5.6, 3.4))
        width = 0.8 / len(per_pos)
        for i, (label, acc) in enumerate(per_pos):
            ax.bar([p + i * width for p in range(len(acc))], acc, width=width, label=label)
        ax.set_xlabel("draft position (0 = first)")
        ax.set_ylabel("accepted / speculation steps")
        ax.set_title("Acceptance per draft position (server counters)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, axis="y")
        figs["acceptance-per-position"] = _save(fig, img_dir / f"{prefix}-acceptance-per-position.png")
    return figs


def make_endpoint_report(results: list[Path], report: Path, *, img_dir: Path | None = None,
                         html: Path | None = None, title: str = "Speculative decoding on a serving endpoint",
                         commands: list[str] | None = None) -> dict:
    """Read endpoint results files, draw the figures and write the report; returns ``{"report", "figures"}``.

    Raises:
        AdaspecError: the files hold no endpoint rows.
    """
    from adaspec.bench.report import _rel, to_html

    rows = read_rows(results)
    if not any(r.get("kind") == "endpoint" for r in rows):
        raise AdaspecError(f"no endpoint results in {', '.join(map(str, results))}: run adaspec bench --endpoint")
    report = Path(report)
    img_dir = Path(img_dir) if img_dir else report.parent / "img"
    figures = draw(rows, img_dir, prefix=report.stem)
    metas = [r for r in rows if r.get("kind") == "meta"]
    commands = list(commands) if commands else list(dict.fromkeys(" ".join(m["argv"]) for m in metas
                                                                  if m.get("argv")))
    md = markdown(rows, figures, lambda p: _rel(p, report.parent), title, commands)
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(md, encoding="utf-8")
    if html:
        Path(html).write_text(to_html(md, title), encoding="utf-8")
    return {"report": report, "figures": figures}
