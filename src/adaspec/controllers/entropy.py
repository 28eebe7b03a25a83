"""Entropy stop (AdaEDL): end the draft when an entropy-based lower bound on acceptance gets too low.

Source: Agrawal, Jeon and Lee 2024, "AdaEDL: Early Draft Stopping for Speculative Decoding of Large Language
Models via an Entropy-based Lower Bound on Token Acceptance Probability" (arXiv 2410.18351). The probability that
the target accepts a drafted token is bounded below by a function of the draft distribution's entropy H(q)
alone, approximately

    P(accept) >= 1 − sqrt(γ · H(q)),

so drafting stops after a token whose bound falls below λ. No training and no target-side signal: only the draft's
logits at each position. AdaEDL adapts λ during decoding from the observed acceptance; here λ is tuned online from
verified (bound, accepted) pairs with measured costs, like the other stop controller (see
:mod:`adaspec.controllers.threshold`). γ = 0.5 (the Pinsker constant, H in nats) unless given.
"""

from __future__ import annotations

import math

import torch

from adaspec.controllers.threshold import StopController
from adaspec.errors import ConfigError


def entropy_bound(probs: torch.Tensor, gamma: float) -> float:
    """1 − sqrt(γ · H(probs)), H in nats."""
    h = float(torch.special.entr(probs.float()).sum())
    return 1.0 - math.sqrt(gamma * max(h, 0.0))


class EntropyController(StopController):
    """Drafts up to ``k_max`` tokens; stops after a token whose entropy bound is below λ (tuned; starts at
    ``threshold``)."""

    name = "entropy"

    def __init__(self, *, k_max: int = 8, threshold: float = 0.4, gamma: float = 0.5, **kw) -> None:
        super().__init__(k_max=k_max, threshold=threshold, **kw)
        if gamma <= 0:
            raise ConfigError(f"gamma must be > 0, got {gamma}")
        self.gamma = gamma

    def score(self, position: int, probs: torch.Tensor, token: int) -> float:
        return entropy_bound(probs, self.gamma)
