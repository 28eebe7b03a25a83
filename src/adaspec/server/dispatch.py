"""From a parsed request to running jobs: places in the FIFO queue (503 + Retry-After when full), the wait for a
running slot (504 at the deadline), and the start of a :class:`~adaspec.server.jobs.Job` on the generation thread
(alone, or as one row of the continuous batch)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from dataclasses import dataclass

from adaspec.engine import GenerationConfig
from adaspec.server.admission import Place, QueueFull, Scheduler, SlotTimeout, reserve_places
from adaspec.server.host import ModelHost
from adaspec.server.jobs import EngineHandle, Job
from adaspec.server.metrics import ServerMetrics
from adaspec.server.protocol import APIError


@dataclass
class Admitted:
    """A request's ``n`` choices, admitted: one place in the queue and one generation config per choice, all on
    one engine and prompt."""

    handle: EngineHandle
    ids: list[int]  # the prompt's token ids
    cfgs: list[GenerationConfig]  # choice i's
    places: list[Place]  # choice i's (reserved, maybe still queued)
    arrival: float  # time.monotonic() at arrival
    deadline: float  # time.monotonic() after which generation stops

    def __len__(self) -> int:
        return len(self.places)


class Dispatcher:
    """Admits requests to ``scheduler``'s slots and starts their jobs on ``host``; counts refusals in ``metrics``.

    ``request_timeout`` (seconds) is only named in the 504 message; a request's deadline is its caller's.
    """

    def __init__(self, host: ModelHost, scheduler: Scheduler, metrics: ServerMetrics, request_timeout: float) -> None:
        self.host, self.scheduler, self.metrics = host, scheduler, metrics
        self.request_timeout = request_timeout

    def retry_after(self) -> str:
        """Seconds until a place is likely free (the ``Retry-After`` header of a 503), 1 to 3600."""
        per = (self.host.service_s or 10.0) / self.scheduler.slots
        return str(max(1, min(3600, math.ceil(per * (self.scheduler.waiting + 1)))))

    def admit(self, handle: EngineHandle, ids: list[int], cfg: GenerationConfig, n: int, arrival: float,
              deadline: float, client: str | None) -> Admitted:
        """Places for ``n`` choices of one request, choice i sampling with ``cfg``'s seed + i (or its own random
        seed), as vLLM does for n > 1; the prompt is scored once, by choice 0 (its prompt logprobs serve every
        choice).

        Raises:
            APIError: as :meth:`reserve`.
        """
        places = self.reserve(n, client)
        cfgs = [cfg if i == 0 else dataclasses.replace(
                    cfg, seed=None if cfg.seed is None else (cfg.seed + i) % (1 << 64), prompt_logprobs=None)
                for i in range(n)]
        return Admitted(handle, ids, cfgs, places, arrival, deadline)

    def reserve(self, n: int, client: str | None) -> list[Place]:
        """One place per choice for a request of ``n`` choices from ``client`` (with ``--max-batch`` > 1 the
        choices decode together, up to the per-request cap).

        Raises:
            APIError: 400 when ``n`` exceeds every place the server has; 503 when the queue is full.
        """
        scheduler = self.scheduler
        if n > scheduler.slots + scheduler.max_waiting:
            self.metrics.outcome("invalid")
            raise APIError(400, f"n={n} choices need {n} places, but this server has {scheduler.slots} "
                                f"running and {scheduler.max_waiting} waiting", param="n")
        try:
            return reserve_places(scheduler, n, owner=object(), client=client)
        except QueueFull as e:
            self.metrics.outcome("rejected")
            raise APIError(503, f"the server is busy: {e}; retry later",
                           type="server_busy", code="queue_full", headers={"retry-after": self.retry_after()}) from None

    async def take_slot(self, admitted: Admitted, i: int) -> None:
        """Wait for choice ``i``'s slot; 504 when the deadline passes first (the place is given back either way)."""
        try:
            await admitted.places[i].acquire(admitted.deadline)
        except SlotTimeout:
            self.metrics.outcome("timeout")
            raise APIError(504, f"the request waited longer than this server's timeout of "
                                f"{self.request_timeout:g} s for the model", type="timeout_error",
                           code="timeout") from None

    def start_job(self, admitted: Admitted, i: int) -> Job:
        """Start generating choice ``i`` on its place's slot, which the job releases when the generation thread
        finishes. Must follow ``take_slot`` with no ``await`` in between (so no cancellation can land while the
        slot is unowned)."""
        host, place = self.host, admitted.places[i]
        loop = asyncio.get_running_loop()
        job = Job(host, admitted.handle, admitted.ids, admitted.cfgs[i], admitted.arrival, admitted.deadline,
                  self.metrics, loop)
        if host.runner is not None:  # a row of the continuous batch
            job.on_end = lambda: loop.call_soon_threadsafe(place.release_slot)
            place.hand_over()
            host.runner.submit(job)
            return job
        fut = loop.run_in_executor(host.generate_executor, job.run)  # raises: the place still holds the slot
        place.hand_over()
        fut.add_done_callback(lambda _: place.release_slot())
        return job
