"""Sizing a batch step's prefill and draft catch-up chunks by time (:class:`~adaspec.batch.BatchEngine`).

A step that prefills a long prompt in chunks delays every other row by that step's wall time. A fixed chunk
(vLLM's ``max_num_batched_tokens``, llama.cpp's ``--ubatch-size``) costs more as the prompt's context grows, so the
other rows' gaps grow with it; sizing the chunk by the measured cost per token keeps each step near a time budget.

The target forward is modelled as ``base + per_token × tokens`` ms: ``base`` is the one-token forward of the batch
pricer's measured curve (0 before calibration), ``per_token`` an exponential moving average over the forwards of
at least :data:`MIN_PREFILL_CHUNK` tokens (seeded from the curve's slope). A draft model's catch-up feed is priced
at its own measured ms per token fed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

#: The smallest prefill or catch-up chunk a time budget leaves a step (so a long prompt always advances).
MIN_PREFILL_CHUNK = 8


class StepCosts:
    """Measured ms per token of a batch's forwards and of its draft models' feeds.

    Args:
        weight: weight of the newest measurement in the moving averages, in (0, 1].
    """

    def __init__(self, weight: float = 0.5) -> None:
        if not 0 < weight <= 1:
            raise ValueError(f"weight must be in (0, 1], got {weight}")
        self.weight = weight
        self.base_ms = 0.0
        self.per_token_ms: float | None = None
        self._feed_ms: dict[str, float] = {}

    def _mix(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.weight) * old + self.weight * new

    def forward(self, tokens: int, ms: float, curve: Mapping[int, float] | None = None) -> None:
        """Record a target forward of ``tokens`` tokens that took ``ms``; ``curve`` ({tokens: ms}, the pricer's)
        gives the fixed part and, before any forward of ``MIN_PREFILL_CHUNK`` tokens, the slope."""
        if curve:
            widths = sorted(curve)
            self.base_ms = float(curve[widths[0]])
            if self.per_token_ms is None and len(widths) > 1 and widths[-1] > widths[0]:
                slope = (curve[widths[-1]] - curve[widths[0]]) / (widths[-1] - widths[0])
                self.per_token_ms = max(slope, 1e-3)
        if tokens >= MIN_PREFILL_CHUNK and ms > 0:
            self.per_token_ms = self._mix(self.per_token_ms, max((ms - self.base_ms) / tokens, 1e-3))

    def tokens_within(self, ms: float, other_tokens: int = 0) -> int | None:
        """Tokens a forward may add to ``other_tokens`` and still take at most ``ms``; None before any
        measurement (may be negative: the budget is spent)."""
        if self.per_token_ms is None:
            return None
        return int((ms - self.base_ms) / self.per_token_ms) - other_tokens

    def fed(self, name: str, tokens: int, ms: float) -> None:
        """Record draft model ``name`` fed ``tokens`` tokens in ``ms``."""
        if tokens > 0 and ms > 0:
            self._feed_ms[name] = self._mix(self._feed_ms.get(name), ms / tokens)

    def feed_tokens_within(self, name: str, ms: float, prior_ms_per_token: float | None = None) -> int | None:
        """Tokens draft model ``name`` may be fed in ``ms``; its measured cost, else ``prior_ms_per_token``, else
        None."""
        per = self._feed_ms.get(name, prior_ms_per_token)
        if per is None or per <= 0:
            return None
        return int(ms / per)


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int | None = None) -> int:
    """Length of the longest common prefix of ``a`` and ``b``, at most ``limit``."""
    n = min(len(a), len(b), len(a) if limit is None else limit)
    i, block = 0, 256
    while i < n:  # whole blocks compared at C speed, then the differing block token by token
        j = min(i + block, n)
        if a[i:j] != b[i:j]:
            while a[i] == b[i]:
                i += 1
            return i
        i = j
    return n
