"""Grammar-forced drafts: the tokens a request's grammar forces, proposed first, then any drafter for the rest.

Where the grammar (:mod:`adaspec.structured`) allows one continuation only (a key, a bracket, a quote, the rest of
an enum value), :meth:`~adaspec.structured.GrammarState.forced` gives its tokens. Proposing them costs no draft
forward, and where the mask allows that one token alone the constrained target accepts it with certainty (α = 1).
llguidance's forced tokens are the canonical tokenization of the forced bytes; where the bytes could be tokenized
otherwise, the target may choose another split, and verification decides (the drafts are drafts, never emitted
unverified). The wrapped drafter (n-gram, suffix, a draft model, any :class:`~adaspec.drafters.base.Drafter`)
continues after the forced tokens; the engine cuts its drafts where the grammar rejects them
(:mod:`adaspec.constrained`). Without a grammar this drafter is the wrapped one (or proposes nothing).

Both engines draft through :meth:`ForcedDrafter.free_proposal` (a batch runs the wrapped draft model's forwards
for all rows at once) and build a request's drafter with :func:`request_drafter`.
"""

from __future__ import annotations

import dataclasses

import torch

from adaspec.drafters.base import Draft, Drafter, DraftStop, Proposal, empty_draft, run_proposal
from adaspec.drafters.multi import route
from adaspec.sampling import SamplingParams
from adaspec.stats import StepRecord


class ForcedDrafter(Drafter):
    """Forced tokens of the request's grammar first, then ``inner`` (None: forced tokens only).

    Args:
        inner: the drafter for the free parts, or None.
        state: the request's grammar, anything with ``forced() -> list[int]`` standing at the sequence ``propose``
            is given (the engines bind their :class:`~adaspec.constrained.RequestGrammar` per request with
            :meth:`bound`).
    """

    def __init__(self, inner: Drafter | None = None, state=None, max_forced: int = 16) -> None:
        self.inner = inner
        self.state = state
        self.max_forced = max_forced
        self.name = "forced" if inner is None else f"forced+{inner.name}"

    def bound(self, state) -> ForcedDrafter:
        """This drafter for one request whose grammar state is ``state`` (None = no grammar)."""
        return ForcedDrafter(self.inner, state, self.max_forced)

    def for_sequence(self, seq: int) -> ForcedDrafter:
        """This drafter for batch row ``seq`` (:class:`adaspec.batch.BatchEngine`): the wrapped drafter's own
        per-row drafter behind the row's grammar (bound per request)."""
        return ForcedDrafter(self.inner.for_sequence(seq) if self.inner is not None else None, None, self.max_forced)

    @property
    def branches(self) -> bool:
        return False  # chains only: trees are not verified under a grammar

    # Delegation to the wrapped drafter ------------------------------------------------------------------------
    def prefill(self, prompt_ids: list[int]) -> None:
        if self.inner is not None:
            self.inner.prefill(prompt_ids)

    def set_partition(self, partition: str) -> None:
        if self.inner is not None:
            self.inner.set_partition(partition)

    def set_controls(self, controls, prompt_len: int) -> None:
        if self.inner is not None:
            self.inner.set_controls(controls, prompt_len)

    def finish(self, ids: list[int]) -> None:
        if self.inner is not None:
            self.inner.finish(ids)

    def cached_prefix(self, ids: list[int]) -> int:
        return self.inner.cached_prefix(ids) if self.inner is not None else len(ids)

    @property
    def lookup(self) -> bool:  # forced tokens alone need no feeding
        return self.inner is None or self.inner.lookup

    # Proposing ---------------------------------------------------------------------------------------------------
    def forced(self, k: int) -> list[int]:
        """Up to ``k`` tokens the grammar forces from its current state (none without a grammar)."""
        return self.state.forced()[:k] if self.state is not None and k > 0 else []

    def forced_now(self, room: int) -> list[int]:
        """The forced tokens a step with ``room`` tokens of budget proposes first: at most ``max_forced``."""
        return self.forced(min(self.max_forced, room))

    def propose_free(self, ids: list[int], forced: list[int], k: int, room: int, sampling: SamplingParams,
                     generator: torch.Generator | None = None, stop: DraftStop | None = None) -> tuple[Draft, int]:
        """:meth:`free_proposal` run alone: ``(draft, n forced)``."""
        return run_proposal(self.free_proposal(ids, forced, k, room, sampling, generator, stop))

    def free_proposal(self, ids: list[int], forced: list[int], k: int, room: int, sampling: SamplingParams,
                      generator: torch.Generator | None = None, stop: DraftStop | None = None) -> Proposal:
        """How the engines draft, as a :meth:`Drafter.proposal` generator that returns ``(draft, n forced)``: the
        forced tokens come on top of the controller's K, as they cost no draft forward and are accepted with
        certainty where the grammar allows one token; at most ``max_forced`` of them and ``room`` tokens in all
        (the request's token budget and context). ``k`` (the controller's K) goes to the wrapped drafter after
        them (its forwards are yielded, so a batch runs them with the other rows'). The engines tell the
        controller how many tokens are forced before it chooses K (:meth:`Controller.set_forced`) and hand it
        the step with the forced tokens counted apart (:func:`without_forced`), so its acceptance is the wrapped
        drafter's own and its prices include the forced tokens' verification. ``forced``: the tokens
        :func:`forced_first` read before the step."""
        forced = forced[:room]
        k = min(k, room - len(forced))
        if self.inner is None or k <= 0:
            return (Draft(torch.tensor(forced, dtype=torch.long), source="forced") if forced else empty_draft(),
                    len(forced))
        inner = yield from self.inner.proposal(ids + forced, k, sampling, generator, stop)
        return self._joined(forced, inner), len(forced)

    def propose(self, ids: list[int], k: int, sampling: SamplingParams, generator: torch.Generator | None = None,
                stop: DraftStop | None = None) -> Draft:
        """``[forced tokens] + inner's proposal after them``, at most ``k`` tokens. Forced tokens have a one-hot q
        (deterministic); with a model's q for the rest, their rows are one-hot rows of the same width."""
        forced = self.forced(k)
        rest = k - len(forced)
        if self.inner is None or rest <= 0:
            return Draft(torch.tensor(forced, dtype=torch.long), source="forced") if forced else empty_draft()
        return self._with_inner(ids, forced, rest, sampling, generator, stop)

    def _with_inner(self, ids: list[int], forced: list[int], k: int, sampling: SamplingParams,
                    generator: torch.Generator | None, stop: DraftStop | None) -> Draft:
        return self._joined(forced, self.inner.propose(ids + forced, k, sampling, generator, stop))

    def _joined(self, forced: list[int], inner: Draft) -> Draft:
        """``forced + inner`` as one chain (forced rows of q one-hot, where ``inner`` has a q)."""
        if not forced:
            return inner
        tokens = torch.cat([torch.tensor(forced, dtype=torch.long), inner.tokens])
        probs = inner.probs
        if probs is not None:
            width = max(probs.shape[-1], max(forced) + 1)
            probs = torch.nn.functional.pad(probs, (0, width - probs.shape[-1]))
            probs = torch.cat([torch.nn.functional.one_hot(torch.tensor(forced), width).float(), probs])
        return Draft(tokens, probs, inner.source or (self.inner.name if len(inner) else ""))


def request_drafter(drafter: Drafter | None, state, forced_drafts: bool = True) -> Drafter | None:
    """The drafter of one request: under a grammar (``state``) with ``forced_drafts``, ``drafter`` behind the
    grammar's forced tokens (a :class:`ForcedDrafter` bound to ``state``); else ``drafter``. Plain decoding (no
    drafter) stays plain; a :class:`ForcedDrafter` given as ``drafter`` is bound to the request's grammar."""
    if isinstance(drafter, ForcedDrafter):
        return drafter.bound(state if forced_drafts else None)
    if state is None or not forced_drafts or drafter is None:
        return drafter
    return ForcedDrafter(drafter, state)


def forced_first(drafter: Drafter | None, controller, ids: list[int], room: int) -> list[int]:
    """Before a step of either engine: the tokens the grammar forces, which the step proposes first
    (:meth:`ForcedDrafter.forced_now` within ``room`` tokens; none for any other drafter), told to ``controller``
    (``set_forced``: it prices K behind them), then the per-step choice of the wrapped drafter
    (:func:`~adaspec.drafters.multi.route`) on ``ids`` with them appended, where that drafter will continue."""
    forced = drafter.forced_now(room) if isinstance(drafter, ForcedDrafter) else []
    controller.set_forced(len(forced))
    route(unwrapped(drafter), controller, ids + forced if forced else ids)
    return forced


def unwrapped(drafter: Drafter | None) -> Drafter | None:
    """The drafter a :class:`ForcedDrafter` wraps (the one a controller routes and prices), else ``drafter``."""
    return drafter.inner if isinstance(drafter, ForcedDrafter) and drafter.inner is not None else drafter


def without_forced(step: StepRecord, n_forced: int) -> StepRecord:
    """``step`` as the controller sees it: the grammar's forced drafts taken out of ``drafted`` and ``accepted``
    (they cost no draft forward and their acceptance is the grammar's, not the drafter's), so K, acceptance and
    draft prices stay the wrapped drafter's, and counted in ``forced`` instead, so the forward's width
    (``forced + drafted + 1``) is known; with only forced drafts (or a forced token rejected), a step in which the
    wrapped drafter drafted nothing."""
    if not n_forced:
        return step
    accepted = max(0, step.accepted - n_forced) if step.accepted >= n_forced else 0
    drafted = step.drafted - n_forced if step.accepted >= n_forced else 0
    return dataclasses.replace(step, drafted=drafted, accepted=accepted, forced=step.drafted - drafted,
                               drafter=step.drafter if drafted else "")
