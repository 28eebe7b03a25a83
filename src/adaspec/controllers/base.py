"""The Controller interface: choose the draft length K before each speculation step.

Like transformers' ``CandidateGenerator.update_candidate_strategy``, a controller only sees what happened (how
many tokens were drafted and accepted, and how long it took) and decides the next K; K = 0 means a plain
autoregressive step. Controllers know nothing about drafters.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING

from adaspec.drafters.base import DraftStop
from adaspec.stats import StepRecord

if TYPE_CHECKING:
    from adaspec.backends.base import Backend


class Controller(ABC):
    """Chooses K each step. Subclasses hold their own (small) state; ``reset`` starts a new request."""

    name: str = "controller"
    #: ``(draft ms, catch-up ms)`` the controller expects the step it just chose to cost (controllers that price
    #: steps: goodput); the batch pricer reads it. Default: nothing planned.
    planned: tuple[float, float] = (0.0, 0.0)

    @abstractmethod
    def next_k(self) -> int:
        """Draft length for the next step (0 = plain decoding). The engine clamps it to the tokens left."""

    def update(self, step: StepRecord) -> None:
        """Feedback after each step (plain steps included)."""

    def draft_stop(self) -> DraftStop | None:
        """Optional rule that ends a draft early within a step (None = always draft the full K)."""
        return None

    def reset(self) -> None:
        """Forget per-request state (called at the start of each request)."""

    def set_synced(self, synced: Mapping[str, int], catch_up: Mapping[str, int] | None = None) -> None:
        """After ``reset`` and the drafter's prefill: per drafter name, how many leading tokens of the sequence it
        already holds (see :func:`~adaspec.drafters.multi.cached_prefixes`), and for a drafter whose catch-up is
        bounded, the most tokens it feeds at once (:func:`~adaspec.drafters.multi.catch_up_limits`). Default:
        ignored."""

    def set_forced(self, n: int) -> None:
        """Before a step (before :meth:`choose_drafter` and :meth:`next_k`): the request's grammar forces the next
        ``n`` tokens, which the step verifies ahead of the K it drafts (free drafts, accepted where the grammar
        allows one token; :class:`~adaspec.drafters.forced.ForcedDrafter`). Default: ignored."""

    def seed_verify_costs(self, curve: Mapping[int, float], context_len: int, *,
                          level_from_steps: bool = True) -> None:
        """A measured verification cost curve (``{tokens in the forward: ms}`` at ``context_len``) for controllers
        that price steps (goodput), so a fresh controller does not start from priors; e.g. a batched request's own
        controller, seeded from the batch's calibration (``level_from_steps=False``: its observed steps time the
        whole batch's forward, so they do not set the seed's level). Default: ignored."""

    def seed_draft_costs(self, costs: Mapping[str, tuple[float, float]]) -> None:
        """Per drafter name, ``(draft_ms, feed_ms)``: a drafter's measured ms per drafted token and per token fed in
        a catch-up (:func:`~adaspec.backends.costcurve.measure_draft_costs`), for controllers that price steps
        (goodput), so a draft model's first proposal is priced before it is paid. Default: ignored."""

    @property
    def routes_drafters(self) -> bool:
        """It picks the sub-drafter of a :class:`~adaspec.drafters.multi.MultiDrafter` before each step (it overrides
        :meth:`choose_drafter`)."""
        return type(self).choose_drafter is not Controller.choose_drafter

    def choose_drafter(self, options: Mapping[str, int | None]) -> str | None:
        """The sub-drafter for the next step from ``options`` (name → tokens it can propose now, None = no limit;
        :meth:`MultiDrafter.options <adaspec.drafters.multi.MultiDrafter.options>`), or None for a plain step.
        Only called where :attr:`routes_drafters`. Default: the first name."""
        return next(iter(options), None)

    def calibrate(self, backend: Backend) -> Mapping[int, float] | None:
        """Measure ``backend``'s verification cost curve (``{tokens in the forward: ms}``) for controllers that
        price steps (goodput; the engine's warm-up calls it). Default: nothing measured (None)."""
        return None

    def draft_costs(self) -> dict[str, tuple[float, float]]:
        """Per drafter name, the ``(draft_ms, feed_ms)`` per token this controller has measured (goodput), so the
        next request's controller starts from them. Default: none."""
        return {}
