"""The Drafter interface: propose up to K next tokens for a sequence."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from adaspec.errors import ConfigError
from adaspec.sampling import SamplingParams

if TYPE_CHECKING:
    from adaspec.backends.base import Backend
    from adaspec.processors import LogitsControls

DraftStop = Callable[[int, torch.Tensor, int], bool]
# What a proposal yields for batched drafting: (backend, tokens to feed it); it is sent back the ``[V]`` logits of the
# last fed position, and returns its Draft (see Drafter.proposal).
Proposal = Generator[tuple["Backend", list[int]], torch.Tensor, "Draft"]
"""``stop(position, probs, token) -> bool``, asked after each drafted token (position 0 = first draft token):
``probs`` is the draft's ``[V]`` float32 distribution at that position (softmax of the raw logits in greedy mode,
the sampling distribution q otherwise) and ``token`` the id it proposed. True ends the draft after this token."""


@dataclass
class Draft:
    """Proposed tokens.

    Attributes:
        tokens: ``[K']`` int64 proposed ids, K' <= K (may be empty).
        probs: ``[K', V]`` float32 distributions q the tokens were sampled from (sampling mode, model drafters), or
            None when the proposal is deterministic given the sequence (greedy mode, n-gram lookup).
        source: name of the drafter that made it, when that is not the engine's drafter itself (set by
            :class:`~adaspec.drafters.multi.MultiDrafter`); "" otherwise.
        parents: a token tree instead of a chain (:mod:`adaspec.tree`): ``parents[i]`` is the index of node i's
            parent, -1 for a child of the pending token; None for a chain (node i's parent is i - 1).
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    source: str = ""
    parents: list[int] | None = None

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def is_tree(self) -> bool:
        return self.parents is not None

    def as_chain(self) -> Draft:
        """This draft as a chain: a tree's main path (first child at every node, :func:`adaspec.tree.main_path`)."""
        if self.parents is None:
            return self
        from adaspec.tree import main_path

        path = main_path(self.parents)
        return Draft(self.tokens[path], None if self.probs is None else self.probs[path], self.source)


def empty_draft() -> Draft:
    return Draft(torch.empty(0, dtype=torch.long))


class Drafter(ABC):
    """Proposes continuations; knows nothing about the target, the verifier or the controller."""

    name: str = "drafter"
    #: :meth:`propose_tree` runs no forward, draws no random numbers and changes no state a later proposal sees (a
    #: lookup), so the engine may build trees it will not verify (:class:`~adaspec.controllers.tree_choice.TreeChoice`
    #: ``what_if``).
    free_trees: bool = False
    #: runs no model and needs no feeding (prompt lookup, suffix decoding): it is in step with any sequence.
    lookup: bool = False
    #: The most tokens one proposal feeds to catch up with the sequence (a draft model that restarts its cache from
    #: the sequence's last ``catch_up`` tokens when it lags further: :class:`~adaspec.drafters.model.ModelDrafter`);
    #: None: no bound.
    catch_up: int | None = None
    #: the draft model's backend (drafters that run a model); None for the others.
    backend: Backend | None = None

    def prefill(self, prompt_ids: list[int]) -> None:
        """Start a new sequence with ``prompt_ids`` (called once per request, before any ``propose``)."""

    def set_controls(self, controls: LogitsControls | None, prompt_len: int) -> None:
        """Take the request's sequence-dependent logits controls (penalties, logit bias; None = off) for the
        proposals until the next :meth:`prefill`; ``prompt_len`` leading tokens of ``ids`` are the prompt. Called by
        the engines after :meth:`prefill`. Optional: verification applies the controls to the target's logits, so
        output stays lossless whatever the proposal; a drafter that scores tokens (a draft model) uses them to
        propose what the controlled target will accept. Default: ignored (e.g. n-gram lookup copies text)."""

    def set_partition(self, partition: str) -> None:
        """Read and write only ``partition`` of a cache shared across requests (a server's API key's; the engines
        call it before :meth:`prefill` when the request names one). Default: ignored (a drafter that learns nothing
        across requests has no such cache)."""

    def finish(self, ids: list[int]) -> None:
        """The request prefilled last ended normally (EOS, a stop string, its length) with ``ids`` (prompt +
        output); called by the engines, never for a request that was cancelled or failed. A drafter that learns
        across requests (:class:`~adaspec.drafters.suffix.SuffixDrafter`) keeps the response. Default: nothing."""

    def for_sequence(self, seq: int) -> Drafter:
        """A drafter of the same kind and settings for batch row ``seq`` (:class:`adaspec.batch.BatchEngine`), with
        state of its own: a draft model runs on sequence ``seq`` of its backend, which must hold that many.

        Raises:
            ConfigError: this drafter cannot draft for batched rows.
            ValueError: ``seq`` out of the draft backend's range.
        """
        raise ConfigError(f"the {self.name} drafter cannot draft for batched rows")

    def available(self, ids: list[int]) -> int | None:
        """How many tokens it could propose after ``ids`` now (0: none), where a lookup can tell without drafting
        (:meth:`~adaspec.drafters.multi.MultiDrafter.options`); None: it cannot tell (a draft model proposes up to
        K). Default: None."""
        return None

    def forget(self) -> None:
        """Drop what it caches of the current sequence (a draft model's KV cache; the batch engine calls it as a
        row leaves). Default: nothing."""

    def cached_prefix(self, ids: list[int]) -> int:
        """How many leading tokens of ``ids`` this drafter already holds (e.g. a draft model's KV cache kept from an
        earlier request sharing that prefix), so a proposal after ``ids`` feeds only the rest. Default: 0."""
        return 0

    @abstractmethod
    def propose(self, ids: list[int], k: int, sampling: SamplingParams, generator: torch.Generator | None = None,
                stop: DraftStop | None = None) -> Draft:
        """Propose up to ``k`` tokens to follow ``ids`` (the whole sequence so far: prompt + output).

        ``ids`` only ever grows by appending within a request, except that tokens this drafter proposed and the
        verifier rejected never appear; drafters with caches reconcile against it.
        """

    @property
    def branches(self) -> bool:
        """The drafter can propose token trees (it overrides :meth:`propose_tree`; the default proposes a chain)."""
        return type(self).propose_tree is not Drafter.propose_tree

    def propose_tree(self, ids: list[int], depth: int, budget: int, sampling: SamplingParams,
                     generator: torch.Generator | None = None, expand: int | None = None) -> Draft:
        """Propose a token tree of at most ``budget`` nodes and ``depth`` levels (:mod:`adaspec.tree`). The
        default proposes a chain (:meth:`propose`); drafters that can branch override it. ``expand``: nodes a draft
        model expands per level (:class:`~adaspec.drafters.model.ModelDrafter`; None = its own setting, 0 =
        one-level trees); drafters without a model ignore it."""
        return self.propose(ids, depth, sampling, generator)

    def proposal(self, ids: list[int], k: int, sampling: SamplingParams, generator: torch.Generator | None = None,
                 stop: DraftStop | None = None) -> Proposal:
        """:meth:`propose` as a generator, so a batch can run many rows' draft forwards together
        (:class:`adaspec.batch.BatchEngine`): it yields ``(backend, tokens)`` for each forward it needs, is sent
        that forward's last-position ``[V]`` logits (or thrown the forward's error), and returns the
        :class:`Draft`. A drafter without a model (the default) returns at once; :func:`run_proposal` runs it
        alone."""
        return self.propose(ids, k, sampling, generator, stop)
        yield  # a generator function (never reached)


def run_proposal(proposal: Proposal) -> Draft:
    """Drive a :meth:`Drafter.proposal` alone: each forward it asks for runs on its backend, one at a time."""
    try:
        backend, tokens = next(proposal)
        while True:
            try:
                logits = backend.forward(tokens, 1)[-1]
            except BaseException as e:
                proposal.throw(e)  # the drafter cleans up and re-raises
                raise
            backend, tokens = proposal.send(logits)
    except StopIteration as done:
        return done.value
