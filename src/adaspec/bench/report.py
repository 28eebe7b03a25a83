"""``adaspec map``: boundary maps (PNG) and the report (Markdown, optional HTML) from a results file.

For each hardware setting (target, dtype, threads, backend, batch) in the results:

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
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from adaspec.bench.plots import pyplot as _plt
from adaspec.bench.plots import save as _save
from adaspec.bench.costmodel import FittedCostModel, relative_errors
from adaspec.bench.predict import fit_cost_model, predict_point
from adaspec.bench.results import apply_baseline, read_results, tag_runs
from adaspec.errors import AdaspecError

SETTING_KEYS = ("target", "dtype", "threads", "backend", "batch")
BUCKETS = [("under 2K", 256, 2048), ("2K–8K", 2048, 8192), ("beyond 8K", 8192, 32768)]
RULES = {"alpha_pays": 0.7, "alpha_loses": 0.4, "k": {"under 2K": (4, 8), "2K–8K": (3, 5), "beyond 8K": (2, 3)},
         "size_ratio": (1 / 20, 1 / 10)}


@dataclass
class SettingAnalysis:
    """Everything the report says about one hardware setting."""

    setting: dict
    model: FittedCostModel
    points: list[dict]
    plains: list[dict]
    micro: list[dict]
    memory: dict | None
    errors: list[float] = field(default_factory=list)
    reference_alpha: float = 0.8
    reference_alpha_source: str = "a typical value"
    draft_cost: object = None  # what FittedCostModel.draft_ms takes for the maps' drafter
    draft_label: str = ""
    map_context: int = 256
    context_alpha: float = 0.8

    @property
    def label(self) -> str:
        s = self.setting
        return f"{s['target']}, {s['dtype']}, {_threads(s['threads'])}, {s['backend']}"

    @property
    def short(self) -> str:
        """``bfloat16, 2 threads`` (PyTorch) or ``llama.cpp GGUF, 2 threads`` / ``ik_llama.cpp GGUF, ...``, for titles
        and the overview."""
        from adaspec.backends.select import RUNTIME_LABELS

        s = self.setting
        kind = s["dtype"] if s["backend"] == "torch" else f"{RUNTIME_LABELS.get(s['backend'], s['backend'])} GGUF"
        return f"{kind}, {_threads(s['threads'])}"

    @property
    def slug(self) -> str:
        s = self.setting
        return f"{s['dtype']}-t{s['threads']}-{s['backend']}"

    @property
    def k_range(self) -> list[int]:
        """Draft lengths whose verify width was measured."""
        return list(range(1, max(self.model.k_max, 1) + 1))

    @property
    def median_error(self) -> float:
        return statistics.median(self.errors) if self.errors else math.nan


def _threads(n: int) -> str:
    return f"{n} thread{'s' if n != 1 else ''}"


def _setting(row: dict) -> tuple:
    return tuple(row.get(k) for k in SETTING_KEYS)


def analyse(rows: list[dict]) -> list[SettingAnalysis]:
    """Group records by setting, fit each cost model and choose the maps' operating points."""
    by: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in tag_runs(rows):
        if r.get("kind") in ("point", "plain", "micro", "memory"):
            by[_setting(r)][r["kind"]].append(r)
    out = []
    for key, kinds in by.items():
        if (dict(zip(SETTING_KEYS, key)).get("batch") or 1) > 1:
            continue  # the batch section (adaspec.bench.batchmap)
        micro = kinds["micro"]
        if not any(r.get("role") == "target" and r.get("measure") == "forward" and r["n"] == 1 for r in micro):
            continue  # no cost model without plain-step micro-measurements
        model = fit_cost_model(micro, kinds["plain"])
        groups: dict[tuple, list[dict]] = defaultdict(list)
        for p in kinds["plain"]:
            groups[p.get("group"), p.get("run")].append(p)
        for p in kinds["point"]:  # against all of its group's plain runs in the same invocation
            plains = groups.get((p.get("group"), p.get("run")))
            if plains and "decode_ms" in plains[0]:
                apply_baseline(p, plains)
        points = [p for p in kinds["point"] if not _bad(p)]
        a = SettingAnalysis(dict(zip(SETTING_KEYS, key)), model, points, kinds["plain"], micro,
                            kinds["memory"][-1] if kinds["memory"] else None)
        for p in points:
            p["predicted_speedup"] = predict_point(model, p)
        a.errors = relative_errors((p["predicted_speedup"], p["speedup"]) for p in points)
        _choose_operating_points(a)
        out.append(a)
    return sorted(out, key=lambda a: (a.setting["backend"] != "torch", a.setting["dtype"], a.setting["threads"]))


def _bad(p: dict) -> bool:
    return not p.get("tpot_ms") or p.get("speedup") is None or math.isnan(p.get("speedup", math.nan))


def _choose_operating_points(a: SettingAnalysis) -> None:
    """The drafter cost, α and context the maps are drawn at: the real draft model when one was measured (its
    fitted per-token cost, its measured greedy α), else the calibrated points' cost and dials."""
    model_drafts = sorted(a.model.draft)
    real = [p for p in a.points if p["drafter"] in a.model.draft and p["temperature"] == 0
            and p["controller"] == "fixed" and p["speculation_steps"] and not p.get("tree_steps")]
    calibrated = [p for p in a.points if p["drafter"] == "calibrated"]
    if model_drafts:
        a.draft_cost, a.draft_label = model_drafts[0], f"draft model {model_drafts[0]}"
    elif calibrated:
        cost = statistics.median(p["cost_ms"] for p in calibrated)
        a.draft_cost, a.draft_label = cost, f"a drafter costing {cost:.0f} ms/token"
    else:
        a.draft_cost, a.draft_label = None, "n-gram lookup (free drafting)"
    if real:
        acc = sum(p["accepted_tokens"] for p in real)
        trials = acc + sum(p.get("rejections", 0) for p in real)
        a.reference_alpha = (acc + 1) / (trials + 2)  # Laplace: a short run with no rejection is not α = 1
        a.reference_alpha_source = (f"the measured greedy acceptance of {real[0]['drafter']} on "
                                    f"{real[0]['workload']}")
    contexts = sorted({r["context"] for r in a.micro if r.get("measure") == "forward"})
    ak = [p for p in calibrated if p["sweep"] == "alpha-k"] or calibrated
    a.map_context = min((p["context"] for p in ak), default=contexts[0] if contexts else 256)
    ck = [p for p in calibrated if p["sweep"] == "context-k"]
    a.context_alpha = ck[0]["alpha_dial"] if ck else a.reference_alpha


def _map_cost(a: SettingAnalysis, p: dict | None = None):
    """The drafter cost to predict with: a calibrated point's own cost, else the maps' drafter."""
    if p is not None and p["drafter"] == "calibrated":
        return float(p["cost_ms"])
    return a.draft_cost


# Figures --------------------------------------------------------------------------------------------------------
def _norm(values):
    from matplotlib.colors import TwoSlopeNorm

    lo = min(0.5, float(np.nanmin(values)))
    hi = max(1.5, float(np.nanmax(values)))
    return TwoSlopeNorm(vmin=lo, vcenter=1.0, vmax=hi)


def _colour(norm, value: float):
    import matplotlib

    return [matplotlib.colormaps["RdBu"](norm(value))]


def fig_alpha_k(a: SettingAnalysis, path: Path) -> Path:
    plt = _plt()
    cal = [p for p in a.points if p["drafter"] == "calibrated" and p["context"] == a.map_context]
    cost = statistics.median(p["cost_ms"] for p in cal) if cal else a.model.draft_ms(a.draft_cost, a.map_context)
    alphas = np.linspace(0, 1, 101)
    z = np.array([[a.model.speedup(al, k, a.map_context + 16, cost) for al in alphas] for k in a.k_range])
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    norm = _norm(np.concatenate([z.ravel(), [p["speedup"] for p in cal]]))
    mesh = ax.pcolormesh(alphas, a.k_range, z, cmap="RdBu", norm=norm, shading="nearest")
    if np.nanmin(z) < 1 < np.nanmax(z):
        cs = ax.contour(alphas, a.k_range, z, levels=[1.0], colors="black", linewidths=1.5)
        ax.clabel(cs, fmt={1.0: "speedup = 1"}, fontsize=8)
    for p in cal:
        ax.scatter(p["alpha_l"], p["k"], color=_colour(norm, p["speedup"]), edgecolors="black", s=60, zorder=3)
        ax.annotate(f"{p['speedup']:.2f}", (p["alpha_l"], p["k"]), textcoords="offset points", xytext=(5, 4),
                    fontsize=7)
    fig.colorbar(mesh, ax=ax, label="decode speedup vs plain")
    ax.set_xlabel("acceptance α (per position)")
    ax.set_ylabel("draft length K")
    ax.set_title(f"Speedup over α × K — {a.short}, context "
                 f"{a.map_context}, draft {cost:.0f} ms/token\n(colour: cost model; dots: measured)", fontsize=9)
    return _save(fig, path)


def fig_context_k(a: SettingAnalysis, path: Path) -> Path:
    plt = _plt()
    contexts = sorted({r["context"] for r in a.micro if r.get("measure") == "forward"})
    lo, hi = min(contexts), max(max(contexts), 16384)
    xs = np.geomspace(lo, hi, 60)
    pts = [p for p in a.points if p["drafter"] == "calibrated" and p["alpha_dial"] == a.context_alpha]
    z = np.array([[a.model.speedup(a.context_alpha, k, x, a.draft_cost) for x in xs] for k in a.k_range])
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    norm = _norm(np.concatenate([z.ravel(), [p["speedup"] for p in pts]]))
    mesh = ax.pcolormesh(xs, a.k_range, z, cmap="RdBu", norm=norm, shading="nearest")
    if np.nanmin(z) < 1 < np.nanmax(z):
        cs = ax.contour(xs, a.k_range, z, levels=[1.0], colors="black", linewidths=1.5)
        ax.clabel(cs, fmt={1.0: "speedup = 1"}, fontsize=8)
    for p in pts:
        ax.scatter(p["mean_context"], p["k"], color=_colour(norm, p["speedup"]), edgecolors="black", s=60, zorder=3)
        ax.annotate(f"{p['speedup']:.2f}", (p["mean_context"], p["k"]), textcoords="offset points", xytext=(5, 4),
                    fontsize=7)
    ax.axvline(max(contexts), color="gray", ls=":", lw=1)
    ax.text(max(contexts), 0.6, " measured | extrapolated →", fontsize=7, va="bottom", color="dimgray")
    ax.set_xscale("log", base=2)
    fig.colorbar(mesh, ax=ax, label="decode speedup vs plain")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("draft length K")
    ax.set_title(f"Speedup over context × K — {a.short}, α = {a.context_alpha:.2f}\n{a.draft_label} "
                 "(colour: cost model; dots: measured)", fontsize=9)
    return _save(fig, path)


def fig_alpha_curves(a: SettingAnalysis, path: Path) -> Path:
    plt = _plt()
    cal = [p for p in a.points if p["drafter"] == "calibrated" and p["context"] == a.map_context]
    ks = sorted({p["k"] for p in cal}) or [2, 4, 8]
    cost = statistics.median(p["cost_ms"] for p in cal) if cal else a.model.draft_ms(a.draft_cost, a.map_context)
    alphas = np.linspace(0, 1, 101)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    colors = plt.cm.viridis(np.linspace(0, 0.9, len(ks)))
    for k, c in zip(ks, colors):
        ax.plot(alphas, [a.model.speedup(al, k, a.map_context + 16, cost) for al in alphas], color=c,
                label=f"K = {k} (model)")
        mine = [p for p in cal if p["k"] == k]
        ax.scatter([p["alpha_l"] for p in mine], [p["speedup"] for p in mine], color=c, edgecolors="black", zorder=3)
    real = [p for p in a.points if p["drafter"] != "calibrated" and p["context"] == a.map_context
            and not p.get("tree_steps")]  # a tree's α is per draft node, not per position: off this axis
    for p in real:
        marker = "s" if p["drafter"] == "ngram" else "D"
        ax.scatter(p["alpha_l"], p["speedup"], marker=marker, facecolors="none", edgecolors="crimson", zorder=3)
        ax.annotate(_short(p), (p["alpha_l"], p["speedup"]), textcoords="offset points", xytext=(4, -9), fontsize=6,
                    color="crimson")
    ax.axhline(1.0, color="black", lw=1)
    ax.set_xlabel("acceptance α (per position)")
    ax.set_ylabel("decode speedup vs plain")
    ax.set_title(f"Speedup vs α — {a.short}, context {a.map_context}, "
                 f"calibrated draft {cost:.0f} ms/token\n(lines: cost model; dots: measured; red: real drafters, "
                 "whose costs differ)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _short(p: dict) -> str:
    if p["drafter"] == "calibrated":
        return f"calibrated α={p['alpha_dial']:g} K={p['k']}"
    name = "0.5B" if "0.5b" in p["drafter"] else p["drafter"]
    return f"{name} {p['controller']}:{p['k']}{_tree_label(p)} T={p['temperature']:g}"


def _tree_label(p: dict) -> str:
    """`` tree 8`` (a full-width tree of at most 8 nodes every step), `` tree goodput:8`` (the chain-or-tree
    chooser) or ``""`` (chains)."""
    if not p.get("tree"):
        return ""
    return f" tree {p['tree']}" if p.get("tree_choice") == "always" else f" tree {p.get('tree_choice')}:{p['tree']}"


def tree_rows(points: list[dict]) -> list[dict]:
    """Each tree point beside the chain point of the same drafter, controller, K, context, temperature and prompt
    (whichever sweep measured it: points shared by sweeps are measured once): ``{"chain", "tree"}`` pairs, chains
    None where no sweep measured one."""
    def key(p):
        return tuple(p.get(k) for k in ("drafter", "controller", "k", "context", "temperature", "prompt_index",
                                        "max_new_tokens", "workload", "seed"))
    trees = [p for p in points if p.get("tree")]
    chains = {key(p): p for p in points if not p.get("tree")} if trees else {}
    return [{"chain": chains.get(key(p)), "tree": p} for p in trees]


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
        for label, p in (("chain", c), (_tree_label(t).strip(), t)):
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


def time_split_rows(a: SettingAnalysis) -> list[tuple[str, float, float, float, float]]:
    """``(label, draft, verify, other, tokens per step)`` per representative configuration, ms per step."""
    out = []
    plains = [p for p in a.plains if p["context"] == a.map_context and p["temperature"] == 0]
    if plains:
        out.append(("plain", 0.0, statistics.median(p["step_verify_ms"] for p in plains),
                    statistics.median(p["step_other_ms"] for p in plains), 1.0))
    cal = [p for p in a.points if p["drafter"] == "calibrated" and p["context"] == a.map_context]
    if cal:
        alpha = min({p["alpha_dial"] for p in cal}, key=lambda x: abs(x - 0.8))
        for p in sorted((p for p in cal if p["alpha_dial"] == alpha), key=lambda p: p["k"]):
            out.append((f"calibrated α={alpha:g} K={p['k']}", p["step_draft_ms"], p["step_verify_ms"],
                        p["step_other_ms"], p["new_tokens"] / max(p["steps"], 1)))
    for p in a.points:
        if p["drafter"] != "calibrated" and p["context"] == a.map_context and p["temperature"] == 0:
            out.append((_short(p), p["step_draft_ms"], p["step_verify_ms"], p["step_other_ms"],
                        p["new_tokens"] / max(p["steps"], 1)))
    return out


def fig_time_split(a: SettingAnalysis, path: Path) -> Path | None:
    rows = time_split_rows(a)
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 0.8 + 0.32 * len(rows)))
    y = np.arange(len(rows))
    d = np.array([r[1] for r in rows])
    v = np.array([r[2] for r in rows])
    o = np.array([r[3] for r in rows])
    ax.barh(y, d, color="#f4a261", label="draft")
    ax.barh(y, v, left=d, color="#2a9d8f", label="verify (target forward)")
    ax.barh(y, o, left=d + v, color="#adb5bd", label="other")
    for i, r in enumerate(rows):
        ax.text(d[i] + v[i] + o[i], i, f"  {r[4]:.2f} tok/step, {(d[i] + v[i] + o[i]) / r[4]:.0f} ms/tok",
                va="center", fontsize=7)
    ax.set_yticks(y, [r[0] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms per step")
    ax.set_xlim(0, float((d + v + o).max()) * 1.45)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"Time per step — {a.short}, context {a.map_context}",
                 fontsize=9)
    return _save(fig, path)


def fig_verify_cost(a: SettingAnalysis, path: Path) -> Path:
    plt = _plt()
    fwd = [r for r in a.micro if r.get("role") == "target" and r.get("measure") == "forward"]
    contexts = sorted({r["context"] for r in fwd})
    ns = sorted({r["n"] for r in fwd})
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    colors = plt.cm.plasma(np.linspace(0, 0.85, len(contexts)))
    for ctx, c in zip(contexts, colors):
        mine = sorted((r for r in fwd if r["context"] == ctx), key=lambda r: r["n"])
        ax.scatter([r["n"] for r in mine], [r["ms"] for r in mine], color=c, zorder=3)
        grid = np.linspace(min(ns), max(ns), 50)
        ax.plot(grid, [a.model.verify_ms(n, ctx) for n in grid], color=c, label=f"context {ctx}")
    for name in a.model.draft:
        ax.axhline(a.model.draft_ms(name, contexts[0]), color="gray", ls="--", lw=1)
        ax.text(max(ns), a.model.draft_ms(name, contexts[0]), f"one draft token ({name}, ctx {contexts[0]})",
                fontsize=7, ha="right", va="bottom", color="gray")
    ax.set_xlabel("tokens per target forward n = K + 1")
    ax.set_ylabel("ms (forward + argmax + rollback)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Verification cost — {a.short} (dots: measured; "
                 "lines: fit)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def draw_maps(a: SettingAnalysis, img_dir: Path, prefix: str = "boundary") -> dict[str, Path]:
    """Draw every map of one setting into ``img_dir``; returns {name: path}."""
    figs = {
        "alpha_k": fig_alpha_k(a, img_dir / f"{prefix}-{a.slug}-alpha-k.png"),
        "context_k": fig_context_k(a, img_dir / f"{prefix}-{a.slug}-context-k.png"),
        "alpha_curves": fig_alpha_curves(a, img_dir / f"{prefix}-{a.slug}-speedup-vs-alpha.png"),
        "verify_cost": fig_verify_cost(a, img_dir / f"{prefix}-{a.slug}-verify-cost.png"),
    }
    split = fig_time_split(a, img_dir / f"{prefix}-{a.slug}-time-split.png")
    if split is not None:
        figs["time_split"] = split
    return figs


# Findings -------------------------------------------------------------------------------------------------------
def findings(a: SettingAnalysis) -> dict:
    """The numbers the report states, from the cost model (checked against the measured points)."""
    m = a.model
    ctx0 = a.map_context + 16
    cal = [p for p in a.points if p["drafter"] == "calibrated" and p["context"] == a.map_context]
    cal_cost = statistics.median(p["cost_ms"] for p in cal) if cal else m.draft_ms(a.draft_cost, ctx0)
    min_alpha = {k: m.min_alpha(k, ctx0, cal_cost) for k in a.k_range}
    evidence = {}
    for k in a.k_range:
        mine = [p for p in cal if p["k"] == k]
        if mine:
            wins = [p["alpha_l"] for p in mine if p["speedup"] >= 1]
            losses = [p["alpha_l"] for p in mine if p["speedup"] < 1]
            evidence[k] = (max(losses) if losses else None, min(wins) if wins else None)
    best_k = {}
    for name, lo, hi in BUCKETS:
        mid = math.sqrt(lo * hi)
        best_k[name] = (mid, *m.best_k(a.reference_alpha, mid, a.draft_cost, a.k_range))
    k_ref, _ = m.best_k(a.reference_alpha, ctx0, a.draft_cost, a.k_range)
    break_even = {k: paying_range(m, a.reference_alpha, k, a.draft_cost) for k in sorted({1, 2, 4, max(k_ref, 1)})
                  if k <= m.k_max}
    c = m.draft_ms(a.draft_cost, ctx0) / m.plain_step_ms(ctx0)
    verify_ratio = {n: m.verify_ms(n, ctx0) / m.verify_ms(1, ctx0) for n in (2, 3, 5, 9)}
    mem = a.memory or {}
    return {"min_alpha": min_alpha, "evidence": evidence, "best_k": best_k, "break_even": break_even,
            "cost_ratio": c, "cal_cost_ms": cal_cost, "cal_cost_ratio": cal_cost / m.plain_step_ms(ctx0),
            "verify_ratio": verify_ratio, "plain_ms": m.plain_step_ms(ctx0), "memory": mem,
            "max_measured_context": max((r["context"] for r in a.micro if r.get("measure") == "forward"), default=0)}


def paying_range(model: FittedCostModel, alpha: float, k: int, drafter, lo: float = 128, hi: float = 131072):
    """``(first, last)`` context lengths (on a log grid from ``lo`` to ``hi``) between which speedup ≥ 1, or None
    when it never pays there."""
    grid = np.geomspace(lo, hi, 97)
    pays = [c for c in grid if model.speedup(alpha, k, c, drafter) >= 1.0]
    return (float(pays[0]), float(pays[-1])) if pays else None


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
        fast = (f"{fastest['decode_tokens_per_s']:.2f} ({_short(fastest)}; plain {plain_tps:.2f})"
                if fastest and fastest["decode_tokens_per_s"] > plain_tps else f"{plain_tps:.2f} (plain decoding)")
        lines.append(
            f"| {a.short} | {f['plain_ms']:.0f} | "
            f"{f['verify_ratio'][5]:.2f}× | {f['cost_ratio']:.2f} | "
            + (f"K = {k}: {s:.2f}× (α = {a.reference_alpha:.2f})" if k else
               f"none: plain decoding (α = {a.reference_alpha:.2f})")
            + " | " + (f"{_short(best_real)}: {best_real['speedup']:.2f}×, α {best_real['alpha_l']:.2f}"
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
        name = (p["drafter"] + _tree_label(p)) if p["drafter"] != "calibrated" else f"calibrated α={p['alpha_dial']:g}"
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
