"""The service behind the routes: :class:`CompletionService` holds the host, the queue, the metrics and the
request parser, and answers completions, chat completions, the model list and health.

A request's life: parse (:mod:`.parsing`) → take one place per choice in the FIFO queue and wait for running slots
(:mod:`.dispatch`) → generate on the generation thread → answer in one body (:meth:`CompletionService.complete`)
or as server-sent events (:mod:`.streaming`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from fastapi import Request
from fastapi.responses import Response

from adaspec.server.admission import Scheduler
from adaspec.server.dispatch import Admitted, Dispatcher
from adaspec.server.host import ModelHost
from adaspec.server.jobs import Job
from adaspec.server.limits import ScoringBudget, default_slots_per_request
from adaspec.server.metrics import ServerMetrics
from adaspec.server.parsing import RequestParser
from adaspec.server.protocol import APIError
from adaspec.server.responses import Detokenizer, completion_body, completion_choices, job_error, timeout_error
from adaspec.server.settings import ServerConfig
from adaspec.server.streaming import ChoiceStream


class CompletionService:
    """What the routes call, for a loaded ``host`` under ``config``. Starts the batch's generation loop when the
    host batches (``max_batch`` > 1); :meth:`close` stops the running generation and the render thread."""

    def __init__(self, host: ModelHost, config: ServerConfig) -> None:
        self.host, self.config = host, config
        self.served = served = config.served_model_name or host.name
        self.metrics = metrics = ServerMetrics(served, namespace=config.metrics_namespace)
        self.scheduler = scheduler = Scheduler(
            config.max_queue, slots=host.max_batch,
            per_owner=config.max_slots_per_request or default_slots_per_request(host.max_batch),
            per_client_waiting=config.max_queue_per_client)
        names = {served, host.name, *config.model_aliases}  # accepted as "model"
        budget = ScoringBudget(config.max_scored_tokens, config.max_scored_logits_mb << 20)
        score_chunk = budget.rows(host.vocab_size)
        host.set_max_scored_rows(score_chunk)
        self.render = ThreadPoolExecutor(1, thread_name_prefix="adaspec-render")  # builds large responses off the loop
        if host.batch is not None:
            host.start_runner(metrics)
        metrics.running.labels(served).set_function(lambda: scheduler.running)
        metrics.waiting.labels(served).set_function(lambda: scheduler.waiting)
        metrics.speculation_state(0 if host.default.plain else host.engine_for(host.default).controller.next_k())
        self.created = int(time.time())
        self.parser = RequestParser(host, config, names, served, budget, score_chunk)
        self.dispatcher = Dispatcher(host, scheduler, metrics, config.request_timeout)
        self.detok = Detokenizer(host.tokenizer)

    def close(self) -> None:
        """At shutdown: stop a running generation (so shutdown does not wait for it) and the render thread."""
        self.host.cancel_current()
        self.render.shutdown(wait=False, cancel_futures=True)

    # Small answers ---------------------------------------------------------------------------------------------
    def health(self) -> dict:
        scheduler = self.scheduler
        return {"status": "ok", "model": self.served, "running": scheduler.running, "waiting": scheduler.waiting,
                "max_queue": scheduler.max_waiting, "max_batch": self.host.max_batch}

    def model_card(self) -> dict:
        host = self.host
        return {"id": self.served, "object": "model", "created": self.created, "owned_by": "adaspec",
                "root": host.name, "max_model_len": host.max_context,
                "speculation": {**host.default.as_dict(), "available_drafters": host.available_drafters()}}

    def models(self) -> dict:
        return {"object": "list", "data": [self.model_card()]}

    def model(self, name: str) -> dict:
        """The card of the model called ``name``; APIError (404) for another name."""
        self.parser.check_model(name)
        return self.model_card()

    # Completions -----------------------------------------------------------------------------------------------
    async def generate(self, request: Request, body, chat: bool):
        """Answer a completion (``chat``: a chat completion): a response body, a stream, or 499 when the client left.

        Raises:
            APIError: the request is invalid (400/404/413), the queue is full (503), or it timed out (504).
        """
        try:
            arrival, handle, ids, cfg = await self.parser.prepare(request, body, chat)
        except APIError:
            self.metrics.outcome("invalid")
            raise
        admitted = self.dispatcher.admit(handle, ids, cfg, body.n, arrival, arrival + self.config.request_timeout,
                                        request.client.host if request.client else None)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        if body.stream:
            return ChoiceStream(self.dispatcher, self.detok, self.render, self.served, body, chat, rid,
                                admitted).response()
        return await self.complete(request, body, chat, rid, admitted)

    async def complete(self, request: Request, body, chat: bool, rid: str, admitted: Admitted):
        """A non-streamed answer: every choice generated, then one body (or 499 when the client left first)."""
        dispatcher = self.dispatcher
        jobs: list[Job | None] = [None] * len(admitted)

        async def one(i: int) -> None:
            """Choice i: wait for its place, generate, wait for its end."""
            await dispatcher.take_slot(admitted, i)
            job = jobs[i] = dispatcher.start_job(admitted, i)
            while (await job.events.get())[0] != "end":
                pass

        tasks = [asyncio.ensure_future(one(i)) for i in range(len(admitted))]
        watcher = asyncio.ensure_future(_disconnected(request))
        left = asyncio.Event()  # the client went away
        failed: BaseException | None = None
        try:
            pending = set(tasks)
            while pending and failed is None:
                done, _ = await asyncio.wait(pending | {watcher}, return_when=asyncio.FIRST_COMPLETED)
                if watcher in done:
                    left.set()
                    break
                pending -= done
                failed = next((t.exception() for t in done if not t.cancelled() and t.exception()), None)
        finally:
            watcher.cancel()
            for t in tasks:
                t.cancel()
            for job in jobs:
                if job is not None and job.finished is None:
                    job.cancel.set()  # its row stops after the current step; the job then releases its slot
            for place in admitted.places:
                place.give_back()  # a choice cancelled before it ran (or while queued) leaves no slot behind
        if failed is not None:
            raise failed
        if left.is_set():
            if all(j is None for j in jobs):
                self.metrics.outcome("cancelled")
            return Response(status_code=499)
        for job in jobs:
            if job.error is not None:
                raise job_error(job)
            if job.outcome == "timeout" or job.result is None:
                raise timeout_error(self.config.request_timeout)
        scored = not chat and body.max_tokens == 0  # echo + max_tokens 0: the prompt only
        rendered = await asyncio.get_running_loop().run_in_executor(self.render, completion_choices, jobs, body,
                                                                    chat, admitted.ids, self.detok)
        return completion_body(rid, chat, self.served, rendered, jobs, scored)


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
