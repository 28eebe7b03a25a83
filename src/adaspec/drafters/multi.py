"""Several drafters behind one: a per-step choice between them (e.g. free n-gram lookup, else the draft model).

:class:`MultiDrafter` holds named drafters in preference order. Each step it proposes with one of them:

* **routed** — when the controller has a ``choose_drafter(options)`` method, the engine calls :func:`route` before
  the step: the controller sees :meth:`MultiDrafter.options` (name → how many tokens that drafter can propose now:
  0 = nothing, e.g. no n-gram match; None = no limit) and returns a name, or None for a plain step;
* **fallback** (any other controller) — the first drafter in order whose proposal is non-empty. With the default
  order ``[ngram, model]`` this is the "use a prompt-lookup match when one of useful length exists (it costs
  nothing), otherwise the draft model" rule of the hybrid drafter.

Controllers see only names and counts and drafters never see the controller, so neither knows the other's
internals. Each :class:`~adaspec.drafters.base.Draft` is tagged with the sub-drafter that made it
(``Draft.source``), which the engine records in :attr:`StepRecord.drafter <adaspec.stats.StepRecord>`, so
controllers keep per-drafter statistics.

Sub-drafters are prefilled lazily: a draft model that a request never uses costs nothing (its prompt prefill
would otherwise be paid even when every step is plain, or served by n-gram lookup). The first proposal of a
sub-drafter in a request pays its prefill inside that step's draft time (only the prompt tokens its cache lacks:
see :func:`cached_prefixes`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from adaspec.drafters.base import Draft, Drafter, DraftStop, Proposal, empty_draft, run_proposal
from adaspec.errors import ConfigError
from adaspec.processors import LogitsControls
from adaspec.sampling import SamplingParams


class MultiDrafter(Drafter):
    """Named drafters in preference order; one proposes per step (see the module docstring).

    Args:
        drafters: ``{name: drafter}`` in preference order (at least one).
        lazy_prefill: prefill a sub-drafter on its first use in a request instead of at the request's start.
    """

    def __init__(self, drafters: Mapping[str, Drafter], *, lazy_prefill: bool = True) -> None:
        if not drafters:
            raise ConfigError("MultiDrafter needs at least one drafter")
        self.drafters = dict(drafters)
        self.name = "+".join(self.drafters)
        self.lazy_prefill = lazy_prefill
        self._prompt: list[int] = []
        self._prefilled: set[str] = set()
        self._selected: str | None = None
        self._routed = False

    def for_sequence(self, seq: int) -> MultiDrafter:
        return MultiDrafter({name: d.for_sequence(seq) for name, d in self.drafters.items()},
                            lazy_prefill=self.lazy_prefill)

    def prefill(self, prompt_ids: list[int]) -> None:
        self._prompt = list(prompt_ids)
        self._prefilled.clear()
        self._selected, self._routed = None, False
        if not self.lazy_prefill:
            for name in self.drafters:
                self._ready(name)

    def finish(self, ids: list[int]) -> None:
        for name in self._prefilled:  # a sub-drafter never prefilled in this request has nothing of it
            self.drafters[name].finish(ids)

    def set_partition(self, partition: str) -> None:
        for drafter in self.drafters.values():
            drafter.set_partition(partition)

    def set_controls(self, controls: LogitsControls | None, prompt_len: int) -> None:
        for drafter in self.drafters.values():
            drafter.set_controls(controls, prompt_len)

    def _ready(self, name: str) -> Drafter:
        drafter = self.drafters[name]
        if name not in self._prefilled:
            drafter.prefill(self._prompt)
            self._prefilled.add(name)
        return drafter

    def options(self, ids: list[int]) -> dict[str, int | None]:
        """``{name: tokens it can propose now}``: a lookup drafter's :meth:`Drafter.available` (suffix decoding: the
        chain it would propose; n-gram lookup: the continuation after its match; 0 = nothing), None (no limit) for
        the others."""
        return {name: self._ready(name).available(ids) if drafter.lookup else None
                for name, drafter in self.drafters.items()}

    def select(self, name: str | None) -> None:
        """Use drafter ``name`` for the next proposal only (None: nothing; the engine then runs a plain step)."""
        if name is not None and name not in self.drafters:
            raise ConfigError(f"unknown drafter {name!r}; this MultiDrafter has {', '.join(self.drafters)}")
        self._selected, self._routed = name, True

    def propose(self, ids: list[int], k: int, sampling: SamplingParams, generator: torch.Generator | None = None,
                stop: DraftStop | None = None) -> Draft:
        return run_proposal(self.proposal(ids, k, sampling, generator, stop))

    def propose_tree(self, ids: list[int], depth: int, budget: int, sampling: SamplingParams,
                     generator: torch.Generator | None = None, expand: int | None = None) -> Draft:
        """The selected (or, unrouted, the first non-empty) sub-drafter's :meth:`Drafter.propose_tree`."""
        routed, selected = self._routed, self._selected
        self._selected, self._routed = None, False
        names = ([selected] if selected is not None else []) if routed else list(self.drafters)
        for name in names if depth > 0 else ():
            draft = self._ready(name).propose_tree(ids, depth, budget, sampling, generator, expand)
            if len(draft):
                draft.source = name
                return draft
        return empty_draft()

    def proposal(self, ids: list[int], k: int, sampling: SamplingParams, generator: torch.Generator | None = None,
                 stop: DraftStop | None = None) -> Proposal:
        routed, selected = self._routed, self._selected
        self._selected, self._routed = None, False
        if k <= 0:
            return empty_draft()
        names = ([selected] if selected is not None else []) if routed else list(self.drafters)
        for name in names:
            draft = yield from self._ready(name).proposal(ids, k, sampling, generator, stop)
            if len(draft):
                draft.source = name
                return draft
        return empty_draft()


def route(drafter: Drafter | None, controller, ids: list[int]) -> None:
    """Before a step: let a controller with ``choose_drafter(options) -> name | None`` pick the sub-drafter of a
    :class:`MultiDrafter`. A no-op for any other drafter or controller."""
    if isinstance(drafter, MultiDrafter) and controller.routes_drafters:
        drafter.select(controller.choose_drafter(drafter.options(ids)))


def drafter_parts(drafter: Drafter) -> dict[str, Drafter]:
    """``{name: drafter}``: each sub-drafter of a :class:`MultiDrafter`, or ``drafter`` alone under its name, named
    as :attr:`StepRecord.drafter <adaspec.stats.StepRecord>` names them."""
    return drafter.drafters if isinstance(drafter, MultiDrafter) else {drafter.name: drafter}


def cached_prefixes(drafter: Drafter, ids: list[int]) -> dict[str, int]:
    """``{name: leading tokens of ids it already holds}`` for ``drafter`` (per sub-drafter of a
    :class:`MultiDrafter`), named as :attr:`StepRecord.drafter <adaspec.stats.StepRecord>` names them. A lookup
    drafter (:attr:`Drafter.lookup`: n-gram lookup, suffix decoding) needs no feeding: all of
    ``ids``; any other: :meth:`Drafter.cached_prefix`."""
    parts = drafter_parts(drafter)
    return {name: len(ids) if d.lookup else d.cached_prefix(ids) for name, d in parts.items()}


def catch_up_limits(drafter: Drafter) -> dict[str, int]:
    """``{name: the most tokens it feeds to catch up}`` for the parts of ``drafter`` (named as
    :func:`cached_prefixes` names them) whose catch-up is bounded (:attr:`Drafter.catch_up`)."""
    parts = drafter_parts(drafter)
    return {name: d.catch_up for name, d in parts.items() if d.catch_up is not None}


def model_drafters(drafter: Drafter) -> dict[str, Drafter]:
    """``{name: drafter}`` of the draft models in ``drafter`` (each sub-drafter of a :class:`MultiDrafter`, named
    as :func:`cached_prefixes` names them) that have a backend to run: lookup drafters left out."""
    parts = drafter_parts(drafter)
    return {name: d for name, d in parts.items() if not d.lookup and d.backend is not None}


def measure_drafters(drafter: Drafter, feed_tokens: int = 64) -> dict[str, tuple[float, float]]:
    """``{name: (draft_ms, feed_ms)}`` per token for every draft model in ``drafter`` (each sub-drafter of a
    :class:`MultiDrafter`, named as :func:`cached_prefixes` names them), measured on its backend by
    :func:`~adaspec.backends.costcurve.measure_draft_costs`; its cache is left as it was. Lookup drafters (free
    to draft, nothing to feed) and drafters without a backend are left out. A backend without room for the
    measurement is skipped."""
    from adaspec.backends.costcurve import measure_draft_costs

    out = {}
    for name, d in model_drafters(drafter).items():
        try:
            out[name] = measure_draft_costs(d.backend, feed_tokens)
        except ValueError:  # no room in its context window: its first proposal is tried blind, as before
            continue
    return out
