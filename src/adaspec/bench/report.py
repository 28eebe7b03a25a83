"""``adaspec map``: boundary maps (PNG) and the report (Markdown, optional HTML) from a results file.

For each hardware setting (target, dtype, threads, backend, batch) in the results (:mod:`adaspec.bench.analysis`
does 1 and 3, :mod:`adaspec.bench.maps` 2, this module writes the report):

1. fit the cost model to the setting's micro-measurements (:func:`adaspec.bench.predict.fit_cost_model`) and score
   its prediction of every measured point (median relative error of the decode speedup);
2. draw the maps: speedup over α × K and over context × K (the predicted surface, measured points on top, the
   speedup = 1 contour as the boundary), speedup vs α per K (measured points over predicted lines), the time split
   per step, and the verify-cost curve;
3. state the boundaries: the minimum α at which speculation pays for each K, the best K per context bucket, the
   context beyond which it stops paying, the memory cost of the draft; and compare them with the published rules
   of thumb.

Settings measured at batch sizes > 1 get the batch section instead (:mod:`adaspec.bench.batchmap`: speedup vs
batch size, throughput vs latency, the turning point); the cost model above is a batch-1 model.
"""

from __future__ import annotations

import html as html_lib
import math
import re
import statistics
from pathlib import Path

from adaspec.bench.analysis import (RULES, SettingAnalysis, analyse, findings, point_label,  # noqa: F401 (re-exported)
                                    tree_label, tree_rows)
from adaspec.bench.maps import draw_maps
from adaspec.bench.results import read_results
from adaspec.errors import AdaspecError


def _tree_table(points: list[dict]) -> list[str]:
    """Trees against chains (empty when no point verified trees)."""
    pairs = tree_rows(points)
    if not pairs:
        return []
    lines = ["### Trees against chains", "",
             "Each tree point beside the chain of the same drafter, K (the tree's depth), prompt and context. τ = "
             "tokens per speculation step; nodes = draft tokens verified per speculation step; accepted per node = "
             "accepted draft tokens / nodes verified.", "",
             "| drafter | controller | K | prompt | context | T | method | speedup | τ | nodes per step | "
             "accepted per node | tree steps / speculation steps | identical to plain | tree vs chain |",
             "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|---:|"]
    for pair in sorted(pairs, key=lambda q: (q["tree"]["drafter"], q["tree"]["k"], q["tree"]["context"],
                                             q["tree"].get("prompt_index", 0), q["tree"]["tree"])):
        t, c = pair["tree"], pair["chain"]
        for label, p in (("chain", c), (tree_label(t).strip(), t)):
            if p is None:
                continue
            vs = (f"{100 * (t['speedup'] / c['speedup'] - 1):+.1f} %" if p is t and c and c["speedup"] else "")
            fallback = f" ({p['tree_fallback']})" if p.get("tree_fallback") else ""
            lines.append(
                f"| {p['drafter']} | {p['controller']} | {p['k']} | {p.get('prompt_index', '')} | "
                f"{p['prompt_tokens']} | {p['temperature']:g} | "
                f"{label}{fallback} | {p['speedup']:.2f} | "
                f"{p['tau']:.2f} | {p['mean_drafted']:.2f} | {p['alpha']:.3f} | "
                f"{p.get('tree_steps', 0)} / {p['speculation_steps']} | "
                f"{'—' if p.get('identical_to_plain') is None else p['identical_to_plain']} | {vs} |")
    return lines + [""]


# Text -----------------------------------------------------------------------------------------------------------
def _fmt_range(r, lo: float = 128, hi: float = 131072) -> str:
    if r is None:
        return "never pays"
    first, last = r
    if first <= lo and last >= hi:
        return "pays at every context up to 128K"
    if first <= lo:
        return f"stops paying beyond ~{_ctx(last)}"
    if last >= hi:
        return f"pays only beyond ~{_ctx(first)}"
    return f"pays between ~{_ctx(first)} and ~{_ctx(last)}"


def _needs(k: int, x: float) -> str:
    """``K = 4 needs α ≥ 0.91``, ``K = 4 never pays (at any α)`` or ``K = 4 pays at any α``."""
    a = _fmt_alpha(x)
    return {"never": f"K = {k} never pays (at any α)", "any": f"K = {k} pays at any α"}.get(a, f"K = {k} needs α ≥ {a}")


def _fmt_alpha(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "never"
    return "any" if x == 0 else f"{x:.2f}"


def _gib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB" if b >= 2**28 else f"{b / 2**20:.0f} MiB"


def _ctx(x: float) -> str:
    if math.isinf(x):
        return "none up to 128K"
    if x == 0:
        return "never pays"
    return f"{x / 1024:.1f}K" if x >= 1024 else f"{x:.0f}"


def markdown(analyses: list[SettingAnalysis], figures: dict[str, dict[str, Path]], *, base: Path,
             commands: list[str], machine: dict | None, title: str, notes: str | None = None,
             batch_sections: list[str] | None = None) -> str:
    """The report (see the module docstring); image links are relative to ``base`` (the report's folder).
    ``notes`` (Markdown written by a person: what the numbers mean across settings) goes after the overview."""
    lines = [f"# {title}", ""]
    if machine:
        extra = ", ".join(x for x in (machine.get("cpu_flags"), machine.get("torch_cpu_capability") and
                                      f"PyTorch CPU kernels: {machine['torch_cpu_capability']}") if x)
        lines += [f"Machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores"
                  f"{f' ({extra})' if extra else ''}, {machine.get('memory_bytes', 0) / 2**30:.0f} GiB RAM, "
                  f"PyTorch {machine.get('torch', '?')}"
                  + (f", llama-cpp-python {machine['llama_cpp_python']}" if machine.get("llama_cpp_python") else "")
                  + ".", ""]
    if commands:
        lines += ["Produced by:", "", "```bash", *commands, "```", ""]
    lines += ["Speedups are **decode-phase** speedups (plain TPOT / speculative TPOT, same prompt, same settings, "
              "interleaved plain runs); end-to-end speedups including the cold prefill of both models are listed "
              "per real drafter. α is the per-position acceptance (accepted / (accepted + rejections), the α of "
              "Leviathan et al.); the engine's accepted/drafted ratio is listed as α_draft.", ""]
    if analyses:
        lines += _overview(analyses)
    if notes:
        lines += [notes.strip(), ""]
    lines += batch_sections or []
    for a in analyses:
        f = findings(a)
        figs = figures.get(a.slug, {})
        lines += [f"## {a.label}", ""]
        lines += _summary(a, f)
        lines += _rules(a, f)
        for name, caption in (("alpha_k", "Speedup over α × K"), ("alpha_curves", "Speedup vs α per K"),
                              ("context_k", "Speedup over context × K"), ("time_split", "Time per step"),
                              ("verify_cost", "Verification cost")):
            if name in figs:
                lines += [f"![{caption}]({_rel(figs[name], base)})", ""]
        lines += _tables(a, f)
    return "\n".join(lines).rstrip() + "\n"


def _overview(analyses: list[SettingAnalysis]) -> list[str]:
    """One row per setting: what a step costs, what speculation can gain, and the fastest measured configuration."""
    lines = ["## Overview", "",
             "| setting | plain ms/token | verify(5) / step | draft token / step | best K at α_ref (predicted) | "
             "best measured real drafter | fastest measured tokens/s (decode) |",
             "|---|---:|---:|---:|---|---|---|"]
    for a in analyses:
        f = findings(a)
        k, s = a.model.best_k(a.reference_alpha, a.map_context + 16, a.draft_cost, a.k_range)
        real = [p for p in a.points if p["drafter"] != "calibrated"]
        best_real = max(real, key=lambda p: p["speedup"], default=None)
        plain_tps = statistics.median(p["decode_tokens_per_s"] for p in a.plains) if a.plains else math.nan
        fastest = max(a.points, key=lambda p: p["decode_tokens_per_s"], default=None)
        fast = (f"{fastest['decode_tokens_per_s']:.2f} ({point_label(fastest)}; plain {plain_tps:.2f})"
                if fastest and fastest["decode_tokens_per_s"] > plain_tps else f"{plain_tps:.2f} (plain decoding)")
        lines.append(
            f"| {a.short} | {f['plain_ms']:.0f} | "
            f"{f['verify_ratio'][5]:.2f}× | {f['cost_ratio']:.2f} | "
            + (f"K = {k}: {s:.2f}× (α = {a.reference_alpha:.2f})" if k else
               f"none: plain decoding (α = {a.reference_alpha:.2f})")
            + " | " + (f"{point_label(best_real)}: {best_real['speedup']:.2f}×, α {best_real['alpha_l']:.2f}"
                       if best_real else "—")
            + f" | {fast} |")
    return lines + [""]


def _rel(path: Path, base: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path)


def _summary(a: SettingAnalysis, f: dict) -> list[str]:
    m = a.model
    ks = [k for k in (1, 2, 3, 4, 6, 8) if k in f["min_alpha"]]
    best = f["best_k"]
    lines = ["### Findings", "",
             f"- **A plain step** (one target forward at context ~{a.map_context}) costs {f['plain_ms']:.0f} ms; "
             f"verifying K + 1 tokens costs " + ", ".join(f"{r:.2f}× (n = {n})" for n, r in f["verify_ratio"].items())
             + " a plain step; one draft token costs "
             + (f"{m.draft_ms(a.draft_cost, a.map_context):.0f} ms = {f['cost_ratio']:.2f} plain steps "
                f"({a.draft_label})." if a.draft_cost is not None else "nothing (n-gram)."),
             "- **Minimum α at which speculation pays** (context ~" f"{a.map_context}, draft "
             f"{f['cal_cost_ms']:.0f} ms/token = {f['cal_cost_ratio']:.2f} steps): "
             + ", ".join(f"K = {k}: {_fmt_alpha(f['min_alpha'][k])}" for k in ks) + ".",
             f"- **Best K per context** at α = {a.reference_alpha:.2f} ({a.reference_alpha_source}), "
             f"{a.draft_label}: "
             + "; ".join(f"{name}: K = {k} ({s:.2f}×)" if k else f"{name}: do not speculate"
                         for name, (_, k, s) in best.items()) + ".",
             f"- **Context range where speculation pays** at α = {a.reference_alpha:.2f}: "
             + ", ".join(f"K = {k}: {_fmt_range(x)}" for k, x in f["break_even"].items())
             + f" (measured up to {f['max_measured_context']} tokens; beyond that the fitted lines are "
               "extrapolated).",
             ]
    mem = f["memory"]
    for name, d in (mem.get("drafts") or {}).items():
        if d.get("param_bytes"):
            ratio = d["param_bytes"] / mem["target_param_bytes"] if mem.get("target_param_bytes") else math.nan
            rss = max((p["rss_bytes"] for p in a.points if p.get("rss_bytes")), default=0)
            lines.append(f"- **Memory cost of the draft** {name}: {_gib(d['param_bytes'])} of weights "
                         f"({ratio:.2f}× the target's {_gib(mem['target_param_bytes'])}) plus "
                         f"{d['kv_bytes_per_token'] / 1024:.0f} KiB of KV cache per token of context (target: "
                         f"{mem['target_kv_bytes_per_token'] / 1024:.0f} KiB)"
                         + (f"; the process held {_gib(rss)} resident with both models loaded." if rss else "."))
    err = a.median_error
    lines.append(f"- **Cost-model accuracy**: median relative error of the predicted decode speedup "
                 f"{100 * err:.1f}% over {len(a.errors)} measured points (aim: ≤ 10%)." if a.errors else
                 "- **Cost-model accuracy**: no measured points to compare with.")
    return lines + [""]


def _rules(a: SettingAnalysis, f: dict) -> list[str]:
    """Compare with the published rules of thumb and say why this hardware differs."""
    k4 = f["min_alpha"].get(4, math.nan)
    c = f["cal_cost_ratio"]
    r5 = f["verify_ratio"].get(5, math.nan)
    lines = ["### Against the rules of thumb", "",
             "| rule of thumb | here | why |", "|---|---|---|"]
    pays = "agrees" if not math.isnan(k4) and k4 <= RULES["alpha_pays"] + 0.05 else "differs"
    per_token = (a.model.verify_ms(9, a.map_context) - a.model.verify_ms(1, a.map_context)) / 8
    bound = (f": each extra verified token adds {per_token:.0f} ms, i.e. the target's forward is compute-bound "
             "here, not memory-bound as on a GPU" if r5 > 1.5 else "")
    lines.append(f"| pays above ~70% acceptance | {_needs(4, k4)} ({pays}) | "
                 f"a draft token costs {c:.2f} target steps here (the rule assumes ~0.05–0.1) and verifying 5 "
                 f"tokens costs {r5:.2f}× a step (the rule assumes ~1×){bound} |")
    k1 = f["min_alpha"].get(1, math.nan)
    lose = "agrees" if math.isnan(k1) or k1 >= RULES["alpha_loses"] else "differs"
    lines.append(f"| loses below ~40% | the cheapest setting: {_needs(1, k1)} ({lose}) | "
                 "below the minimum α every K loses: rejected drafts cost draft time and a wider verify |")
    for name, (mid, k, s) in f["best_k"].items():
        lo, hi = RULES["k"][name]
        verdict = "agrees" if lo <= k <= hi else ("plain decoding wins" if k == 0 else
                                                  "shorter" if k < lo else "longer")
        extra = _extra_token_cost(a, mid)
        why = ("no K reaches speedup 1 at this α: drafting and the wider verify cost more than the accepted "
               "tokens save" if k == 0 else
               f"one more draft token costs ≈ {extra:.2f} target steps here (drafting + wider verify), so long "
               "drafts lose once a rejection becomes likely" if k < lo else
               f"one more draft token costs only ≈ {extra:.2f} target steps, so at this α longer drafts still pay"
               if k > hi else "")
        lines.append(f"| K {lo}–{hi} {name} | K = {k if k else '0 (plain)'} at ~{mid / 1024:.1f}K, "
                     f"α = {a.reference_alpha:.2f} ({verdict}) | {why} |")
    mem = f["memory"]
    for name, d in (mem.get("drafts") or {}).items():
        if d.get("param_bytes") and mem.get("target_param_bytes"):
            ratio = d["param_bytes"] / mem["target_param_bytes"]
            lines.append(f"| draft 1/10–1/20 of the target | {name}: 1/{1 / ratio:.1f} of the target's bytes "
                         f"({'agrees' if 1 / 20 <= ratio <= 1 / 10 else 'differs'}) | a one-token decode step on "
                         "a CPU is bound by reading the weights, so a draft's cost tracks its bytes: this "
                         f"1/{1 / ratio:.1f}-size draft costs {c:.2f} of a target step here and needs a much higher "
                         "α than a 1/20 draft (~0.05 of a step) would |")
    return lines + [""]


def _extra_token_cost(a: SettingAnalysis, context: float) -> float:
    """Cost of lengthening a draft by one token, in plain steps: one draft token plus the verify's growth per
    token (averaged over n = 1..9)."""
    m = a.model
    per_token = (m.verify_ms(9, context) - m.verify_ms(1, context)) / 8
    return (m.draft_ms(a.draft_cost, context) + per_token) / m.plain_step_ms(context)


def _tables(a: SettingAnalysis, f: dict) -> list[str]:
    lines = ["### Measured points", "",
             "| sweep | drafter | controller | K | context | T | α | α_draft | τ | speedup | predicted | "
             "e2e speedup | TTFT ms | TPOT ms | tok/s | CPU s/tok | energy |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for p in sorted(a.points, key=lambda p: (p["sweep"], p["drafter"], p.get("alpha_dial") or 0, p["k"],
                                             p["context"], p["temperature"], p["controller"], p.get("tree", 0))):
        name = (p["drafter"] + tree_label(p)) if p["drafter"] != "calibrated" else f"calibrated α={p['alpha_dial']:g}"
        energy = f"{p['energy_j_per_token']:.2f} J/tok" if p.get("energy_j_per_token") is not None else "n/m"
        lines.append(
            f"| {p['sweep']} | {name} | {p['controller']} | {p['k']} | {p['prompt_tokens']} | {p['temperature']:g} | "
            f"{p['alpha_l']:.2f} | {p['alpha']:.2f} | {p['tau']:.2f} | {p['speedup']:.2f} | "
            f"{p['predicted_speedup']:.2f} | {p['speedup_e2e']:.2f} | {p['ttft_ms']:.0f} | {p['tpot_ms']:.0f} | "
            f"{p['tokens_per_s']:.2f} | {p['cpu_s_per_token']:.2f} | {energy} |")
    sources = {p.get("energy_source") for p in a.points if p.get("energy_source")}
    lines += ["", "Energy: " + "; ".join(sorted(sources)) + ". CPU s/tok is process CPU time per generated token, "
              "an energy proxy (not joules)." if sources else "", ""]
    shares = [p["other_cpu"] for p in a.points if p.get("other_cpu") is not None]
    if shares:
        loaded = sum(1 for x in shares if x > 0.1)
        lines += [f"Other processes used a median {100 * statistics.median(shares):.0f}% (max "
                  f"{100 * max(shares):.0f}%) of the machine's CPU while the points ran"
                  + (f"; {loaded} of {len(shares)} points ran while they used more than 10%, which slows and "
                     "blurs those measurements." if loaded else "."), ""]
    bad = [p for p in a.points if p["drafter"] == "calibrated" and p.get("offpath_positions")]
    if bad:
        lines += [f"{len(bad)} calibrated point(s) left the greedy reference path (a bf16 near-tie flipped between a "
                  "one-token and a batched forward); their α is the measured one, below the dial.", ""]
    return lines + _tree_table(a.points)


def to_html(md: str, title: str) -> str:
    """A small Markdown → HTML conversion covering what :func:`markdown` writes (headings, tables, lists,
    images, code blocks, **bold**, `code`)."""
    out, in_table, in_list, in_code = [], False, False, False

    def inline(text: str) -> str:
        text = html_lib.escape(text)
        text = re.sub(r"!\[([^\]]*)\]\(([^)]+)\)", r'<img alt="\1" src="\2" style="max-width:100%">', text)
        text = re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", text)
        return re.sub(r"`([^`]+)`", r"<code>\1</code>", text)

    for line in md.splitlines():
        if line.startswith("```"):
            out.append("</pre>" if in_code else "<pre>")
            in_code = not in_code
            continue
        if in_code:
            out.append(html_lib.escape(line))
            continue
        if in_table and not line.startswith("|"):
            out.append("</table>")
            in_table = False
        if in_list and not line.startswith("- "):
            out.append("</ul>")
            in_list = False
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if all(re.fullmatch(r":?-+:?", c) for c in cells):
                continue
            tag = "th" if not in_table else "td"
            if not in_table:
                out.append("<table border=1 cellspacing=0 cellpadding=3>")
                in_table = True
            out.append("<tr>" + "".join(f"<{tag}>{inline(c)}</{tag}>" for c in cells) + "</tr>")
        elif line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{inline(line[level:].strip())}</h{level}>")
        elif line.startswith("- "):
            if not in_list:
                out.append("<ul>")
                in_list = True
            out.append(f"<li>{inline(line[2:])}</li>")
        elif line.strip():
            out.append(f"<p>{inline(line)}</p>")
    if in_table:
        out.append("</table>")
    if in_list:
        out.append("</ul>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html_lib.escape(title)}</title></head>"
            "<body style='font-family:sans-serif;max-width:1000px;margin:auto'>\n" + "\n".join(out) + "\n</body></html>\n")


def make_report(results: list[Path], report: Path, *, img_dir: Path | None = None, html: Path | None = None,
                title: str = "Where speculative decoding pays on this machine", map_command: str | None = None,
                commands: list[str] | None = None, prefix: str = "boundary", notes: Path | None = None) -> dict:
    """Read results files, draw the maps and write the report. Returns ``{"report", "figures", "analyses"}``.

    The report's "Produced by" block lists ``commands`` when given, else the ``adaspec bench`` command lines
    recorded in the results, then ``map_command``. ``notes``: a Markdown file placed after the overview.

    Raises:
        AdaspecError: when the results hold neither a setting with micro-measurements nor a batch axis, or
            ``notes`` is not a file.
    """
    rows: list[dict] = []
    for path in results:
        rows += read_results(Path(path))
    from adaspec.bench.batchmap import analyse_batches, batch_markdown, draw_batch_maps

    analyses = analyse(rows)
    families = analyse_batches(rows)
    if not analyses and not families:
        raise AdaspecError(f"no micro-measurements in {', '.join(map(str, results))}: run `adaspec bench` first")
    report = Path(report)
    img_dir = Path(img_dir) if img_dir else report.parent / "img"
    figures = {a.slug: draw_maps(a, img_dir, prefix) for a in analyses}
    batch_sections: list[str] = []
    for fam in families:
        figs = draw_batch_maps(fam, img_dir, prefix)
        figures[f"batch-{fam.slug}"] = figs
        batch_sections += batch_markdown(fam, figs, lambda path: _rel(path, report.parent))
    metas = [r for r in rows if r.get("kind") == "meta"]
    commands = list(commands) if commands else list(dict.fromkeys(" ".join(m["argv"]) for m in metas
                                                                  if m.get("argv")))
    if map_command:
        commands.append(map_command)
    machine = metas[-1]["machine"] if metas else None
    if notes is not None and not Path(notes).is_file():
        raise AdaspecError(f"notes file not found: {notes}")
    md = markdown(analyses, figures, base=report.parent, commands=commands, machine=machine, title=title,
                  notes=Path(notes).read_text(encoding="utf-8") if notes else None, batch_sections=batch_sections)
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(md, encoding="utf-8")
    if html:
        Path(html).write_text(to_html(md, title), encoding="utf-8")
    return {"report": report, "figures": figures, "analyses": analyses}
