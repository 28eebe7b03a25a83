"""The boundary maps of one hardware setting (PNG): speedup over α × K and over context × K (the predicted
surface, measured points on top, the speedup = 1 contour as the boundary), speedup vs α per K, the time split per
step, and the verify-cost curve."""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

from adaspec.bench.analysis import SettingAnalysis, point_label, time_split_rows
from adaspec.bench.plots import pyplot as _plt
from adaspec.bench.plots import save as _save


def _norm(values):
    from matplotlib.colors import TwoSlopeNorm

    lo = min(0.5, float(np.nanmin(values)))
    hi = max(1.5, float(np.nanmax(values)))
    return TwoSlopeNorm(vmin=lo, vcenter=1.0, vmax=hi)


def _colour(norm, value: float):
    import matplotlib

    return [matplotlib.colormaps["RdBu"](norm(value))]


def _surface(ax, xs, ks, z, points: list[dict], x_key: str):
    """The predicted speedup ``z`` over (``xs``, ``ks``) with its speedup = 1 contour, and the measured ``points``
    (at ``p[x_key]``, ``p["k"]``) on the same colour scale; returns the mesh, for a colour bar."""
    norm = _norm(np.concatenate([z.ravel(), [p["speedup"] for p in points]]))
    mesh = ax.pcolormesh(xs, ks, z, cmap="RdBu", norm=norm, shading="nearest")
    if np.nanmin(z) < 1 < np.nanmax(z):
        cs = ax.contour(xs, ks, z, levels=[1.0], colors="black", linewidths=1.5)
        ax.clabel(cs, fmt={1.0: "speedup = 1"}, fontsize=8)
    for p in points:
        ax.scatter(p[x_key], p["k"], color=_colour(norm, p["speedup"]), edgecolors="black", s=60, zorder=3)
        ax.annotate(f"{p['speedup']:.2f}", (p[x_key], p["k"]), textcoords="offset points", xytext=(5, 4), fontsize=7)
    return mesh


def fig_alpha_k(a: SettingAnalysis, path: Path) -> Path:
    plt = _plt()
    cal = [p for p in a.points if p["drafter"] == "calibrated" and p["context"] == a.map_context]
    cost = statistics.median(p["cost_ms"] for p in cal) if cal else a.model.draft_ms(a.draft_cost, a.map_context)
    alphas = np.linspace(0, 1, 101)
    z = np.array([[a.model.speedup(al, k, a.map_context + 16, cost) for al in alphas] for k in a.k_range])
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    mesh = _surface(ax, alphas, a.k_range, z, cal, "alpha_l")
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
    mesh = _surface(ax, xs, a.k_range, z, pts, "mean_context")
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
        ax.annotate(point_label(p), (p["alpha_l"], p["speedup"]), textcoords="offset points", xytext=(4, -9),
                    fontsize=6, color="crimson")
    ax.axhline(1.0, color="black", lw=1)
    ax.set_xlabel("acceptance α (per position)")
    ax.set_ylabel("decode speedup vs plain")
    ax.set_title(f"Speedup vs α — {a.short}, context {a.map_context}, "
                 f"calibrated draft {cost:.0f} ms/token\n(lines: cost model; dots: measured; red: real drafters, "
                 "whose costs differ)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    return _save(fig, path)


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
