"""Chain or token tree for the next speculation step, chosen from measured goodput on the same steps.

A tree verifies more candidate tokens per target forward than a chain of the same depth: it pays when the extra
branches are accepted often enough to cover the wider forward (on a compute-bound CPU an 8-node tree costs about
1.3 times a 5-token chain; on a GPU almost nothing). Which side wins depends on the workload and the machine, so it
is measured, not assumed.

Comparing the two arms' tokens per millisecond over the steps each happened to run is confounded: a tree is tried
on some steps and a chain on others, and prompt-lookup acceptance swings from step to step with the text. So the
comparison is **paired**: every tree step also says what the chain it contains (its main path, the drafter's first
guess: :func:`adaspec.tree.main_path`) would have emitted on that same step (the accepted path's common prefix with
the main path, plus the bonus token; exact for greedy verification, the same rule applied to sampled steps), and
what a chain of that depth costs comes from the remembered chain steps (by depth). Trees stay on while their
tokens per ms beat that counterfactual chain on the same steps, with a chain step every ``probe_every`` tree steps
so the chains' cost stays measured; otherwise chains run and a tree is probed again after ``probe_every`` chain
steps, a gap that doubles each time a probe loses (8, 16, 32, 64), as the goodput controller backs off its
probes.

**Width.** The draft length K (the tree's depth) stays the controller's choice; the tree's width (its node budget,
at most the request's ``tree_budget``) is chosen here from the same kind of evidence: the measured acceptance by
depth and rank on the remembered full-width tree steps and the measured cost of a verified node. Drafters add nodes
in rank order (the main path first, then each next branch: prompt lookup's next match, a draft model's next most
likely alternative) and a budget of B keeps the first B nodes, so for a full-width step whose accepted path ran
through nodes ``path`` (indices increase along a path) the tree cut to B nodes would have accepted the path's nodes
below B: exactly, for greedy verification. Its cost is the step's measured time less the marginal cost of the nodes
cut (at most their share of the step), a least-squares slope of verification ms over verified nodes on the
remembered steps (chains and trees). The width chosen is the one with the most tokens per ms over the remembered
full-width steps, at least one node beside the main path (whether any tree pays at all is the paired comparison
above); after every ``probe_every`` narrower tree steps one runs at full width to keep those curves measured.
Both arms are exact: the choice changes speed only. The chooser is one per engine and its windows span requests
(the last ``window`` steps of each kind), so evidence from earlier requests, at other contexts or budgets, counts
until newer steps replace it.

**What a tree would have done, on chain steps.** Exploring costs: a tree step that does not pay loses its extra
nodes' time, and a short request has few steps to win it back. Where the drafter's tree is free to build (prompt
lookup: no forward, no randomness; ``what_if=True``), every chain step also builds the tree it could have verified
and records what that tree would have emitted (:func:`adaspec.tree.would_emit`: exact where the tree's walk stops
inside the tokens the target emitted; where it runs past them, at least one more token, and each deeper node of
the branch counted at the chains' acceptance rate). Chains then run first, and a tree is tried (at first, and as a
probe later) only while what those trees would have emitted on the remembered chain steps, at the chain step's
time plus the extra nodes' cost, beats the chains' own tokens per ms on the same steps
(:meth:`TreeChoice.tree_may_pay`). Where no branch ever carries the target's token, no tree step is spent; the
paired comparison above still decides once trees have run.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from adaspec.drafters.base import Draft
from adaspec.stats import StepRecord
from adaspec.tree import would_emit


class AlwaysTrees:
    """``tree_choice="always"``: a full-width tree on every speculative step where one fits; learns nothing."""

    what_if = False

    def plan(self, depth: int, budget: int) -> int:
        """The next step's tree width in nodes (0: a chain) for a draft of ``depth`` levels within ``budget``."""
        return budget if depth > 0 and budget > 1 else 0

    def observe(self, step: StepRecord, draft: Draft, accepted: list[int], token: int, path: Sequence[int],
                what_if: Draft | None = None) -> None:
        """Record a step (nothing to learn here)."""


class TreeChoice:
    """Chain/tree chooser (one per engine, kept across requests: :meth:`adaspec.engine.SpeculativeEngine.
    _tree_choice`).

    Args:
        window: speculative steps remembered per arm.
        probe_every: chain steps before a tree is tried again after trees lost (doubled per lost probe), and tree
            steps between chain steps while trees win.
        max_probe_every: the largest gap between probes.
        min_samples: steps each arm gets before the comparison is trusted (tree first, then chain; chain first
            with ``what_if``), and full-width tree steps before a narrower width is chosen.
        what_if: chain steps report what the tree would have emitted (:meth:`update_what_if`), and trees are
            tried only while :meth:`tree_may_pay` (see the module docstring).
    """

    ARMS = ("tree", "chain")

    def __init__(self, window: int = 16, probe_every: int = 8, max_probe_every: int = 64,
                 min_samples: int = 2, what_if: bool = False) -> None:
        self.tree_steps: deque[tuple[int, float, int, int]] = deque(maxlen=window)  # (emitted, ms, chain's, depth)
        self.chain_steps: deque[tuple[int, float, int]] = deque(maxlen=window)  # (emitted, ms, depth)
        self.probe_every = self.gap = probe_every
        self.max_probe_every = max_probe_every
        self.min_samples = min_samples
        self.since_tree = 0
        self.since_chain = 0
        self.choices = {arm: 0 for arm in self.ARMS}
        # full-width tree steps: (depth, nodes, accepted path's node indices, total ms)
        self.full_steps: deque[tuple[int, int, tuple[int, ...], float]] = deque(maxlen=window)
        self.costs: deque[tuple[int, float]] = deque(maxlen=2 * window)  # (verified draft nodes, verification ms)
        self.since_full = 0
        self._full = True  # the width() just given was the full budget
        self.what_if = what_if
        # chain steps: (tokens emitted, ms, chain's draft nodes, depth, the tree's (fewest, most) per budget 1..n)
        self.what_ifs: deque[tuple[int, float, int, int, tuple[tuple[int, int], ...]]] = deque(maxlen=window)
        self.skipped = 0  # tree steps not tried because tree_may_pay() said no
        self._may_pay: bool | None = None  # tree_may_pay(), cached

    def goodput(self, arm: str) -> float | None:
        """Tokens emitted per ms over the arm's remembered steps (None before any)."""
        steps = self.tree_steps if arm == "tree" else self.chain_steps
        ms = sum(s[1] for s in steps)
        return sum(s[0] for s in steps) / ms if steps and ms > 0 else None

    def chain_ms(self, depth: int) -> float | None:
        """Measured ms of a chain step of ``depth`` drafted tokens: the mean over remembered chain steps of that
        depth, else of the nearest depth measured (None before any chain step)."""
        if not self.chain_steps:
            return None
        nearest = min({d for _, _, d in self.chain_steps}, key=lambda d: (abs(d - depth), d))
        times = [ms for _, ms, d in self.chain_steps if d == nearest]
        return sum(times) / len(times)

    def paired(self) -> tuple[float, float] | None:
        """``(tree tokens per ms, the contained chains' tokens per ms)`` over the remembered tree steps: the chains
        emitting what they would have on those steps, at the chain steps' measured cost of their depth."""
        if not self.tree_steps or not self.chain_steps:
            return None
        tree_ms = sum(ms for _, ms, _, _ in self.tree_steps)
        chain_ms = sum(self.chain_ms(d) for _, _, _, d in self.tree_steps)
        if tree_ms <= 0 or chain_ms <= 0:
            return None
        return (sum(e for e, _, _, _ in self.tree_steps) / tree_ms,
                sum(c for _, _, c, _ in self.tree_steps) / chain_ms)

    def trees_win(self) -> bool | None:
        """Whether trees beat their contained chains on the same steps (None before enough of both)."""
        if len(self.tree_steps) < self.min_samples or len(self.chain_steps) < self.min_samples:
            return None
        pair = self.paired()
        return None if pair is None else pair[0] > pair[1]

    def tree_may_pay(self) -> bool | None:
        """Whether a tree could beat the chains on the remembered chain steps (``what_if`` only). For each budget
        w of at least depth + 1 nodes (the narrowest :meth:`width` gives), over the steps whose tree that budget
        cuts (a tree of fewer nodes is all there): the tokens the trees would have emitted per ms, each step priced
        at its measured time plus :meth:`node_ms` per node beyond the chain's, against the chains' own tokens per ms
        on the same steps. A tree whose walk would run past the step's tokens counts its fewest plus each deeper
        node of that branch accepted at the chains' acceptance rate per drafted token (α + α² + ...). Before a
        node's cost is measured: whether any tree would have emitted more at all. None before any chain step was
        recorded. Cached until the next :meth:`update` or :meth:`update_what_if`."""
        if self._may_pay is not None or not self.what_ifs:
            return self._may_pay
        alpha = sum(s[0] - 1 for s in self.what_ifs) / max(sum(s[2] for s in self.what_ifs), 1)
        node_ms = self.node_ms()
        self._may_pay = False
        for w in range(1, max(len(s[4]) for s in self.what_ifs) + 1):
            emitted = chain = tree_ms = chain_ms = 0.0
            for chain_emitted, step_ms, nodes, depth, bounds in self.what_ifs:
                cut = min(w, len(bounds))
                if cut < min(depth + 1, len(bounds)):  # narrower than width() ever chooses for this depth
                    continue
                fewest, most = bounds[cut - 1]
                emitted += fewest + sum(alpha ** j for j in range(1, most - fewest + 1))
                chain += chain_emitted
                chain_ms += step_ms
                tree_ms += step_ms + (node_ms or 0.0) * max(cut - nodes, 0)
            if not chain or tree_ms <= 0 or chain_ms <= 0:
                continue
            if emitted > chain if node_ms is None else emitted / tree_ms > chain / chain_ms:
                self._may_pay = True
                break
        return self._may_pay

    def update_what_if(self, emitted: int, step_ms: float, nodes: int, depth: int,
                       bounds: Sequence[tuple[int, int]]) -> None:
        """Record a chain step of ``nodes`` drafted tokens at depth ``depth`` that emitted ``emitted`` tokens
        (its accepted ones plus the bonus) in ``step_ms`` ms, with ``bounds``: the fewest and most tokens the tree
        the drafter would have proposed there, cut to each budget 1..n, would have emitted
        (:func:`adaspec.tree.would_emit`)."""
        if bounds:
            self.what_ifs.append((emitted, step_ms, nodes, depth, tuple(bounds)))
            self._may_pay = None

    def plan(self, depth: int, budget: int) -> int:
        """The next step's tree width in nodes (0: a chain) for a draft of ``depth`` levels within ``budget``
        nodes: :meth:`use_tree`, then :meth:`width`."""
        if depth <= 0 or budget <= 1 or not self.use_tree():
            return 0
        return self.width(depth, budget)

    def observe(self, step: StepRecord, draft: Draft, accepted: list[int], token: int, path: Sequence[int],
                what_if: Draft | None = None) -> None:
        """Learn from one step that ran ``draft`` (a chain, or a tree when ``step.tree``): ``accepted`` its accepted
        draft tokens, ``token`` the target's next token, ``path`` the accepted nodes' indices, and ``what_if`` the
        tree a chain step could have verified (``what_if`` choosers only; None otherwise). Plain steps teach
        nothing."""
        if step.k <= 0:
            return
        self.update(step.tree, step.emitted, step.total_ms, chain_emitted(draft, accepted, step.emitted), step.k,
                    nodes=len(draft), path=path, verify_ms=step.verify_ms)
        if what_if is not None and len(what_if):
            parents = what_if.parents or list(range(-1, len(what_if) - 1))
            bounds = would_emit(what_if.tokens.tolist(), parents, accepted + [token])
            self.update_what_if(step.accepted + 1, step.total_ms, len(draft), step.k, bounds)

    def use_tree(self) -> bool:
        """True: propose a tree this step; False: a chain."""
        explore = False  # a tree step to learn whether trees pay (not one that trees have earned)
        if self.what_if and len(self.chain_steps) < self.min_samples:
            arm = "chain"
        elif len(self.tree_steps) < self.min_samples:
            arm, explore = "tree", True
        elif len(self.chain_steps) < self.min_samples:
            arm = "chain"
        elif self.trees_win():
            arm = "chain" if self.since_chain >= self.probe_every else "tree"  # keep the chain's cost measured
        else:
            arm, explore = ("tree", True) if self.since_tree >= self.gap else ("chain", False)
        if arm == "tree" and explore and self.what_if and not self.tree_may_pay():  # no evidence yet: no tree
            arm = "chain"
            self.skipped += 1
        self.since_tree = 0 if arm == "tree" else self.since_tree + 1
        self.since_chain = 0 if arm == "chain" else self.since_chain + 1
        self.choices[arm] += 1
        return arm == "tree"

    def node_ms(self) -> float | None:
        """Marginal verification ms per draft node: the least-squares slope of verification ms over verified
        nodes on the remembered steps; None until the steps span at least two node counts (or the slope is not
        positive)."""
        if len(self.costs) < 3:
            return None
        xs, ys = [x for x, _ in self.costs], [y for _, y in self.costs]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        if sxx <= 0:
            return None
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
        return slope if slope > 0 else None

    def width(self, depth: int, budget: int) -> int:
        """The node budget of the next tree step of ``depth`` levels, at most ``budget`` (see the module
        docstring): the full budget until ``min_samples`` full-width steps and a node cost are measured, and after
        every ``probe_every`` narrower tree steps; otherwise the width with the most tokens per ms on the remembered
        full-width steps, at least ``depth + 1``."""
        node_ms = self.node_ms()
        self._full = (len(self.full_steps) < self.min_samples or node_ms is None
                      or self.since_full >= self.probe_every or budget <= depth + 1)
        if self._full:
            return budget
        best, best_rate = budget, -1.0
        for side in range(1, budget - depth + 1):
            emitted = ms = 0.0
            for d, n, path, step_ms in self.full_steps:
                cut = min(d + side, n)
                emitted += 1 + sum(1 for i in path if i < cut)
                # less the cut nodes' cost, but never below their share of the step: a forward's cost has a fixed
                # part, so cutting tokens saves at most in proportion (an overestimated slope cannot make narrow
                # trees free)
                ms += max(step_ms - node_ms * (n - cut), step_ms * (cut + 1) / (n + 1))
            rate = emitted / ms if ms > 0 else 0.0
            if rate > best_rate * (1 + 1e-9):  # ties: the narrower tree
                best, best_rate = depth + side, rate
        return best

    def update(self, tree: bool, emitted: int, step_ms: float, chain_emitted: int | None = None,
               depth: int = 0, *, nodes: int | None = None, path: Sequence[int] = (),
               verify_ms: float | None = None) -> None:
        """Record one speculative step of the arm that ran: ``emitted`` tokens in ``step_ms`` ms at draft depth
        ``depth``; for a tree step, ``chain_emitted`` is what its main path alone would have emitted (default:
        ``emitted``, a tree without branches), ``nodes`` its node count and ``path`` the accepted nodes' indices
        (:func:`adaspec.tree.accepted_nodes`). ``verify_ms``, the step's verification time, prices a node for the
        width choice, against ``nodes`` (the draft's length, chain or tree; ``depth`` when not given)."""
        self._may_pay = None  # a node's cost may have moved
        if verify_ms is not None:
            self.costs.append((nodes if nodes is not None else depth, verify_ms))  # what was verified
        if tree:
            if self._full and nodes is not None:
                self.full_steps.append((depth, nodes, tuple(path), step_ms))
                self.since_full = 0
            else:
                self.since_full += 1
        before = self.trees_win()
        if tree:
            self.tree_steps.append((emitted, step_ms, emitted if chain_emitted is None else chain_emitted, depth))
        else:
            self.chain_steps.append((emitted, step_ms, depth))
        after = self.trees_win()
        if after or before is not False:  # trees win, or have just stopped winning: probe soon
            self.gap = self.probe_every
        elif tree and after is False:  # a probe that lost while trees were losing: wait longer before the next
            self.gap = min(2 * self.gap, self.max_probe_every)


def chain_emitted(draft: Draft, accepted: list[int], emitted: int) -> int:
    """What the chain inside a tree draft (its main path, :func:`adaspec.tree.main_path`) would have emitted on
    this step: its common prefix with the accepted path, plus the bonus token, at most ``emitted``. For a chain
    draft: ``emitted``."""
    if not draft.is_tree:
        return emitted
    main = draft.as_chain().tokens.tolist()
    n = 0
    while n < min(len(main), len(accepted)) and main[n] == accepted[n]:
        n += 1
    return min(n + 1, emitted)
