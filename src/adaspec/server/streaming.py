"""A streamed response (``"stream": true``): server-sent events for a request's ``n`` choices. Each choice waits for
its own place and generates; their chunks are interleaved as they come (``index`` tells them apart), each ends with
its own finish chunk. A client that leaves mid-stream stops its generations after the current step."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from concurrent.futures import Executor

from adaspec.server.dispatch import Admitted, Dispatcher
from adaspec.server.jobs import Job
from adaspec.server.protocol import APIError
from adaspec.server.responses import ChunkBuilder, Detokenizer, SSEResponse, job_error, sse, timeout_error, usage
from adaspec.server.structured import StreamedChoice

log = logging.getLogger("adaspec.server")


class ChoiceStream:
    """The events of one streamed request: one pump per choice feeds a merged queue that :meth:`events` turns into
    chunks; :meth:`cleanup` runs when the response ends (or never starts) and frees what the choices hold.

    Args:
        dispatcher: takes the choices' slots and starts their jobs.
        detok: token pieces for log-probabilities and the echoed prompt.
        render: the executor that builds large pieces (the echoed prompt's log-probabilities) off the loop.
        model: the served model's name (the chunks' ``model``).
        body, chat: the request and whether it is a chat completion.
        rid: the response id.
        admitted: the request's choices, with their places.
    """

    def __init__(self, dispatcher: Dispatcher, detok: Detokenizer, render: Executor, model: str, body, chat: bool,
                 rid: str, admitted: Admitted) -> None:
        self.dispatcher, self.detok, self.render = dispatcher, detok, render
        self.metrics = dispatcher.metrics
        self.body, self.chat, self.admitted = body, chat, admitted
        self.places, self.ids, self.cfgs = admitted.places, admitted.ids, admitted.cfgs
        n = len(admitted)
        self.jobs: list[Job | None] = [None] * n
        self.closed = False  # the response ended (or never started): no pump may start a generation after it
        self.chunk = ChunkBuilder(rid, model, chat, detok)
        self.scored = not chat and body.max_tokens == 0
        self.sent = [0] * n  # text offset of each choice's next completion token (completions' logprobs)
        self.streamed = [StreamedChoice(body._structured) for _ in range(n)] if chat else []

    def response(self) -> SSEResponse:
        return SSEResponse(self.events(), self.cleanup)

    async def pump(self, i: int, merged: asyncio.Queue) -> None:
        """Choice i's events into ``merged`` as (i, kind, item); always ends with (i, "end", None)."""
        place = self.places[i]
        try:
            await self.dispatcher.take_slot(self.admitted, i)
        except APIError as e:  # timed out in the queue
            await merged.put((i, "queue_error", e))
            await merged.put((i, "end", None))
            return
        except BaseException:  # cancelled (client gone) while queued; take_slot gave the place back
            self.metrics.outcome("cancelled")
            raise
        if self.closed:  # the response already ended: give the slot straight back
            place.give_back()
            return
        try:
            job = self.jobs[i] = self.dispatcher.start_job(self.admitted, i)
        except Exception as e:
            place.give_back()
            log.exception("could not start a generation")
            await merged.put((i, "queue_error", APIError(500, f"generation failed: {type(e).__name__}",
                                                          type="server_error")))
            await merged.put((i, "end", None))
            return
        while True:
            kind, item = await job.events.get()
            await merged.put((i, kind, item))
            if kind == "end":
                return

    async def events(self) -> AsyncIterator[str]:
        body, chat, ids, cfgs, chunk, scored, sent = (self.body, self.chat, self.ids, self.cfgs, self.chunk,
                                                      self.scored, self.sent)
        n = len(self.places)
        merged: asyncio.Queue = asyncio.Queue()
        pumps = [asyncio.ensure_future(self.pump(i, merged)) for i in range(n)]
        try:
            if chat:
                for i in range(n):
                    yield sse(chunk(i, None, role=True))
            echo = [body.echo] * n  # sent with a choice's first chunk, which carries the prompt's logprobs
            # The prompt is scored once, by choice 0: the other choices' events wait until its first event.
            shared = {"ready": not (body.echo and cfgs[0].prompt_logprobs is not None and n > 1), "lp": None}
            held: list = []
            ended = 0
            total_new = 0
            while ended < n:
                if shared["ready"] and held:
                    i, kind, item = held.pop(0)
                else:
                    i, kind, item = await merged.get()
                    if not shared["ready"]:
                        if i > 0:
                            held.append((i, kind, item))
                            continue
                        shared["ready"] = True
                        shared["lp"] = item.prompt_logprobs if kind == "chunk" else None
                if kind == "queue_error":
                    yield sse(item.body())
                elif kind == "chunk":
                    if echo[i]:
                        echo[i] = False
                        text = self.detok.prompt_text(body, ids)
                        prompt_lp = item.prompt_logprobs if item.prompt_logprobs is not None else shared["lp"]
                        lp_out = None
                        if cfgs[i].logprobs is not None:
                            lp_out = await asyncio.get_running_loop().run_in_executor(
                                self.render, self.detok.completion_logprobs, [], ids, prompt_lp)
                        yield sse(chunk(i, text, logprobs=lp_out))
                        sent[i] = len(text)
                    lp = item.logprobs if cfgs[i].logprobs is not None else None
                    if not scored and (item.text or lp):
                        if chat:
                            deltas = self.streamed[i].deltas(item.text)
                            for j, d in enumerate(deltas or ([{"content": ""}] if lp else [])):
                                yield sse(chunk(i, None, logprobs=lp if j == 0 else None, delta=d))
                        else:
                            out = self.detok.completion_logprobs(lp, offset=sent[i]) if lp is not None else None
                            if out is not None and out["tokens"]:  # offsets follow the tokens' pieces
                                sent[i] = out["text_offset"][-1] + len(out["tokens"][-1])
                            else:
                                sent[i] += len(item.text)
                            yield sse(chunk(i, item.text, logprobs=out))
                elif kind == "end":
                    ended += 1
                    job = self.jobs[i]
                    if job is None:
                        continue  # its queue error was sent
                    if job.error is not None:
                        yield sse(job_error(job).body())
                    elif job.outcome == "timeout" or job.result is None:
                        yield sse(timeout_error(self.dispatcher.request_timeout).body())
                    else:
                        total_new += usage(job, scored)["completion_tokens"]
                        finish = "length" if scored else job.result.finish_reason
                        if chat:
                            last, finish = self.streamed[i].finish(finish)
                            for d in last:
                                yield sse(chunk(i, None, delta=d))
                        yield sse(chunk(i, None, finish, speculation=job.summary()))
            if body.include_usage:
                done = [job for job in self.jobs if job is not None and job.result is not None]
                if done:
                    use = usage(done[0], scored)
                    use["completion_tokens"] = total_new
                    use["total_tokens"] = use["prompt_tokens"] + total_new
                    yield sse(chunk.usage_chunk(use))
            yield "data: [DONE]\n\n"
        finally:
            self.closed = True
            for t in pumps:
                t.cancel()

    def cleanup(self) -> None:
        never_ran = not self.closed
        self.closed = True
        for job, place in zip(self.jobs, self.places):
            if job is not None:
                if job.finished is None:
                    job.cancel.set()  # client gone mid-stream: stop after the current step
            elif place.state == "queued" and never_ran:  # the body never ran
                self.metrics.outcome("cancelled")
            place.give_back()  # no-op once handed to a job; a place still queued or holding goes back
