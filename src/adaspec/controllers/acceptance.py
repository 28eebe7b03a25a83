"""Per-position acceptance of one drafter (α[i] = P(position i accepted | positions < i were)), for the goodput
controller (:mod:`adaspec.controllers.goodput`)."""

from __future__ import annotations


class Acceptance:
    """Per-position acceptance of one drafter: forgetful counts, shrunk toward the previous position."""

    def __init__(self, positions: int, forget: float, shrink: float, prior: float) -> None:
        self.accepted = [0.0] * positions
        self.reached = [0.0] * positions
        self.forget, self.shrink, self.prior = forget, shrink, prior

    def observe(self, drafted: int, accepted: int) -> None:
        for i in range(len(self.reached)):
            self.accepted[i] *= self.forget
            self.reached[i] *= self.forget
        for i in range(min(drafted, len(self.reached))):
            if i < accepted:
                self.accepted[i] += 1.0
                self.reached[i] += 1.0
            else:  # the first rejected position; later ones were never judged
                self.reached[i] += 1.0
                break

    def scale(self, factor: float) -> None:
        self.accepted = [a * factor for a in self.accepted]
        self.reached = [r * factor for r in self.reached]

    def rates(self) -> list[float]:
        """α[i] for each position i."""
        out, previous = [], self.prior
        for acc, reached in zip(self.accepted, self.reached):
            previous = (acc + self.shrink * previous) / (reached + self.shrink)
            out.append(previous)
        return out
