"""Admission to the model: the bounded FIFO queue in front of the running slots, per-request slot caps, and a
choice's place in it (event-loop thread only; no locks).

* :class:`Scheduler`: ``slots`` running slots and at most ``max_waiting`` waiters. A request (its ``owner``) holds
  at most ``per_owner`` slots at once, so an ``n``-choice request cannot take every slot: its further choices wait
  while other requests' waiters behind them are served first (as vLLM caps a request's share of the batch). Across
  clients (a ``client`` key: the caller's address) a freed slot goes to the waiter whose client holds the fewest
  slots (FIFO among equals), so one client's burst cannot starve another's single request; ``per_client_waiting``
  optionally caps one client's share of the queue.
* :class:`Place`: one choice's ticket through its life, queued → holding a slot → handed to a generation (which
  releases the slot when it ends) or given back. :meth:`Place.give_back` is idempotent and safe at any point, so a
  choice cancelled anywhere (a sibling choice failed, the client left) never keeps a slot: this is the fix of the
  ``n > 1`` slot leak (issue 41), where a choice cancelled just after being handed its slot never released it.

Waiting uses :func:`asyncio.wait`, never :func:`asyncio.wait_for`, whose Python <= 3.11 implementation can swallow a
cancellation that arrives as the awaited future completes (CPython gh-86296) and so start a generation nobody reads.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Hashable

from adaspec.errors import ConfigError


class QueueFull(Exception):
    """The wait queue is full."""


class SlotTimeout(Exception):
    """The deadline passed while waiting for a slot."""


class Scheduler:
    """``slots`` running slots and a bounded FIFO of waiters.

    ``reserve(owner)`` returns a future (the ticket) that resolves when the caller holds a slot (at once when one is
    free and ``owner`` holds fewer than ``per_owner``), or raises :class:`QueueFull` when ``max_waiting`` requests
    already wait. The holder calls ``release(owner)`` exactly once; a waiter that gives up calls
    ``abandon(ticket)`` (which releases if a slot had just been handed over).

    Raises:
        ConfigError: ``max_waiting`` < 0, ``slots`` < 1, ``per_owner`` < 1 or ``per_client_waiting`` < 1.
    """

    def __init__(self, max_waiting: int, slots: int = 1, per_owner: int | None = None,
                 per_client_waiting: int | None = None) -> None:
        if max_waiting < 0:
            raise ConfigError(f"max queue must be >= 0, got {max_waiting}")
        if slots < 1:
            raise ConfigError(f"slots must be >= 1, got {slots}")
        per_owner = slots if per_owner is None else per_owner
        if per_owner < 1:
            raise ConfigError(f"slots per request must be >= 1, got {per_owner}")
        if per_client_waiting is not None and per_client_waiting < 1:
            raise ConfigError(f"queue places per client must be >= 1, got {per_client_waiting}")
        self.per_client_waiting = per_client_waiting
        self._client_held: Counter = Counter()  # slots held per client
        self.max_waiting = max_waiting
        self.slots = slots
        self.per_owner = min(per_owner, slots)
        self.busy = 0  # slots held
        self._held: Counter = Counter()  # slots held per owner (None: anonymous holders, never capped)
        self._waiters: deque[tuple[asyncio.Future, Hashable, Hashable]] = deque()  # (ticket, owner, client)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def running(self) -> int:
        return self.busy

    def _may_take(self, owner: Hashable) -> bool:
        return self.busy < self.slots and (owner is None or self._held[owner] < self.per_owner)

    def _grant(self, fut: asyncio.Future, owner: Hashable, client: Hashable) -> None:
        self.busy += 1
        self._held[owner] += 1
        self._client_held[client] += 1
        fut.set_result(None)

    def reserve(self, owner: Hashable = None, client: Hashable = None) -> asyncio.Future:
        """Raises :class:`QueueFull` when the queue, or ``client``'s share of it, is full."""
        fut = asyncio.get_running_loop().create_future()
        if self._may_take(owner) and not self._waiters:
            self._grant(fut, owner, client)
            return fut
        if len(self._waiters) >= self.max_waiting:
            raise QueueFull(f"{len(self._waiters)} requests are already waiting for the model (queue limit "
                            f"{self.max_waiting})")
        if (self.per_client_waiting is not None
                and sum(c == client for _, _, c in self._waiters) >= self.per_client_waiting):
            raise QueueFull(f"this client already has {self.per_client_waiting} requests waiting for the model "
                            "(the per-client limit, --max-queue-per-client)")
        self._waiters.append((fut, owner, client))
        self._dispatch()  # a slot may be free while the waiters ahead are all at their owner's cap
        return fut

    def release(self, owner: Hashable = None, client: Hashable = None) -> None:
        """Give a held slot back; it passes to a waiter under its request's cap whose client holds the fewest
        slots (the first such waiter)."""
        self.busy = max(0, self.busy - 1)
        for held, key in ((self._held, owner), (self._client_held, client)):
            if held[key] > 0:
                held[key] -= 1
                if not held[key]:
                    del held[key]
        self._dispatch()

    def _dispatch(self) -> None:
        self._waiters = deque(w for w in self._waiters if not w[0].done())
        while self.busy < self.slots:
            ready = [i for i, (_, owner, _) in enumerate(self._waiters) if self._may_take(owner)]
            if not ready:
                return
            i = min(ready, key=lambda j: (self._client_held[self._waiters[j][2]], j))
            fut, owner, client = self._waiters[i]
            del self._waiters[i]
            self._grant(fut, owner, client)

    def abandon(self, ticket: asyncio.Future, owner: Hashable = None, client: Hashable = None) -> None:
        """A waiter gives up (``owner``, ``client``: those it reserved for)."""
        if ticket.done() and not ticket.cancelled():
            self.release(owner, client)  # it had been handed the slot
            return
        self._waiters = deque(w for w in self._waiters if w[0] is not ticket)
        ticket.cancel()


class Place:
    """One choice's place: ``queued`` → ``holding`` (a slot) → ``handed`` (to a generation, which releases the slot
    when it ends) or ``gone`` (given back). Event-loop thread only."""

    def __init__(self, scheduler: Scheduler, ticket: asyncio.Future, owner: Hashable = None,
                 client: Hashable = None) -> None:
        self.scheduler = scheduler
        self.ticket = ticket
        self.owner = owner
        self.client = client
        self.state = "queued"

    async def acquire(self, deadline: float) -> None:
        """Wait for the slot until ``deadline`` (``time.monotonic()``).

        Raises:
            SlotTimeout: the deadline passed first (the place is given back).
            asyncio.CancelledError: cancelled while waiting (the place is given back, the slot too if it had just
                been handed over).
        """
        try:
            if not self.ticket.done():
                await asyncio.wait({self.ticket}, timeout=max(0.0, deadline - time.monotonic()))
        except BaseException:
            self.give_back()
            raise
        if not self.ticket.done() or self.ticket.cancelled():
            self.give_back()
            raise SlotTimeout
        self.state = "holding"

    def hand_over(self) -> None:
        """The slot now belongs to a generation (which releases it through ``release_slot``)."""
        assert self.state == "holding", self.state
        self.state = "handed"

    def release_slot(self) -> None:
        """The generation this place was handed to has ended."""
        if self.state == "handed":
            self.state = "gone"
            self.scheduler.release(self.owner, self.client)

    def give_back(self) -> None:
        """Leave the queue or give the slot back (no-op once handed over or given back)."""
        if self.state == "queued":
            self.state = "gone"
            self.scheduler.abandon(self.ticket, self.owner, self.client)
        elif self.state == "holding":
            self.state = "gone"
            self.scheduler.release(self.owner, self.client)


def reserve_places(scheduler: Scheduler, n: int, owner: Hashable, client: Hashable = None) -> list[Place]:
    """``n`` places for one request (of ``client``), all or none.

    Raises:
        QueueFull: not all fit (the ones taken are given back).
    """
    places: list[Place] = []
    try:
        for _ in range(n):
            places.append(Place(scheduler, scheduler.reserve(owner, client), owner, client))
    except QueueFull:
        for p in places:
            p.give_back()
        raise
    return places
