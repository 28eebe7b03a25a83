"""Bandit controller: UCB over (drafter, K) arms, "no speculation" included; the reward is measured goodput.

Source: Hou et al. 2025, "BanditSpec: Adaptive Speculative Decoding via Bandit Algorithms" (arXiv 2505.15141),
which selects speculative-decoding configurations online with UCB-type bandits and no training; the index is
discounted UCB (Garivier and Moulines 2011) so old evidence fades when the text changes.

Each step plays one arm: plain decoding (K = 0), or drafter d with draft length K ∈ ``ks``. An arm's value is its
measured goodput, Σ emitted tokens / Σ step time over the steps that played it (discounted by ``discount`` per
step), relative to plain decoding's goodput; the arm played maximises

    value + c · sqrt(ln N / n_arm)

(N, n: discounted play counts). Every arm is played once first. With a
:class:`~adaspec.drafters.multi.MultiDrafter` the arms of a sub-drafter that cannot propose this step (no n-gram
match) are skipped. Statistics persist across requests.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from adaspec.controllers.base import Controller
from adaspec.errors import ConfigError
from adaspec.stats import StepRecord

PLAIN = ("", 0)


class BanditController(Controller):
    """Discounted UCB over arms ``(drafter, K)`` and plain decoding (module docstring)."""

    name = "bandit"

    def __init__(self, ks: Sequence[int] = (1, 2, 3, 4, 6, 8), *, c: float = 0.3, discount: float = 0.99) -> None:
        if not ks or min(ks) < 1:
            raise ConfigError(f"arms need draft lengths >= 1, got {list(ks)}")
        if c < 0 or not 0 < discount <= 1:
            raise ConfigError("need c >= 0 and 0 < discount <= 1")
        self.ks = tuple(sorted(set(ks)))
        self.c, self.discount = c, discount
        self.tokens: dict[tuple[str, int], float] = {}
        self.ms: dict[tuple[str, int], float] = {}
        self.plays: dict[tuple[str, int], float] = {}
        self._arm: tuple[str, int] | None = None

    def arms(self, options: Mapping[str, int | None] | None) -> list[tuple[str, int]]:
        if options is None:  # the engine's only drafter ("")
            return [PLAIN] + [("", k) for k in self.ks]
        out = [PLAIN]
        for d, cap in options.items():
            out += [(d, k) for k in self.ks if cap is None or (cap > 0 and k <= max(cap, self.ks[0]))]
        return out

    def value(self, arm: tuple[str, int]) -> float:
        """Goodput of ``arm`` relative to plain decoding's (plain's goodput when plain was never played)."""
        rate = self.tokens[arm] / self.ms[arm]
        base = self.tokens[PLAIN] / self.ms[PLAIN] if self.plays.get(PLAIN) else max(
            self.tokens[a] / self.ms[a] for a in self.plays)
        return rate / base

    def choose(self, options: Mapping[str, int | None] | None) -> tuple[str, int]:
        arms = self.arms(options)
        for arm in arms:
            if self.plays.get(arm, 0.0) <= 1e-9:
                return arm
        total = sum(self.plays[a] for a in arms)
        return max(arms, key=lambda a: self.value(a) + self.c * math.sqrt(math.log(max(total, 1.0)) / self.plays[a]))

    # Controller interface ---------------------------------------------------------------------------------
    def choose_drafter(self, options: Mapping[str, int | None]) -> str | None:
        self._arm = self.choose(options)
        return self._arm[0] or None

    def next_k(self) -> int:
        if self._arm is None:
            self._arm = self.choose(None)
        return self._arm[1]

    def update(self, step: StepRecord) -> None:
        arm, self._arm = self._arm, None
        if arm is None:  # update without a decision (never happens inside the engine)
            arm = PLAIN if step.k == 0 else ("", step.k)
        for a in self.plays:
            self.plays[a] *= self.discount
            self.tokens[a] *= self.discount
            self.ms[a] *= self.discount
        self.plays[arm] = self.plays.get(arm, 0.0) + 1.0
        self.tokens[arm] = self.tokens.get(arm, 0.0) + step.emitted
        self.ms[arm] = self.ms.get(arm, 0.0) + max(step.total_ms, 1e-6)

    def reset(self) -> None:
        self._arm = None
