"""Shared machinery of the within-step draft-stop controllers (confidence, entropy).

A stop controller drafts up to ``k_max`` tokens per step and ends the draft after a token whose *score* (an
estimate of how likely the draft still is to be accepted) falls below a threshold. The threshold is tuned online
from verified outcomes, the way transformers tunes ``assistant_confidence_threshold``
(``AssistedCandidateGenerator.update_candidate_strategy``): keep the recent (score, outcome) pairs and choose the
threshold that minimises the cost of wrong decisions on them. transformers weighs a false continuation 1 and a
false stop 3; here both costs are measured: continuing past a token that is then rejected wastes one draft token
(t_draft ms), stopping before a token that would have been accepted forgoes a token worth one target step
(t_plain − t_draft ms).
"""

from __future__ import annotations

import statistics
from collections import deque

import torch

from adaspec.controllers.base import Controller
from adaspec.drafters.base import DraftStop
from adaspec.errors import ConfigError
from adaspec.stats import StepRecord


class Calibration:
    """P(a drafted token is accepted | the draft gave it probability q): per q-bin counts of verified outcomes,
    shrunk toward q itself (``prior`` pseudo-observations), so an unseen bin answers q."""

    def __init__(self, bins: int = 10, prior: float = 2.0) -> None:
        if bins < 1 or prior <= 0:
            raise ConfigError("need bins >= 1 and prior > 0")
        self.bins, self.prior = bins, prior
        self.accepted = [0.0] * bins
        self.seen = [0.0] * bins

    def _bin(self, q: float) -> int:
        return min(max(int(q * self.bins), 0), self.bins - 1)

    def __call__(self, q: float) -> float:
        b = self._bin(q)
        return (self.accepted[b] + self.prior * q) / (self.seen[b] + self.prior)

    def observe(self, qs: list[float], drafted: int, accepted: int) -> None:
        """Outcomes of one step whose draft positions had probabilities ``qs`` (positions past the first
        rejection were never judged)."""
        for i, q in enumerate(qs[:drafted]):
            if i > accepted:
                break
            b = self._bin(q)
            self.seen[b] += 1.0
            self.accepted[b] += float(i < accepted)


def best_threshold(pairs, cost_continue_wrong: float, cost_stop_wrong: float, default: float) -> float:
    """The threshold t minimising Σ_{score >= t, rejected} c_continue + Σ_{score < t, accepted} c_stop.

    ``pairs``: (score, accepted) with accepted in {0, 1}. Returns ``default`` until both outcomes were seen.
    Candidate thresholds are midpoints between neighbouring distinct scores (and the ends).
    """
    pairs = sorted(pairs)
    accepted_total = sum(y for _, y in pairs)
    if accepted_total == 0 or accepted_total == len(pairs):
        return default
    # Threshold below every score: nobody stops; the cost is every rejected pair continued.
    cost = cost_continue_wrong * (len(pairs) - accepted_total)
    best_cost, best = cost, pairs[0][0] - 1e-6
    i = 0
    while i < len(pairs):
        score = pairs[i][0]
        while i < len(pairs) and pairs[i][0] == score:  # move all pairs with this score to "stop"
            cost += cost_stop_wrong if pairs[i][1] else -cost_continue_wrong
            i += 1
        t = (score + pairs[i][0]) / 2 if i < len(pairs) else score + 1e-6
        if cost < best_cost:
            best_cost, best = cost, t
    return best


class StopController(Controller):
    """Base of the stop controllers: K = ``k_max`` every step, a draft stop on ``score(position, probs, token)``
    below ``threshold``, and the threshold tuned from outcomes (module docstring).

    Subclasses define :meth:`score` and may override :meth:`outcomes` (which (score, accepted) pairs a step
    yields; by default, each drafted position whose score was seen, until the first rejection).
    """

    def __init__(self, *, k_max: int = 8, threshold: float = 0.5, history: int = 400, min_pairs: int = 8,
                 tune: bool = True) -> None:
        if k_max < 1:
            raise ConfigError(f"k_max must be >= 1, got {k_max}")
        if history < min_pairs or min_pairs < 2:
            raise ConfigError("need 2 <= min_pairs <= history")
        self.k_max = k_max
        self.threshold = self.initial_threshold = threshold
        self.tune = tune
        self.min_pairs = min_pairs
        self.pairs: deque[tuple[float, int]] = deque(maxlen=history)
        self.scores: list[float] = []  # scores of the current step's draft, by position
        self.draft_ms: deque[float] = deque(maxlen=16)
        self.verify_ms: deque[float] = deque(maxlen=16)

    def next_k(self) -> int:
        return self.k_max

    def score(self, position: int, probs: torch.Tensor, token: int) -> float:
        """Acceptance estimate after drafting ``token`` at ``position`` from distribution ``probs``."""
        raise NotImplementedError

    def draft_stop(self) -> DraftStop:
        def stop(position: int, probs: torch.Tensor, token: int) -> bool:
            if position == 0:
                self.scores.clear()
            s = self.score(position, probs, token)
            self.scores.append(s)
            return s < self.threshold

        return stop

    def outcomes(self, step: StepRecord) -> list[tuple[float, int]]:
        return [(s, int(i < step.accepted)) for i, s in enumerate(self.scores[:step.drafted])
                if i <= step.accepted]

    def update(self, step: StepRecord) -> None:
        if not step.drafted:
            self.verify_ms.append(step.verify_ms)
            return
        self.draft_ms.append(step.draft_ms / step.drafted)
        self.verify_ms.append(step.verify_ms)
        if step.drafter and self.scores:
            self.pairs.extend(self.outcomes(step))
        self.scores.clear()
        if self.tune and len(self.pairs) >= self.min_pairs:
            t_draft = statistics.median(self.draft_ms)
            t_plain = statistics.median(self.verify_ms)
            self.threshold = best_threshold(self.pairs, t_draft, max(t_plain - t_draft, 0.05 * t_plain),
                                            self.threshold)

    def reset(self) -> None:
        self.scores.clear()
