"""Building OpenAI response bodies: non-streamed choices, server-sent-event chunks, log-probabilities in OpenAI's two
formats (chat and completions), usage, and the errors a finished job answers with."""

from __future__ import annotations

import copy
import functools
import json
import threading
import time
from collections.abc import AsyncIterator, Callable

from fastapi.responses import StreamingResponse

from adaspec.errors import AdaspecError, ContextLengthError
from adaspec.server.jobs import Job
from adaspec.server.protocol import APIError
from adaspec.server.structured import chat_message


def sse(obj: dict) -> str:
    """One server-sent event carrying ``obj`` as JSON."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class SSEResponse(StreamingResponse):
    """A streaming response whose ``cleanup`` always runs, even when the body iterator never started (a client
    that disconnects before the first byte)."""

    def __init__(self, content: AsyncIterator[str], cleanup: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"cache-control": "no-cache", "x-accel-buffering": "no"})
        self._cleanup = cleanup

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._cleanup()


def usage(job: Job, scored: bool = False) -> dict:
    """OpenAI's ``usage`` of a finished job (``scored``: echo with ``max_tokens`` 0, no completion tokens), with
    ``prompt_tokens_details.cached_tokens``: prompt tokens the prefix cache held (not prefilled)."""
    s = job.result.stats
    new = 0 if scored else s.new_tokens
    return {"prompt_tokens": s.prompt_tokens, "completion_tokens": new, "total_tokens": s.prompt_tokens + new,
            "prompt_tokens_details": {"cached_tokens": s.cached_tokens}}


def job_error(job: Job) -> APIError:
    """The error a failed job answers with: 400 for what the request asked (an AdaspecError), else 500."""
    if isinstance(job.error, AdaspecError):
        return APIError(400, str(job.error), param="prompt" if isinstance(job.error, ContextLengthError) else None)
    return APIError(500, f"generation failed: {type(job.error).__name__}", type="server_error")


def timeout_error(request_timeout: float) -> APIError:
    """504 for a generation stopped at the deadline, ``request_timeout`` seconds after arrival."""
    return APIError(504, f"generation stopped: the request ran past this server's timeout of "
                         f"{request_timeout:g} s", type="timeout_error", code="timeout")


class Detokenizer:
    """Token pieces for log-probabilities and echoed prompts, from a private copy of ``tokenizer`` (the event-loop
    and render threads' own; one lock, pieces cached)."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = copy.deepcopy(tokenizer)
        self._lock = threading.Lock()
        self.piece = functools.lru_cache(maxsize=1 << 16)(self._piece)

    def _piece(self, token_id: int) -> str:
        with self._lock:
            return self._tokenizer.decode([token_id])

    def chat_logprobs(self, items) -> dict | None:
        """Chat's ``logprobs`` (``content``: token, logprob, bytes, top_logprobs) of ``items``, or None."""
        if items is None:
            return None

        def entry(token_id: int, logprob: float) -> dict:
            text = self.piece(token_id)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

        return {"content": [{**entry(t.token_id, t.logprob), "top_logprobs": [entry(i, v) for i, v in t.top]}
                            for t in items]}

    def completion_logprobs(self, items, prompt_ids=None, prompt_items=None, offset: int = 0) -> dict | None:
        """Completions' ``logprobs`` (parallel lists tokens, token_logprobs, top_logprobs, text_offset) of the
        prompt's scored tokens (when given) then ``items``, the text offsets counted from ``offset``; or None."""
        if items is None:
            return None
        pairs = []
        if prompt_ids is not None and prompt_items is not None:
            pairs += list(zip(prompt_ids, prompt_items))
        pairs += [(t.token_id, t) for t in items]
        tokens, values, tops, offsets = [], [], [], []
        for token_id, item in pairs:
            text = self.piece(token_id)
            tokens.append(text)
            values.append(item.logprob if item is not None else None)
            tops.append({self.piece(i): v for i, v in item.top} if item is not None and item.top else None)
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}

    def prompt_text(self, body, ids: list[int]) -> str:
        """The prompt as echoed: the request's own text, or its token ids decoded."""
        if isinstance(body.prompt, str):
            return body.prompt
        with self._lock:
            return self._tokenizer.decode(ids)


def completion_choices(jobs: list[Job], body, chat: bool, ids: list[int], detok: Detokenizer) -> list[dict]:
    """The ``choices`` of a non-streamed response, one per finished job (run it off the event loop: one decode per
    token and alternative)."""
    scored = not chat and body.max_tokens == 0  # echo + max_tokens 0: the prompt only
    shared_prompt_lp = jobs[0].result.prompt_logprobs  # scored once, by choice 0
    choices = []
    for i, job in enumerate(jobs):
        result = job.result
        logprobs = result.logprobs if not scored else ([] if result.logprobs is not None else None)
        if chat:
            message, finish = chat_message(body._structured, result.text, result.finish_reason)
            choice = {"index": i, "message": message, "logprobs": detok.chat_logprobs(logprobs),
                      "finish_reason": finish}
        else:
            text = "" if scored else result.text
            lp = detok.completion_logprobs(logprobs, ids if body.echo else None, shared_prompt_lp)
            if body.echo:
                text = detok.prompt_text(body, ids) + text
            choice = {"index": i, "text": text, "logprobs": lp,
                      "finish_reason": "length" if scored else result.finish_reason}
        if len(jobs) > 1:
            choice["speculation"] = job.summary()
        choices.append(choice)
    return choices


def completion_body(rid: str, chat: bool, model: str, choices: list[dict], jobs: list[Job], scored: bool) -> dict:
    """A non-streamed response: ``choices`` with usage summed over the jobs, and choice 0's speculation."""
    use = usage(jobs[0], scored)
    for job in jobs[1:]:
        extra = usage(job, scored)["completion_tokens"]
        use["completion_tokens"] += extra
        use["total_tokens"] += extra
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": choices, "usage": use, "speculation": jobs[0].summary()}


class ChunkBuilder:
    """Stream chunks of one response (``chat``: ``delta`` choices; else ``text`` choices)."""

    def __init__(self, rid: str, model: str, chat: bool, detok: Detokenizer) -> None:
        self.rid, self.model, self.chat, self.detok = rid, model, chat, detok
        self.created = int(time.time())
        self.object = "chat.completion.chunk" if chat else "text_completion"

    def __call__(self, i: int, delta_text: str | None, finish: str | None = None, *, role: bool = False,
                 logprobs=None, delta: dict | None = None, **extra) -> dict:
        """Choice ``i``'s chunk: ``delta_text`` (or an explicit chat ``delta``; ``role``: the opening
        assistant delta), its ``finish`` reason, and ``extra`` top-level fields."""
        if self.chat:
            delta = delta if delta is not None else {"role": "assistant", "content": ""} if role else (
                {"content": delta_text} if delta_text is not None else {})
            choice = {"index": i, "delta": delta, "logprobs": self.detok.chat_logprobs(logprobs),
                      "finish_reason": finish}
        else:
            choice = {"index": i, "text": delta_text or "", "logprobs": logprobs, "finish_reason": finish}
        return {"id": self.rid, "object": self.object, "created": self.created, "model": self.model,
                "choices": [choice], **extra}

    def usage_chunk(self, use: dict) -> dict:
        """The last chunk of ``stream_options.include_usage``: no choices, the response's usage."""
        return {"id": self.rid, "object": self.object, "created": self.created, "model": self.model, "choices": [],
                "usage": use}
