"""Predicted boundary maps for a model shape on a hardware profile (``adaspec map --hardware NAME --shape S``).

Everything here is a prediction of the roofline model (:mod:`adaspec.bench.hardware`) put through the measured
study's closed form (:mod:`adaspec.controllers.costmodel`): no point is measured, and every title, table and
file name says so. The report holds

* speedup over α × K at a short context, one panel per drafter (draft models and prompt lookup);
* the boundary α (the least acceptance at which speculation pays) against context, per K;
* the best K and its speedup per α and context, next to the seed study's rules of thumb (α > 70 % pays, < 40 %
  hurts; K 4–8 for short, 3–5 for medium, 2–3 for long contexts), each marked confirmed or refuted by the model;
* the published speedups of :data:`~adaspec.bench.published.PUBLISHED` on the same hardware, predicted from their
  published τ, with the error;
* with ``--replay``, the speculation steps an ``adaspec compare`` run measured (on any machine) replayed on this
  hardware (:func:`replay_steps`): token trees against chains, predicted.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from adaspec.bench.hardware import HardwareProfile, profile
from adaspec.bench.hardware_measure import measure_profile, ram_bytes
from adaspec.bench.published import validate_published
from adaspec.errors import ConfigError
from adaspec.models.synthetic import shape, shape_key

CONTEXTS = (512, 4096, 16384)
"""Short, medium and long contexts of the seed study's rule of thumb, tokens."""
ALPHAS = (0.4, 0.6, 0.7, 0.8, 0.9)
KS = tuple(range(1, 17))
SEED_K = {512: (4, 8), 4096: (3, 5), 16384: (2, 3)}
"""The seed study's recommended K range per context class."""
LOOKUP = "ngram-lookup"


def resolve_profile(name: str, *, dtype: str, layer_ms: float | None = None, shapes=()) -> HardwareProfile:
    """A named profile, or ``this-cpu`` (measured now, see :func:`~adaspec.bench.hardware_measure.measure_profile`, with
    the matrices of ``shapes`` timed one by one)."""
    if name.strip().lower() in ("this-cpu", "this"):
        prof, _ = measure_profile(dtype=dtype if dtype in ("bfloat16", "float32") else "float32", shapes=shapes)
        # a host time given by hand replaces the measured rest of the forward too
        return prof if layer_ms is None else replace(prof, layer_ms=layer_ms, overhead_curves=())
    return profile(name, layer_ms=layer_ms)


def predicted_report(hardware: str, target: str, drafts: list[str], report: Path, *, dtype: str = "bfloat16",
                     img_dir: Path | None = None, layer_ms: float | None = None,
                     prof: HardwareProfile | None = None, measured: list[Path] = (),
                     replay: list[Path] = ()) -> dict:
    """Write the predicted report (Markdown + PNGs) for ``target`` on ``hardware``; returns what it wrote.

    Args:
        hardware: a profile name (see :data:`~adaspec.bench.hardware.PROFILES`) or ``this-cpu``.
        target, drafts: model shapes (``7b``, ``qwen2.5-0.5b``, ``vicuna-68m``, a zoo name ...); ``ngram`` for
            prompt lookup.
        layer_ms: host time per decoder layer (default: the profile's).
        measured: ``adaspec bench`` results files measured on this hardware: their micro rows of the same shape
            and dtype are compared with the predicted forward times (a validation table).
        replay: ``adaspec compare`` results files whose speculation steps are replayed on this hardware
            (:func:`replay_steps`; draft-model steps are priced with the first draft model of ``drafts``).

    Raises:
        ConfigError: unknown hardware or shape, or a target that does not fit the device.
    """
    t_shape = shape(target)
    models = {d: shape(d) for d in drafts if d.lower() != "ngram"}

    def check_fit(p: HardwareProfile) -> None:
        if not p.fits(t_shape, dtype):
            raise ConfigError(f"{target} in {dtype} ({t_shape.total_params / 1e9:.1f} B parameters) does not fit in "
                              f"{p.name}'s {p.memory_gib:g} GiB")

    if prof is None and hardware.strip().lower() in ("this-cpu", "this"):  # refuse before timing its matrices
        check_fit(HardwareProfile("this-cpu", "cpu", 1.0, 1.0, ram_bytes() / 2**30))
    prof = prof or resolve_profile(hardware, dtype=dtype, layer_ms=layer_ms, shapes=[t_shape, *models.values()])
    check_fit(prof)
    names = [d for d in drafts if d.lower() != "ngram"] + ([LOOKUP] if any(d.lower() == "ngram" for d in drafts)
                                                           else [])
    cost = prof.cost_model(t_shape, models, dtype=dtype)
    img_dir = img_dir or report.parent / "img"
    img_dir.mkdir(parents=True, exist_ok=True)
    report.parent.mkdir(parents=True, exist_ok=True)
    slug = f"predicted-{prof.name}-{shape_key(target)}-{dtype}-host{prof.layer_ms:g}ms".replace(":", "-")
    figs = {"alpha_k": _fig_alpha_k(cost, names, prof, target, img_dir / f"{slug}-alpha-k.png"),
            "boundary": _fig_boundary(cost, names, prof, target, img_dir / f"{slug}-boundary.png")}
    published = [r for r in validate_published() if r["hardware"] == prof.name]
    checks = compare_measured(measured, prof, target, dtype) if measured else []
    replayed = replay_steps(cost, list(replay), draft=next(iter(models), None)) if replay else []
    md = (_markdown(prof, target, dtype, names, cost, figs, published, report.parent) + _validation(checks, measured)
          + _replay_section(replayed, replay, prof, target))
    report.write_text(md, encoding="utf-8")
    return {"report": report, "figures": figs, "model": cost, "profile": prof, "checks": checks,
            "replay": replayed}


def replay_steps(cost, paths: list[Path], *, draft: str | None = None, lookup: str = LOOKUP) -> list[dict]:
    """Speculation steps measured by ``adaspec compare`` (its rows' ``step_records``) replayed on ``cost``'s
    hardware, per method: what each step emitted and verified stays as measured (greedy acceptance does not depend
    on the machine), its time becomes the model's. A step that drafted d nodes (a chain of d tokens or a tree of d
    nodes) at draft depth k, context L, costs ``T(d + 1, L)`` plus its drafting: one lookup (``lookup``'s cost)
    for prompt lookup, ``d · T_d(L)`` for a draft model's chain and ``k · T_d(L)`` for its tree (``draft``, a draft
    name of ``cost``); a step without a
    draft costs ``T(1, L)``. The predicted speedup is plain decoding's time for the same tokens, ``Σ emitted ·
    T(1, L)``, over the steps' time.

    Replaying keeps the step sequence the measuring machine chose: exact for fixed K and always-on trees, an
    approximation for controllers whose choices follow the measured costs (goodput, the chain/tree chooser), which
    would choose differently on other hardware.

    Returns:
        one dict per method: ``method``, ``prompts``, ``steps``, ``tau`` (tokens per speculation step), ``nodes``
        (draft nodes verified per speculation step), ``tree_steps``, ``predicted`` (speedup), ``measured`` (the
        file's own decode speedup over its ``plain`` rows, on the machine that measured it; None without them).

    Raises:
        ConfigError: no step records in the files, or draft-model steps and no ``draft``.
    """
    from collections import defaultdict

    from adaspec.bench.results import read_results

    rows = [r for path in paths for r in read_results(Path(path)) if r.get("step_records") is not None]
    if not rows:
        raise ConfigError(f"no adaspec compare rows with step records in {', '.join(map(str, paths))}")
    by: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by[r["method"]].append(r)

    def rate(rs: list[dict]) -> float | None:
        ms = sum(r.get("decode_ms") or 0.0 for r in rs)
        return sum(r.get("decode_tokens") or 0 for r in rs) / ms if ms > 0 else None

    plain_rate = rate(by.get("plain", []))
    out = []
    for method, rs in by.items():
        emitted = plain_ms = spec_ms = 0.0
        spec = [s for r in rs for s in r["step_records"] if s["drafted"]]
        for s in (s for r in rs for s in r["step_records"]):
            ctx = s["context_len"]
            one = cost.verify_ms(1, ctx)
            emitted += s["emitted"]
            plain_ms += s["emitted"] * one
            if not s["drafted"]:
                spec_ms += one
                continue
            if str(s.get("drafter", "")).startswith("ngram"):
                drafting = cost.draft_ms(lookup, ctx)
            elif draft is None:
                raise ConfigError(f"{method}: steps drafted by {s.get('drafter')!r} need a draft model shape to price "
                                  "(--draft)")
            else:  # a chain runs a draft forward per token it drafted (it may stop early); a tree one per level
                drafting = (s["k"] if s.get("tree") else s["drafted"]) * cost.draft_ms(draft, ctx)
            spec_ms += drafting + cost.verify_ms(s["drafted"] + 1, ctx)
        measured = rate(rs)
        out.append({"method": method, "prompts": len(rs), "steps": sum(len(r["step_records"]) for r in rs),
                    "tau": sum(s["emitted"] for s in spec) / len(spec) if spec else None,
                    "nodes": sum(s["drafted"] for s in spec) / len(spec) if spec else None,
                    "tree_steps": sum(1 for s in spec if s.get("tree")),
                    "predicted": plain_ms / spec_ms if spec_ms > 0 else None,
                    "measured": measured / plain_rate if measured and plain_rate else None})
    return out


def _replay_section(rows: list[dict], paths, prof, target: str) -> str:
    if not rows:
        return ""
    lines = ["", f"## Measured speculation steps replayed on {prof.name} (PREDICTED)", "",
             f"Steps of {', '.join(f'`{p}`' for p in paths)} (acceptance as measured there; times from the model of "
             f"{target} on {prof.name}; see `adaspec.bench.predicted.replay_steps`). \"measured there\" is the "
             "file's own decode speedup on the machine that ran it.", "",
             "| method | prompts | τ | draft nodes per step | tree steps | predicted speedup | measured there |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        def f(x, fmt):
            return "—" if x is None else format(x, fmt)
        lines.append(f"| {r['method']} | {r['prompts']} | {f(r['tau'], '.2f')} | {f(r['nodes'], '.2f')} | "
                     f"{r['tree_steps']} | {f(r['predicted'], '.2f')}× | {f(r['measured'], '.2f')}× |")
    return "\n".join(lines) + "\n"


def compare_measured(paths: list[Path], prof: HardwareProfile, target: str, dtype: str) -> list[dict]:
    """Measured forward times (micro rows of ``adaspec bench`` results, any role) of models with ``target``'s
    shape and ``dtype``, each with the roofline prediction and its relative error.

    Raises:
        ConfigError: no micro row of that shape and dtype in the files.
    """
    from adaspec.bench.results import read_results

    want = shape(target)
    rows = []
    for path in paths:
        for r in read_results(Path(path)):
            if r.get("kind") != "micro" or r.get("measure") != "forward" or r.get("dtype") != dtype:
                continue
            if _shape_or_none(str(r.get("model", ""))) != want or int(r.get("batch", 1)) != 1:
                continue
            pred = prof.forward_time_ms(want, int(r["n"]), int(r["context"]), dtype=dtype)
            rows.append({"model": r["model"], "n": int(r["n"]), "context": int(r["context"]), "measured_ms": r["ms"],
                         "predicted_ms": pred, "error": (pred - r["ms"]) / r["ms"]})
    if not rows:
        raise ConfigError(f"no micro measurements of a {target} model in {dtype} (batch 1) in "
                          f"{', '.join(map(str, paths))}")
    return sorted(rows, key=lambda r: (r["model"], r["context"], r["n"]))


def _shape_or_none(model: str):
    try:
        return shape(model.split("@")[0])
    except ConfigError:
        return None


def _validation(checks: list[dict], paths) -> str:
    if not checks:
        return ""
    import statistics

    errs = [abs(c["error"]) for c in checks]
    lines = ["", "## Measured on this hardware vs predicted", "",
             f"Micro rows from {', '.join(f'`{p}`' for p in paths)}: median |error| "
             f"**{statistics.median(errs):.1%}** over {len(checks)} forwards (max {max(errs):.1%}).", "",
             "| model | context | n | measured ms | predicted ms | error |", "|---|---:|---:|---:|---:|---:|"]
    for c in checks:
        lines.append(f"| {c['model']} | {c['context']} | {c['n']} | {c['measured_ms']:.2f} | {c['predicted_ms']:.2f} "
                     f"| {c['error']:+.1%} |")
    return "\n".join(lines) + "\n"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "figure.dpi": 100, "savefig.dpi": 100})
    return plt


def _fig_alpha_k(cost, names, prof, target, path: Path) -> Path:
    from matplotlib.colors import TwoSlopeNorm

    plt = _plt()
    alphas = np.linspace(0, 1, 101)
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.6), squeeze=False)
    norm = TwoSlopeNorm(vmin=0.3, vcenter=1.0, vmax=4.0)
    for ax, name in zip(axes[0], names):
        z = np.array([[cost.speedup(a, k, CONTEXTS[0], name) for a in alphas] for k in KS])
        mesh = ax.pcolormesh(alphas, KS, z, cmap="RdBu", norm=norm, shading="nearest")
        ax.contour(alphas, KS, z, levels=[1.0], colors="k", linewidths=1.2)
        ax.set_title(f"{name}", fontsize=9)
        ax.set_xlabel("acceptance rate α")
        ax.set_ylabel("draft length K")
    fig.colorbar(mesh, ax=axes[0].tolist(), label="predicted speedup")
    fig.suptitle(f"PREDICTED speedup, {target} on {prof.name}, context {CONTEXTS[0]} (black: 1.0×)", fontsize=10)
    fig.savefig(path)
    plt.close(fig)
    return path


def _fig_boundary(cost, names, prof, target, path: Path) -> Path:
    plt = _plt()
    contexts = np.geomspace(128, max(256, shape(target).max_positions), 40)
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.4), squeeze=False, sharey=True)
    for ax, name in zip(axes[0], names):
        for k in (1, 2, 4, 8):
            ax.plot(contexts, [cost.min_alpha(k, c, name) for c in contexts], label=f"K={k}")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("least α that pays")
        ax.legend(fontsize=7)
    fig.suptitle(f"PREDICTED boundary α, {target} on {prof.name} (below a line speculation loses)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _markdown(prof, target, dtype, names, cost, figs, published, base: Path) -> str:
    t = shape(target)
    lines = [f"# PREDICTED boundary map: {target} on {prof.name} ({dtype})", "",
             "Every number on this page is a **prediction** of the roofline model (`adaspec.bench.hardware`), not a "
             "measurement.", "",
             f"- Hardware: {prof.name} ({prof.kind}): {prof.bandwidth_gbs:g} GB/s × η {prof.bandwidth_efficiency:g}, "
             f"{prof.matmul_tflops:g} TFLOP/s × η {prof.matmul_efficiency:g}, host {prof.layer_ms:g} ms per layer + "
             f"{prof.forward_ms:g} ms per forward. Source: {prof.source}.",
             *(["- Measured linear-layer time per 10^9 weights by tokens n (replaces the two-number roofline for "
                "the weights): " + ", ".join(f"n={n}: {v:.1f} ms" for n, v in prof.matmul_curve) + "."]
               if prof.matmul_curve and prof.linear_ms(t, 1) is None else []),
             *(["- Measured time per 10^9 weights of each matrix shape timed alone (out × in) by tokens n, streamed "
                "from memory, dispatch included (the LM head; every matrix where a layer has no curve of its own; "
                "host per layer less 7 linear calls "
                f"of {prof.linear_call_ms:.3f} ms): "
                + "; ".join(f"{o}×{i}: " + ", ".join(f"n={n}: {v:.0f}" for n, v in curve) + " ms"
                            for (o, i), curve in prof.linear_curves) + "."]
               if prof.linear_ms(t, 1) is not None else []),
             *(["- Measured time of one decoder layer's seven matrix products run in model order, layers streamed "
                "from memory (prices the model as layers × this + its LM head): "
                + "; ".join(f"{'/'.join(f'{o}×{i}' for o, i in m)}: "
                            + ", ".join(f"n={n}: {v:.2f}" for n, v in curve) + " ms"
                            for m, curve in prof.layer_curves if m == t.layer_matrices()) + "."]
               if prof.linear_ms(t, 1) is not None and t.layer_matrices() in dict(prof.layer_curves) else []),
             *(["- Measured time of a forward's work besides its matrix products (KV-cache update, attention, "
                "norms, rotary, activations, dispatch; the matrices stood in for), by tokens n and cached tokens L "
                "(replaces host per layer and the KV-cache read): "
                + ", ".join(f"n={n} L={c}: {v:.2f}" for n, c, v in dict(prof.overhead_curves)[t]) + " ms."]
               if t in dict(prof.overhead_curves) else []),
             f"- Target: {target}: {t.total_params / 1e9:.2f} B parameters, {t.layers} layers; "
             f"predicted plain step {cost.plain_step_ms(CONTEXTS[0]):.2f} ms at {CONTEXTS[0]} tokens, "
             f"{cost.plain_step_ms(min(CONTEXTS[-1], t.max_positions)):.2f} ms at "
             f"{min(CONTEXTS[-1], t.max_positions)} (its window: {t.max_positions} tokens).",
             "- Verify cost T(n)/T(1) at 512 tokens: " + ", ".join(
                 f"n={n}: {cost.verify_ms(n, 512) / cost.verify_ms(1, 512):.2f}" for n in (2, 5, 9, 17)) + ".",
             "- Draft cost per token (c = T_d / T(1) at 512): " + ", ".join(
                 f"{n}: {cost.draft_ms(n, 512):.2f} ms (c = {cost.draft_ms(n, 512) / cost.verify_ms(1, 512):.2f})"
                 for n in names) + ".", "",
             f"![speedup over α and K]({_rel(figs['alpha_k'], base)})", "",
             f"![boundary α]({_rel(figs['boundary'], base)})", "",
             "## Best K and speedup per α and context", "",
             "| drafter | context | " + " | ".join(f"α={a:g}" for a in ALPHAS) + " | least α (K=4) |",
             "|---|---:|" + "---:|" * (len(ALPHAS) + 1)]
    contexts = [c for c in CONTEXTS if c <= t.max_positions] or [min(CONTEXTS[0], t.max_positions)]
    for name in names:
        for c in contexts:
            cells = []
            for a in ALPHAS:
                k, s = cost.best_k(a, c, name, KS)
                cells.append(f"K={k}: {s:.2f}×" if k else "plain")
            lines.append(f"| {name} | {c} | " + " | ".join(cells) + f" | {_fmt_alpha(cost.min_alpha(4, c, name))} |")
    lines += ["", "## The seed study's rules of thumb, by this model", "",
              "| drafter | rule | predicted | verdict |", "|---|---|---|---|"]
    for name in names:
        for rule, predicted, ok in rule_checks(cost, name, t.max_positions):
            lines.append(f"| {name} | {rule} | {predicted} | {'confirmed' if ok else 'refuted'} |")
    if published:
        lines += ["", "## Published speedups on this hardware, predicted from their τ", "",
                  "| source | target | method | K | τ | published | predicted | error |",
                  "|---|---|---|---:|---:|---:|---:|---:|"]
        for r in published:
            lines.append(f"| {r['source'].split(' (')[0]} | {r['target']} | {r['method']} | {r['k']} | {r['tau']:g} | "
                         f"{r['speedup']:.2f}× | {r['predicted']:.2f}× | {r['error']:+.1%} |")
        lines += ["", f"Source: {published[0]['source']}."]
    return "\n".join(lines) + "\n"


def rule_checks(cost, name: str, max_context: int = 10**9) -> list[tuple[str, str, bool]]:
    """The seed study's rules of thumb checked against ``cost`` for drafter ``name``: ``(rule, predicted, holds)``;
    context classes beyond the model's window (``max_context``) are left out."""
    out = []
    s70 = max(cost.best_k(0.7, c, name, KS)[1] for c in CONTEXTS[:1])
    out.append(("α > 70 % pays (context 512)", f"best speedup at α=0.7: {s70:.2f}×", s70 > 1.0))
    s40 = cost.best_k(0.4, CONTEXTS[0], name, KS)[1]
    s40k4 = cost.speedup(0.4, 4, CONTEXTS[0], name)
    out.append(("α < 40 % hurts (context 512)", f"K=4 at α=0.4: {s40k4:.2f}× (best K: {s40:.2f}×)", s40k4 < 1.0))
    for c, (lo, hi) in SEED_K.items():
        if c > max_context:
            continue
        k, s = cost.best_k(0.8, c, name, KS)
        out.append((f"K {lo}–{hi} at context {c} (α=0.8)", f"best K = {k} ({s:.2f}×)", lo <= k <= hi))
    return out


def _fmt_alpha(x: float) -> str:
    if math.isnan(x):
        return "never"
    return "always" if x == 0 else f"{x:.2f}"


def _rel(path: Path, base: Path) -> str:
    try:
        return str(path.relative_to(base))
    except ValueError:
        return str(path)
