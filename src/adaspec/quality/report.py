"""The evaluation's report: the markdown tables (:func:`markdown`) and the speed-quality plot (:func:`plot`)."""

from __future__ import annotations

from pathlib import Path

from adaspec.quality.noise import NOISE_FACTOR


def _pct(x: float) -> str:
    return "—" if x != x else f"{100 * x:.1f}%"


def _accuracy_cells(s: dict) -> str:
    """The cells accuracy, its 95 % CI, Δ vs plain, its 95 % CI, McNemar p and discordant prompts of ``s`` (an
    ``analyse`` entry, or its ``stated`` part)."""
    v = s["vs_plain"]
    return (f"{_pct(s['accuracy'])} | {_pct(s['ci95'][0])}–{_pct(s['ci95'][1])} | "
            f"{100 * v['diff']:+.1f} pt | {100 * v['ci95'][0]:+.1f}…{100 * v['ci95'][1]:+.1f} | "
            f"{v['p_mcnemar']:.3f} | {v['c']}/{v['b']}")


def markdown(results: dict[str, dict[str, dict]], meta: dict) -> str:
    """The evaluation report (per task: one table of methods, then the divergences)."""
    lines = [f"# Quality: plain vs speculative decoding — {meta['target']}", "",
             f"Backend/dtype: {meta['dtype']}; greedy; at most {meta['max_new_tokens']} new tokens; threads "
             f"{meta['threads']}. Kernel noise (largest logit difference, one-token vs {meta['noise_width']}-token "
             f"forwards): {meta['noise']:.3g}; divergence threshold {NOISE_FACTOR:g}× = {meta['threshold']:.3g} "
             "logits.", "",
             "Accuracy with its 95 % Wilson interval; Δ vs plain = paired difference (Newcombe's 95 % interval) and "
             "the exact McNemar p-value, with the discordant prompts (right only with the method / only with "
             "plain); identical = same tokens as the method's reference (`plain`, or `plain+strict` for a strict "
             "method); cut = answers that reached the new-token limit (or the context window). Speed = decode "
             "tokens/s over the same "
             "prompts (interleaved).", ""]
    for task, stats in results.items():
        n = max((s["n"] for s in stats.values()), default=0)
        lines += [f"## {task} ({n} prompts)", "",
                  "| method | kind | accuracy | 95 % CI | Δ vs plain | 95 % CI | McNemar p | discordant | identical | "
                  "divergences (max margin) | cut | tok/s | speedup |",
                  "|---|---|---:|---|---:|---|---:|---:|---:|---|---:|---:|---:|"]
        for m, s in stats.items():
            kind = "lossy" if s["lossy"] else "lossless, strict" if s["strict"] else "lossless"
            margins = [dv["ref_margin"] for dv in s["divergences"] if dv["ref_margin"] is not None]
            div = f"{len(s['divergences'])}" + (f" ({max(margins):.3g})" if margins and not s["lossy"] else "")
            lines.append(f"| {m} | {kind} | {_accuracy_cells(s)} | {_pct(s['identical'])} | {div} | "
                         f"{_pct(s['truncated'])} | {s['tokens_per_s']:.2f} | {s['speedup']:.2f}x |")
        if any("stated" in s for s in stats.values()):
            lines += ["", "Scoring only the answer the text states (`####`, \"the answer is\", `\\boxed{}`; no "
                          "last-number fallback, as lm-eval's strict-match): an answer cut by the token limit "
                          "then scores as wrong instead of by whichever number its reasoning stopped at.", "",
                      "| method | accuracy (stated) | 95 % CI | Δ vs plain | 95 % CI | McNemar p | discordant |",
                      "|---|---:|---|---:|---|---:|---:|"]
            lines += [f"| {m} | {_accuracy_cells(s['stated'])} |" for m, s in stats.items()]
        if any("structured" in s for s in stats.values()):
            lines += ["", "Structured output: accuracy above counts an answer right when it is schema-valid (finished, "
                          "JSON following the schema or a well-formed call of the tool) with every expected field "
                          "exact; here the validity rate and the mean share of exact fields.", "",
                      "| method | schema-valid | 95 % CI | fields exact (mean) |", "|---|---:|---|---:|"]
            for m, s in stats.items():
                st = s["structured"]
                lines.append(f"| {m} | {_pct(st['valid'])} | {_pct(st['valid_ci95'][0])}–{_pct(st['valid_ci95'][1])} "
                             f"| {_pct(st['exact_fields'])} |")
        split = [(m, cpu, g) for m, s in stats.items() if m != "plain" for cpu, g in s.get("machines", {}).items()]
        if split:
            lines += ["", "The rows ran on more than one machine (their `cpu` field): identity and speed per machine "
                          "(kernels and speeds differ between machines, so the pooled speedup above mixes them).", "",
                      "| method | machine | prompts | identical | speedup |", "|---|---|---:|---:|---:|"]
            lines += [f"| {m} | {cpu} | {g['n']} | {_pct(g['identical'])} | "
                      f"{'—' if g['speedup'] != g['speedup'] else format(g['speedup'], '.2f') + 'x'} |"
                      for m, cpu, g in split]
        rows = [(m, dv) for m, s in stats.items() if not s["lossy"] for dv in s["divergences"]]
        if rows:
            lines += ["", "Divergences of lossless methods (first differing token; margins = top-1 minus top-2 "
                          "logit of the reference run and of the method's run at that position):", "",
                      "| method | prompt | position | reference margin | method margin | same score | both cut |",
                      "|---|---|---:|---:|---:|---|---|"]
            for m, dv in rows:
                lines.append(f"| {m} | {dv['prompt_id']} | {dv['position']} | {_num(dv['ref_margin'])} | "
                             f"{_num(dv['margin'])} | {'yes' if dv['same_score'] else 'no'} | "
                             f"{'yes' if dv.get('both_truncated') else 'no'} |")
        lines.append("")
    return "\n".join(lines)


def _num(x) -> str:
    return "—" if x is None else f"{x:.4g}"


def plot(results: dict[str, dict[str, dict]], path: Path) -> None:
    """Speed–quality scatter: speedup vs accuracy per method and task (lossy methods hollow)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5), squeeze=False)
    for ax, (task, stats) in zip(axes[0], results.items()):
        for m, s in stats.items():
            lo, hi = s["ci95"]
            ax.errorbar(s["speedup"], 100 * s["accuracy"], yerr=[[100 * (s["accuracy"] - lo)],
                                                                  [100 * (hi - s["accuracy"])]],
                        fmt="o", mfc="none" if s["lossy"] else None, capsize=3)
            ax.annotate(m, (s["speedup"], 100 * s["accuracy"]), fontsize=7, xytext=(4, 4),
                        textcoords="offset points")
        ax.set(title=task, xlabel="speedup vs plain decoding (decode tokens/s)", ylabel="accuracy (%)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
