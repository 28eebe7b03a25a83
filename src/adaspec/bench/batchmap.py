"""The batch axis of ``adaspec map``: how speculation's gain changes as the batch grows.

For each family of settings that differ only in batch size (same target, dtype, threads, backend), from the
``plain`` and ``point`` records of ``adaspec bench`` with ``bench.batch = [1, 2, 4, ...]``:

* **speedup vs batch size**: every speculative configuration's decode throughput over plain batched decoding's at the
  same B (B = 1: the usual decode speedup), one line per configuration;
* **throughput–latency**: the batch's decode tokens/s against the time per token one request sees, plain and the
  best speculative configuration at each B (each point labelled by B);
* **the turning point**: the smallest measured B at which no speculative configuration beats plain batched decoding
  (speedup < 1), and, per configuration, the largest B at which it still pays.

The seed study's claim, which the report checks against the measurement: *the parallelism of a batch competes with
the parallelism of verification, so speculation's gain shrinks as the batch grows, and at large batches it stops
paying* (the same reason vLLM turns speculation off above a batch size).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from adaspec.bench.plots import pyplot as _plt
from adaspec.bench.plots import save as _save
from adaspec.bench.results import apply_baseline, tag_runs

FAMILY_KEYS = ("target", "dtype", "threads", "backend")
SEED_CLAIM = ("speculation's gain shrinks as the batch grows (a batch's parallelism competes with verification's), "
              "and at large batches it stops paying")


@dataclass
class BatchFamily:
    """One family of settings (``FAMILY_KEYS``) measured at several batch sizes."""

    family: dict
    plains: dict[int, list[dict]] = field(default_factory=dict)  # B -> plain records
    points: dict[int, list[dict]] = field(default_factory=dict)  # B -> speculative records (speedup set)
    off_dial: list[dict] = field(default_factory=list)  # calibrated points whose rows left the reference path

    @property
    def batches(self) -> list[int]:
        return sorted(set(self.plains) | set(self.points))

    @property
    def label(self) -> str:
        f = self.family
        return f"{f['target']}, {f['dtype']}, {f['threads']} threads, {f['backend']}"

    @property
    def slug(self) -> str:
        f = self.family
        return "-".join(str(f[k]) for k in FAMILY_KEYS).replace("/", "_").replace(".", "_")

    def plain_tps(self, b: int) -> float:
        """Plain batched decoding's decode tokens/s at batch ``b`` (median of its runs)."""
        runs = self.plains.get(b, [])
        return statistics.median(p["decode_tokens_per_s"] for p in runs) if runs else math.nan

    def plain_row_tpot(self, b: int) -> float:
        runs = self.plains.get(b, [])
        return statistics.median(p.get("row_tpot_ms", p["tpot_ms"]) for p in runs) if runs else math.nan

    def configs(self) -> dict[str, dict[int, float]]:
        """``{configuration: {B: median speedup}}``."""
        out: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        for b, pts in self.points.items():
            for p in pts:
                out[config_label(p)][b].append(p["speedup"])
        return {c: {b: statistics.median(v) for b, v in sorted(by.items())} for c, by in out.items()}

    def best(self, b: int) -> dict | None:
        pts = self.points.get(b, [])
        return max(pts, key=lambda p: p["speedup"], default=None)

    def turning_point(self) -> int | None:
        """The smallest measured B (with points) where no configuration's median speedup reaches 1; None if
        speculation pays at every measured B."""
        configs = self.configs()
        for b in self.batches:
            values = [by[b] for by in configs.values() if b in by]
            if values and max(values) < 1.0:
                return b
        return None


OFF_DIAL = 0.2  # a calibrated point with more than this share of its drafts off the reference path


def off_dial(p: dict) -> bool:
    """A calibrated point that did not hold its α dial: more than ``OFF_DIAL`` of its drafted positions came after
    a row had left the plain batch's greedy path (a runtime whose rows mix, like ik_llama.cpp, changes a row's
    near-tied argmaxes with the batch's shape), so its measured α is far below the dial."""
    if p.get("drafter") != "calibrated" or not p.get("draft_tokens"):
        return False
    return (p.get("offpath_positions") or 0) / p["draft_tokens"] > OFF_DIAL


def config_label(p: dict) -> str:
    if p["drafter"] == "calibrated":
        return f"calibrated α={p['alpha_dial']:g} K={p['k']} {p['controller']}"
    return f"{p['drafter']} K={p['k']} {p['controller']}"


def analyse_batches(rows: list[dict]) -> list[BatchFamily]:
    """Families with at least two batch sizes measured; each point's speedup against its group's plain runs of the
    same invocation (as :func:`adaspec.bench.results.apply_baseline`)."""
    families: dict[tuple, BatchFamily] = {}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    rows = tag_runs(rows)
    for r in rows:
        if r.get("kind") == "plain" and "decode_ms" in r:
            groups[r.get("group"), r.get("run")].append(r)
    for r in rows:
        if r.get("kind") not in ("plain", "point"):
            continue
        key = tuple(r.get(k) for k in FAMILY_KEYS)
        fam = families.setdefault(key, BatchFamily(dict(zip(FAMILY_KEYS, key))))
        b = int(r.get("batch") or 1)
        if r["kind"] == "plain":
            fam.plains.setdefault(b, []).append(r)
            continue
        plains = groups.get((r.get("group"), r.get("run")))
        if not plains or not r.get("tpot_ms"):
            continue
        if off_dial(r):
            fam.off_dial.append(r)
            continue
        apply_baseline(r, plains)
        if not math.isnan(r["speedup"]):
            fam.points.setdefault(b, []).append(r)
    return [f for f in families.values() if len(f.batches) >= 2]


def fig_speedup_vs_batch(fam: BatchFamily, path: Path) -> Path:

    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for label, by in sorted(fam.configs().items()):
        bs = sorted(by)
        ax.plot(bs, [by[b] for b in bs], marker="o", label=label)
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    turn = fam.turning_point()
    if turn is not None:
        ax.axvline(turn, color="tab:red", lw=0.8, ls=":", label=f"stops paying: B = {turn}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(fam.batches, [str(b) for b in fam.batches])
    ax.set_xlabel("batch size B (requests decoding together)")
    ax.set_ylabel("decode throughput / plain batched at the same B")
    ax.set_title(f"Speculation vs batch size (measured)\n{fam.label}")
    ax.legend(fontsize=7)
    return _save(fig, path)


def fig_throughput_latency(fam: BatchFamily, path: Path) -> Path:

    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    bs = [b for b in fam.batches if b in fam.plains]
    xs, ys = [fam.plain_row_tpot(b) for b in bs], [fam.plain_tps(b) for b in bs]
    ax.plot(xs, ys, marker="o", color="black", label="plain (K = 0)")
    for x, y, b in zip(xs, ys, bs):
        ax.annotate(f"B={b}", (x, y), textcoords="offset points", xytext=(4, -10), fontsize=7)
    best = [(b, fam.best(b)) for b in fam.batches if fam.best(b) is not None]
    if best:
        xs = [p.get("row_tpot_ms", p["tpot_ms"]) for _, p in best]
        ys = [p["decode_tokens_per_s"] for _, p in best]
        ax.plot(xs, ys, marker="s", color="tab:blue", label="best speculative configuration at each B")
        for x, y, (b, p) in zip(xs, ys, best):
            ax.annotate(f"B={b}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, color="tab:blue")
    ax.set_xlabel("time per output token one request sees (ms)")
    ax.set_ylabel("batch decode throughput (tokens/s)")
    ax.set_title(f"Throughput vs latency as the batch grows (measured)\n{fam.label}")
    ax.legend(fontsize=7)
    return _save(fig, path)


def draw_batch_maps(fam: BatchFamily, img_dir: Path, prefix: str = "boundary") -> dict[str, Path]:
    return {"speedup": fig_speedup_vs_batch(fam, img_dir / f"{prefix}-{fam.slug}-speedup-vs-batch.png"),
            "throughput": fig_throughput_latency(fam, img_dir / f"{prefix}-{fam.slug}-throughput-latency.png")}


def batch_markdown(fam: BatchFamily, figs: dict[str, Path], rel) -> list[str]:
    """The report's section for one family (``rel(path)``: a figure's link)."""
    b1 = fam.plain_tps(1) if 1 in fam.plains else math.nan
    lines = [f"## Batch size: {fam.label}", "",
             "Decode throughput of the whole batch (every row's tokens after its first, over the time after the "
             "batch's prefill step); speedups against plain batched decoding at the same B, measured interleaved.",
             "", "| B | plain tokens/s | plain vs B = 1 | plain ms/token per request | best speculative configuration "
             "| its speedup | its α |", "|---:|---:|---:|---:|---|---:|---:|"]
    for b in fam.batches:
        best = fam.best(b)
        tps = fam.plain_tps(b)
        lines.append(f"| {b} | {tps:.2f} | {tps / b1:.2f}× | {fam.plain_row_tpot(b):.0f} | "
                     + (f"{config_label(best)} | {best['speedup']:.2f}× | {best['alpha']:.2f} |" if best
                        else "— | — | — |"))
    lines.append("")
    turn = fam.turning_point()
    configs = fam.configs()
    last_paying = {c: max((b for b, s in by.items() if s >= 1.0), default=None) for c, by in configs.items()}
    measured = ", ".join(str(b) for b in fam.batches)
    if turn is None:
        lines.append(f"**Turning point:** none measured: some configuration beats plain batched decoding at every "
                     f"measured B ({measured}).")
    else:
        lines.append(f"**Turning point:** from B = {turn} no measured configuration beats plain batched decoding "
                     f"(measured B: {measured}).")
    if fam.off_dial:
        lines += ["", f"Left out: {len(fam.off_dial)} calibrated point(s) whose rows left the plain batch's greedy "
                  f"path for more than {OFF_DIAL:.0%} of their drafts (their α fell far below the dial: "
                  + ", ".join(f"B = {p['batch']} α {p['alpha_dial']:g} K = {p['k']}: measured α {p['alpha']:.2f}"
                              for p in fam.off_dial)
                  + "). On a runtime whose rows mix (ik_llama.cpp), the batch's shape changes near-tied argmaxes, "
                  "so the α dial only holds on a row-independent runtime (llama.cpp)."]
    lines += ["", "Largest B at which each configuration still pays (of the B it was measured at): "
              + "; ".join(f"{c}: {'never' if b is None else b} (of {', '.join(map(str, configs[c]))})"
                          for c, b in sorted(last_paying.items())) + ".", ""]
    gains = {b: max(by[b] for by in configs.values() if b in by) for b in fam.batches
             if any(b in by for by in configs.values())}
    shrinking = all(gains[a] >= gains[b] - 0.03 for a, b in zip(sorted(gains), sorted(gains)[1:]))
    lines += [f"**The seed study's claim** ({SEED_CLAIM}): "
              + ("holds here: the best speedup goes " if shrinking else "does not hold monotonically here: the best "
                 "speedup goes ")
              + " → ".join(f"{gains[b]:.2f}× (B = {b})" for b in sorted(gains))
              + (f", and speculation stops paying at B = {turn}." if turn is not None else "."), ""]
    for name, caption in (("speedup", "Speedup vs batch size"), ("throughput", "Throughput vs latency")):
        if name in figs:
            lines += [f"![{caption}]({rel(figs[name])})", ""]
    return lines
