"""The cost model's curves fitted to micro-measurements: speedup(α, K, context) in closed form.

The cost model (:mod:`adaspec.controllers.costmodel`: speedup = E(K) / T(K) × T(plain), boundary α, best K) prices a
step from three costs; here each is a curve in the context length L fitted to one setting's micro-measurements
(all in milliseconds, per step):

    T_v(n, L)  target forward over n tokens after L cached ones (+ argmax + cache rollback); n = K + 1 verifies K;
    T_d(L)     one draft token at context L (a line fitted to micro-measurements; 0 for n-gram lookup);
    o          engine overhead per step (stop checks, detokenising, controller), measured on plain steps.

T_v is fitted as a line in L per measured n whose slope grows linearly with n (attention over L cached tokens costs
∝ n L; least squares, relative error weighting), with a free intercept per n, interpolated linearly in n between
measured values: this follows the flat-then-rising shape of verification cost in n without assuming it. Where a
width (or a draft model) was measured at two or more contexts, the cost *within* the measured contexts is the
measured curve itself (piecewise linear through the median at each context) and the fitted line's slope carries it
beyond them: on llama.cpp the cost is not a line in L (caches, kernel switches; verify(5) measured 285, 236, 227,
318, 296, 451 ms at 256 … 16K), and the line alone mispredicted the measured speedups by 11.2 % (median, 55
points) against 6.4 % with the curve (docs/boundary-cpu.md). The fitting is pure numpy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from adaspec.controllers import costmodel
from adaspec.controllers.costmodel import expected_tokens  # noqa: F401 (re-exported)
from adaspec.errors import ConfigError


def fit_line(x: Sequence[float], y: Sequence[float], *, relative: bool = True) -> tuple[float, float]:
    """Least-squares ``y ≈ a + b x``; returns ``(a, b)``. ``relative`` weights rows by 1/y (fits relative error).

    With a single distinct x the slope is 0 and the intercept the (weighted) mean.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if len(x) == 0:
        raise ConfigError("cannot fit a line to no points")
    w = 1.0 / np.maximum(y, 1e-9) if relative else np.ones_like(y)
    if len(np.unique(x)) < 2:
        return float(np.sum(w * y) / np.sum(w)), 0.0
    a_mat = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    coef, *_ = np.linalg.lstsq(a_mat, y * w, rcond=None)
    return float(coef[0]), float(coef[1])


def alpha_for_tau(tau: float, k: float) -> float:
    """The i.i.d. acceptance α whose :func:`expected_tokens` at draft length ``k`` equals ``tau`` (bisection; 0 when
    ``tau`` <= 1, 1 when ``tau`` >= k + 1). Serving engines report τ and the mean K; their own α = accepted / drafted
    also counts the drafted tokens after a step's first rejection, which can never be accepted, so it is lower than
    the per-token acceptance probability the cost model needs; this is that probability."""
    if k <= 0 or tau <= 1.0:
        return 0.0
    if tau >= k + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, k) < tau else (lo, mid)
    return (lo + hi) / 2


def _non_decreasing(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """A line that does not fall with context (a cost never does; a negative fitted slope is noise)."""
    a, b = fit_line(x, y)
    if b < 0:
        w = 1.0 / np.maximum(np.asarray(y, dtype=float), 1e-9)
        return float(np.sum(w * np.asarray(y, dtype=float)) / np.sum(w)), 0.0
    return a, b


def _fit_verify(by_n: dict[int, list[tuple[int, float]]]) -> dict[int, tuple[float, float]]:
    """T_v(n, L) = a_n + (c + d (n - 1)) L: a free intercept per n, and a context slope that is linear and
    non-decreasing in n (attention over L cached tokens costs ∝ n L). Per-n slopes fitted separately from a few
    contexts are noisy and can cross, which would make wide verifies cheaper than narrow ones at long contexts."""
    lines = {n: fit_line([c for c, _ in pts], [m for _, m in pts]) for n, pts in sorted(by_n.items())}
    if sum(1 for pts in by_n.values() if len({c for c, _ in pts}) > 1) < 1:
        return lines
    ns = sorted(lines)
    c, d = fit_line([n - 1 for n in ns], [lines[n][1] for n in ns], relative=False)
    if d < 0:  # no measurable growth with n: one common slope
        c, d = float(np.mean([lines[n][1] for n in ns])), 0.0
    c = max(c, 0.0)
    out = {}
    for n, pts in by_n.items():
        slope = c + d * (n - 1)
        w = np.array([1.0 / max(m, 1e-9) for _, m in pts])
        resid = np.array([m - slope * ctx for ctx, m in pts])
        out[n] = (float(np.sum(w * resid) / np.sum(w)), slope)
    return dict(sorted(out.items()))


def _medians_by_context(points: Iterable[tuple[int, float]]) -> list[tuple[float, float]]:
    """``[(L, median ms)]`` sorted by L: one value per measured context, or ``[]`` with fewer than 2 contexts (a
    curve needs two)."""
    by_ctx: dict[float, list[float]] = {}
    for ctx, ms in points:
        by_ctx.setdefault(float(ctx), []).append(float(ms))
    if len(by_ctx) < 2:
        return []
    return [(ctx, float(np.median(v))) for ctx, v in sorted(by_ctx.items())]


def _on_curve(curve: Sequence[tuple[float, float]], slope: float, context: float) -> float:
    """The measured curve at ``context``: piecewise linear between measured contexts, and outside them the nearest
    end extended with the fitted line's ``slope`` (ms per cached token)."""
    xs = [c for c, _ in curve]
    ys = [m for _, m in curve]
    if context < xs[0]:
        return ys[0] + slope * (context - xs[0])
    if context > xs[-1]:
        return ys[-1] + slope * (context - xs[-1])
    return float(np.interp(context, xs, ys))


@dataclass
class FittedCostModel(costmodel.CostModel):
    """The cost model (:class:`adaspec.controllers.costmodel.CostModel`: speedup, boundary α, best K) with cost
    curves fitted to the micro-measurements of one (target, dtype, threads, backend) setting; see the module
    docstring.

    Attributes:
        verify: ``{n: (a_n, c_n)}`` with T_v(n, L) = a_n + c_n L, in ms.
        draft: ``{drafter: (e, f)}`` with T_d(L) = e + f L per drafted token, in ms.
        overhead_ms: per-step engine overhead o.
        verify_curves: ``{n: [(L, ms), ...]}`` the measured medians per context of widths measured at two or more
            contexts; within them T_v(n, L) follows this curve, beyond them the line's slope ``c_n``.
        draft_curves: the same for draft models (slope ``f``).
    """

    verify: dict[int, tuple[float, float]]
    draft: dict[str, tuple[float, float]] = field(default_factory=dict)
    overhead_ms: float = 0.0
    verify_curves: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    draft_curves: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    # Fitting ------------------------------------------------------------------------------------------------
    @classmethod
    def fit(cls, verify_samples: Iterable[tuple[int, int, float]],
            draft_samples: Iterable[tuple[str, int, float]] = (), overhead_ms: float = 0.0) -> FittedCostModel:
        """Fit from micro-measurements.

        Args:
            verify_samples: ``(n, L, ms)``: a forward over n tokens after L cached ones took ms.
            draft_samples: ``(drafter, L, ms)``: one draft token at context L took ms.
            overhead_ms: per-step engine overhead.
        """
        by_n: dict[int, list[tuple[int, float]]] = {}
        for n, ctx, ms in verify_samples:
            by_n.setdefault(int(n), []).append((int(ctx), float(ms)))
        if 1 not in by_n:
            raise ConfigError("the cost model needs verify measurements with n = 1 (a plain step)")
        verify = _fit_verify(by_n)
        by_d: dict[str, list[tuple[int, float]]] = {}
        for name, ctx, ms in draft_samples:
            by_d.setdefault(name, []).append((int(ctx), float(ms)))
        draft = {name: _non_decreasing([c for c, _ in pts], [m for _, m in pts]) for name, pts in by_d.items()}
        verify_curves = {n: c for n, c in ((n, _medians_by_context(pts)) for n, pts in by_n.items()) if c}
        draft_curves = {d: c for d, c in ((d, _medians_by_context(pts)) for d, pts in by_d.items()) if c}
        return cls(verify, draft, float(overhead_ms), verify_curves, draft_curves)

    def _verify_at(self, n: int, context: float) -> float:
        """T_v at a measured width n: its measured curve in context where it has one, else its line."""
        a, c = self.verify[n]
        curve = self.verify_curves.get(n)
        return _on_curve(curve, c, context) if curve else a + c * context

    @property
    def k_max(self) -> int:
        """The longest draft whose verify width was measured (predictions beyond it would extrapolate in n)."""
        return max(self.verify) - 1

    # Cost curves --------------------------------------------------------------------------------------------
    def verify_ms(self, n: float, context: float) -> float:
        """T_v(n, L): per measured n, the measured curve in L (else the fitted line); linear interpolation (and
        end-segment extrapolation) in n."""
        ns = sorted(self.verify)
        vals = [self._verify_at(m, context) for m in ns]
        if len(ns) == 1:
            return vals[0]
        if n <= ns[0]:
            i = 0
        elif n >= ns[-1]:
            i = len(ns) - 2
        else:
            i = int(np.searchsorted(ns, n, side="right")) - 1
        n0, n1 = ns[i], ns[i + 1]
        return vals[i] + (vals[i + 1] - vals[i]) * (n - n0) / (n1 - n0)

    def draft_ms(self, drafter: str | float | None, context: float) -> float:
        """T_d(L) per token: a fitted drafter name, a fixed cost in ms (a number), or 0 for None/'ngram'."""
        if drafter is None or drafter == "ngram":
            return 0.0
        if isinstance(drafter, int | float):
            return float(drafter)
        if drafter not in self.draft:
            raise ConfigError(f"no draft cost measured for {drafter!r} (have: {sorted(self.draft) or 'none'})")
        e, f = self.draft[drafter]
        curve = self.draft_curves.get(drafter)
        return _on_curve(curve, f, context) if curve else e + f * context

    def step_overhead_ms(self) -> float:
        return self.overhead_ms

    # Serialisation ------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"verify": {str(n): list(v) for n, v in self.verify.items()},
                "draft": {d: list(v) for d, v in self.draft.items()}, "overhead_ms": self.overhead_ms,
                "verify_curves": {str(n): [list(p) for p in c] for n, c in self.verify_curves.items()},
                "draft_curves": {d: [list(p) for p in c] for d, c in self.draft_curves.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> FittedCostModel:
        return cls({int(n): tuple(v) for n, v in d["verify"].items()},
                   {k: tuple(v) for k, v in d.get("draft", {}).items()}, float(d.get("overhead_ms", 0.0)),
                   {int(n): [tuple(p) for p in c] for n, c in d.get("verify_curves", {}).items()},
                   {k: [tuple(p) for p in c] for k, c in d.get("draft_curves", {}).items()})


def leviathan_alpha(accepted: int, rejections: int) -> float:
    """Per-position acceptance α (Leviathan et al.'s β averaged): accepted / (accepted + rejections).

    A speculation step accepts drafts until the first rejection, so each step is a run of Bernoulli(α) trials
    stopped at the first failure or at K; this is the maximum-likelihood estimate of α. (The ``acceptance_rate``
    of :class:`~adaspec.stats.GenerationStats`, accepted / drafted, also counts drafts after a rejection, which are
    never examined, and so is lower.)
    """
    trials = accepted + rejections
    return accepted / trials if trials else 0.0


def relative_errors(pairs: Iterable[tuple[float, float]]) -> list[float]:
    """|predicted - measured| / measured for ``(predicted, measured)`` pairs with measured > 0."""
    return [abs(p - m) / m for p, m in pairs if m > 0 and not (math.isnan(p) or math.isnan(m))]


CostModel = FittedCostModel  # its name here before issue 40
