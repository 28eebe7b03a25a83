"""Chain or token tree for the next speculation step, chosen from measured goodput.

A tree verifies more candidate tokens per target forward than a chain of the same depth: it pays when the extra
branches are accepted often enough to cover the wider forward (on a compute-bound CPU a 12-node tree costs more
than a 5-token chain; on a GPU almost nothing). Which side wins depends on the workload and the machine, so it is
measured, not assumed: :class:`TreeChoice` keeps, for each arm, the tokens emitted and the step time of its last
``window`` speculative steps and picks the arm with the higher tokens per millisecond (goodput), trying the other
arm again every ``explore_every`` steps so a change of regime is noticed (an ε-greedy two-armed bandit over a
sliding window, as the n-gram/draft choice of :mod:`adaspec.controllers.bandit` does for drafters).

The draft length K (the tree's depth) stays the controller's choice; the node budget is the request's
``tree_budget``. Both arms are exact: the choice changes speed only.
"""

from __future__ import annotations

from collections import deque


class TreeChoice:
    """Per-request chain/tree chooser.

    Args:
        window: speculative steps remembered per arm.
        explore_every: every this many steps the arm with the lower goodput is tried once.
        min_samples: steps each arm gets before the comparison is trusted (tried in turn first).
    """

    ARMS = ("tree", "chain")

    def __init__(self, window: int = 16, explore_every: int = 8, min_samples: int = 2) -> None:
        self.history = {arm: deque(maxlen=window) for arm in self.ARMS}
        self.explore_every = explore_every
        self.min_samples = min_samples
        self.steps = 0
        self.choices = {arm: 0 for arm in self.ARMS}

    def goodput(self, arm: str) -> float | None:
        """Tokens emitted per ms over the arm's remembered steps (None before any)."""
        h = self.history[arm]
        ms = sum(t for _, t in h)
        return sum(n for n, _ in h) / ms if h and ms > 0 else None

    def use_tree(self) -> bool:
        """True: propose a tree this step; False: a chain."""
        self.steps += 1
        short = [arm for arm in self.ARMS if len(self.history[arm]) < self.min_samples]
        if short:
            arm = short[0]
        else:
            best = max(self.ARMS, key=lambda a: self.goodput(a))
            worse = "chain" if best == "tree" else "tree"
            arm = worse if self.steps % self.explore_every == 0 else best
        self.choices[arm] += 1
        return arm == "tree"

    def update(self, tree: bool, emitted: int, step_ms: float) -> None:
        """Record one speculative step of the arm that ran (``emitted`` tokens in ``step_ms`` ms)."""
        self.history["tree" if tree else "chain"].append((emitted, step_ms))
