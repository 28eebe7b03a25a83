"""Confidence stop (SpecDec++-style): end the draft when it has probably gone wrong already.

Source: Huang et al. 2024, "SpecDec++: Boosting Speculative Decoding via Adaptive Candidate Lengths"
(arXiv 2405.19715). SpecDec++ casts the choice of draft length as a Markov decision process, shows the optimal
policy is a threshold policy (stop drafting once the probability that at least one drafted token will be rejected
exceeds h), and predicts per-token acceptance with a trained head. Training-free here: a token's acceptance
probability is estimated from the draft's own probability q of the token, calibrated online on verified outcomes
(per q-bin counts, shrunk toward q itself), and

    P(at least one rejection among tokens 0..i) = 1 − Π_{j<=i} â(q_j);   stop after token i when it exceeds h.

The threshold (here held as 1 − h on the "all accepted so far" score) is tuned online from outcomes as transformers
tunes ``assistant_confidence_threshold`` (see :mod:`adaspec.controllers.threshold`). K is at most ``k_max``.
"""

from __future__ import annotations

import torch

from adaspec.controllers.threshold import Calibration, StopController
from adaspec.stats import StepRecord


class ConfidenceController(StopController):
    """Drafts up to ``k_max`` tokens; stops once P(some drafted token is rejected) > h (tuned; starts at
    ``1 - threshold``). ``bins`` calibration bins over q; ``prior`` pseudo-observations toward â(q) = q."""

    name = "confidence"

    def __init__(self, *, k_max: int = 8, threshold: float = 0.5, bins: int = 10, prior: float = 2.0,
                 **kw) -> None:
        super().__init__(k_max=k_max, threshold=threshold, **kw)
        self.calibrated = Calibration(bins, prior)
        self.q: list[float] = []  # draft probabilities of the current step's tokens
        self._running = 1.0

    def score(self, position: int, probs: torch.Tensor, token: int) -> float:
        if position == 0:
            self.q.clear()
            self._running = 1.0
        q = float(probs[token])
        self.q.append(q)
        self._running *= self.calibrated(q)
        return self._running

    def update(self, step: StepRecord) -> None:
        if step.drafted and step.drafter:
            self.calibrated.observe(self.q, step.drafted, step.accepted)
        self.q.clear()
        super().update(step)
