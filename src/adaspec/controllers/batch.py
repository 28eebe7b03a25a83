"""Batch-aware draft length: one cap on K for a whole batch, priced by the batch's total tokens.

A batched step runs the target once over every row's ``[pending] + drafts``: ``B · (K + 1)`` tokens. On hardware
where a forward's time grows with its token count (a CPU, or a GPU once the batch fills it), drafting competes with
the batch for the same compute: speculation that pays at B = 1 stops paying as B grows (vLLM turns it off above a
batch size; here it is decided from measurements). :class:`BatchPricer` chooses the cap K* that maximises the
batch's goodput

    goodput(K) = Σ_i E_i[tokens | min(k_i, K)] / (Σ_i [d_i · min(k_i, K) + c_i / H] + t_v(Σ_i (min(k_i, K) + 1)))

where ``k_i`` is row i's own controller's choice, ``E_i`` its expected emitted tokens (acceptance α_i of that row,
learned per row), ``d_i`` its drafter's measured ms per drafted token, ``c_i`` the one-off catch-up its drafter must
feed first when it drafts (a lazily prefilled draft model's prompt: the whole batch waits for it; counted only for
rows that draft, spread over ``H`` steps as the goodput controller spreads it) and ``t_v(n)`` the target's measured
cost of
one forward of n tokens (:func:`~adaspec.backends.costcurve.measure_verify_curve`, widths up to
``B_max · (K_max + 1)``; a multi-sequence batch of n tokens is priced as an n-token forward). K* = 0 is plain batched
decoding, chosen whenever no K beats it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from adaspec.backends.base import Backend
from adaspec.backends.costcurve import interpolate, measure_verify_curve
from adaspec.controllers.costmodel import expected_tokens

expected = expected_tokens  # its name here before issue 40


@dataclass
class RowEstimate:
    """What the pricer knows of one row: its controller's K, acceptance rate α (0..1), draft ms per token, and the
    one-off catch-up (ms) its drafter must feed before drafting this step (0 when it is in step)."""

    k: int
    alpha: float
    draft_ms: float
    catch_up_ms: float = 0.0


class BatchPricer:
    """Chooses the batch's cap on K from a measured cost curve (see the module docstring).

    Args:
        curve: ``{tokens in the forward: ms}``, as :func:`measure_verify_curve` returns; None = not measured yet
            (the cap is then the rows' own K: no batch pricing).
        k_max: largest K considered.
        horizon: steps a catch-up is spread over (as the goodput controller's ``horizon``).
    """

    def __init__(self, curve: Mapping[int, float] | None = None, k_max: int = 8, horizon: int = 16) -> None:
        self.curve = dict(curve) if curve else None
        self.k_max = k_max
        self.horizon = horizon
        self.context_len = 64  # the context the curve was measured at

    def calibrate(self, backend: Backend, max_batch: int, context_len: int = 64, repeats: int = 2) -> dict[int, float]:
        """Measure ``t_v(n)`` on ``backend``'s sequence 0 for n from 1 to ``max_batch · (k_max + 1)`` (a dozen widths,
        denser where batches of plain steps fall) and keep it. Returns the curve ({n: ms})."""
        top = max_batch * (self.k_max + 1)
        widths = sorted({n for n in (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
                         if n <= top} | {max_batch, top})
        backend.reset()
        self.context_len = min(context_len, backend.max_context - top)
        self.curve = measure_verify_curve(backend, widths, context_len=self.context_len, repeats=repeats)
        backend.reset()
        return self.curve

    def goodput(self, rows: Sequence[RowEstimate], cap: int) -> float:
        """Expected tokens per ms of one batched step with every row's K capped at ``cap``."""
        assert self.curve is not None
        tokens = draft = 0.0
        width = 0
        for r in rows:
            k = min(r.k, cap)
            tokens += expected_tokens(r.alpha, k)
            draft += r.draft_ms * k + (r.catch_up_ms / self.horizon if k > 0 else 0.0)
            width += k + 1
        return tokens / (draft + interpolate(self.curve, width))

    def cap(self, rows: Sequence[RowEstimate]) -> int:
        """The cap K* in ``0..max(k_i)`` with the best batch goodput (ties: the smaller K)."""
        top = min(max((r.k for r in rows), default=0), self.k_max)
        if self.curve is None or top == 0:
            return top
        best, best_rate = 0, self.goodput(rows, 0)
        for cap in range(1, top + 1):
            rate = self.goodput(rows, cap)
            if rate > best_rate * 1.0001:
                best, best_rate = cap, rate
        return best

    def best_positive(self, rows: Sequence[RowEstimate]) -> int:
        """The cap in ``1..max(k_i)`` with the best batch goodput (0 when no row wants to draft): what a probe step
        runs when :meth:`cap` says 0, so the rows' acceptance keeps being measured."""
        top = min(max((r.k for r in rows), default=0), self.k_max)
        if top == 0 or self.curve is None:
            return top
        return max(range(1, top + 1), key=lambda cap: self.goodput(rows, cap))

    def probe_cap(self, rows: Sequence[RowEstimate]) -> int:
        """What a probe step runs when :meth:`cap` says 0: :meth:`best_positive`, unless the drafting rows' catch-ups
        add up to more than one plain batched step (the whole batch would wait for a draft model's prompt to
        measure an acceptance the pricer turns off anyway); then 0."""
        cap = self.best_positive(rows)
        if cap == 0 or self.curve is None:
            return cap
        stall = sum(r.catch_up_ms for r in rows if min(r.k, cap) > 0)
        return cap if stall <= interpolate(self.curve, len(rows)) else 0
