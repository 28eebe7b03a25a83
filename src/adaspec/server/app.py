"""The FastAPI application: OpenAI-compatible routes, auth and body-size middlewares, OpenAI-style errors.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with ``stream``), ``GET /v1/models``,
``GET /v1/models/{model}``, ``GET /health`` (no auth), ``GET /metrics`` (Prometheus text format).

Request life: validate (pydantic; 400 with an OpenAI-style body naming the problem) → encode the prompt on the
encode thread → check it against the context window → take a place in the FIFO queue (503 + Retry-After when
full) → wait for a running slot (until the request's deadline: 504) → generate on the generation thread (alone, or
as one row of the continuous batch with ``--max-batch`` > 1) → answer. A client that goes away while queued leaves
the queue; one that goes away while generating stops its generation after the current step, which frees its slot
for the next request without disturbing the other rows.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import threading
import dataclasses
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from adaspec.engine import GenerationConfig
from adaspec.errors import AdaspecError, ConfigError, ContextLengthError
from adaspec.server.auth import KEY_ID_STATE, AuthMiddleware, api_keys, send_json
from adaspec.server.hostcheck import HostCheckMiddleware
from adaspec.server.limits import ScoringBudget, default_slots_per_request, refuse_lone_surrogates
from adaspec.server.metrics import ServerMetrics
from adaspec.server.protocol import APIError, ChatCompletionRequest, CompletionRequest, error_body
from adaspec.server.admission import Place, QueueFull, Scheduler, SlotTimeout, reserve_places
from adaspec.server.host import ModelHost
from adaspec.server.jobs import EngineHandle, Job
from adaspec.server.settings import ServerConfig
from adaspec.server.suffix_partitions import suffix_partition
from adaspec.server.structured import (StreamedChoice, StructuredPlan, chat_message, compile_request, plan_request,
                                       template_messages)

log = logging.getLogger("adaspec.server")

SAMPLING_EPS = 1e-5


# --------------------------------------------------------------------------------------------------------------
# Middlewares (pure ASGI, so streaming and disconnect detection pass through untouched)
# --------------------------------------------------------------------------------------------------------------


class BodyLimitMiddleware:
    """Reads the whole request body up front, answering 413 beyond ``max_bytes`` (declared or actual), then
    replays it to the app; later ``receive`` calls (disconnect detection) pass through."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_big = error_body(f"request body exceeds this server's limit of {self.max_bytes} bytes",
                             code="request_too_large")
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    return await send_json(send, 400, error_body("invalid Content-Length header"))
                if declared > self.max_bytes:
                    return await send_json(send, 413, too_big)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                return await send_json(send, 413, too_big)
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


# --------------------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------------------


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """One readable line naming the offending fields, and the first field's name as OpenAI's ``param``."""
    parts, param = [], None
    for err in exc.errors():
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        kind = err.get("type", "")
        if kind == "json_invalid":
            ctx = err.get("ctx", {}) or {}
            return f"the request body is not valid JSON: {ctx.get('error', err.get('msg'))}", None
        # Union members add their type names to the location ('str', 'list[int]', ...); keep the field path.
        loc = [x for x in loc if not any(c in x for c in "[]") and x not in
               ("str", "int", "float", "bool", "dict", "list", "function-after", "constrained-str")]
        where = ".".join(loc) or "body"
        if where == "body" and kind == "missing":
            return "the request needs a JSON object body", None
        msg = err.get("msg", "invalid value")
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        text = f"{where}: {msg}"
        if text not in parts:
            parts.append(text)
        if param is None and loc:
            param = loc[0]
    if not parts:
        return "invalid request", None
    shown = parts[:5]
    more = f" (and {len(parts) - 5} more)" if len(parts) > 5 else ""
    return "invalid request: " + "; ".join(shown) + more, param


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class _SSEResponse(StreamingResponse):
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


# --------------------------------------------------------------------------------------------------------------
# The application
# --------------------------------------------------------------------------------------------------------------


def create_app(host: ModelHost, config: ServerConfig | None = None) -> FastAPI:
    """Build the ASGI app around a loaded :class:`ModelHost`."""
    config = config or ServerConfig()
    served = config.served_model_name or host.name
    metrics = ServerMetrics(served, namespace=config.metrics_namespace)
    scheduler = Scheduler(config.max_queue, slots=host.max_batch,
                          per_owner=config.max_slots_per_request or default_slots_per_request(host.max_batch),
                          per_client_waiting=config.max_queue_per_client)
    names = {served, host.name, *config.model_aliases}  # accepted as "model"
    budget = ScoringBudget(config.max_scored_tokens, config.max_scored_logits_mb << 20)
    score_chunk = budget.rows(host.target.backend.vocab_size)
    if host.batch is not None:
        host.batch.max_scored_rows = score_chunk
    render = ThreadPoolExecutor(1, thread_name_prefix="adaspec-render")  # builds large responses off the loop
    if host.batch is not None:
        host.start_runner(metrics)
    metrics.running.labels(served).set_function(lambda: scheduler.running)
    metrics.waiting.labels(served).set_function(lambda: scheduler.waiting)
    metrics.speculation_state(0 if host.default.plain else host.engine_for(host.default).controller.next_k())
    created = int(time.time())
    limit = min(config.max_tokens_limit or host.max_context, host.max_context)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        host.cancel_current()  # stop a running generation so shutdown does not wait for it
        render.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="adaspec", version="0.1.0", lifespan=lifespan,
                  description="OpenAI-compatible API over adaspec's adaptive, lossless speculative decoding.")
    app.state.host = host
    app.state.metrics = metrics
    app.state.scheduler = scheduler
    app.state.config = config

    # Errors --------------------------------------------------------------------------------------------------
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        if request.url.path in ("/v1/completions", "/v1/chat/completions"):
            metrics.outcome("invalid")
        return JSONResponse(error_body(message, param=param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        return JSONResponse(error_body(message, type="invalid_request_error"), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(error_body(f"internal server error: {type(exc).__name__}", type="server_error"),
                            status_code=500)

    # Small routes --------------------------------------------------------------------------------------------
    @app.get("/health", summary="Liveness and queue state (no auth)")
    async def health() -> dict:
        return {"status": "ok", "model": served, "running": scheduler.running, "waiting": scheduler.waiting,
                "max_queue": scheduler.max_waiting, "max_batch": host.max_batch}

    def model_card() -> dict:
        return {"id": served, "object": "model", "created": created, "owned_by": "adaspec",
                "root": host.name, "max_model_len": host.max_context,
                "speculation": {**host.default.as_dict(), "available_drafters": host.available_drafters()}}

    @app.get("/v1/models", summary="The served model")
    async def list_models() -> dict:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model:path}", summary="One model")
    async def get_model(model: str) -> dict:
        check_model(model)
        return model_card()

    @app.get("/metrics", summary="Prometheus metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    # Generation ----------------------------------------------------------------------------------------------
    def check_model(name: str | None) -> None:
        if name is not None and name not in names:
            raise APIError(404, f"the model {name!r} does not exist on this server; it serves {served!r}",
                           param="model", code="model_not_found")

    def resolve_settings(body) -> EngineHandle:
        opts = body.speculation
        try:
            settings = host.normalise(opts.drafter, opts.controller, opts.k) if opts else host.default
        except ConfigError as e:
            raise APIError(400, str(e), param="speculation") from None
        return host.engine_for(settings)

    async def encode(body, chat: bool) -> list[int]:
        loop = asyncio.get_running_loop()
        try:
            if chat:
                messages = template_messages([m.as_template_message() for m in body.messages])
                tools = body._structured.tools.template_tools if body._structured.tools else None
                ids = await loop.run_in_executor(host.encode_executor, host.encode_chat, messages, tools)
            elif isinstance(body.prompt, str):
                ids = await loop.run_in_executor(host.encode_executor, host.encode_text, body.prompt)
            else:
                vocab = host.target.backend.vocab_size
                bad = [t for t in body.prompt if t >= vocab]
                if bad:
                    raise APIError(400, f"prompt token id {bad[0]} is out of range: this model's vocabulary has "
                                        f"{vocab} ids", param="prompt")
                ids = list(body.prompt)
        except APIError:
            raise
        except AdaspecError as e:
            raise APIError(400, str(e), param="messages" if chat else "prompt") from None
        except Exception as e:  # e.g. jinja2 TemplateError from a chat template
            if type(e).__module__.startswith("jinja2"):
                raise APIError(400, f"the chat template rejected these messages: {e}", param="messages") from None
            raise
        if not ids:
            raise APIError(400, "the prompt is empty (no tokens)", param="messages" if chat else "prompt")
        return ids

    def generation_config(body, prompt_len: int, chat: bool) -> GenerationConfig:
        ctx = host.max_context
        param = "messages" if chat else "prompt"
        if prompt_len >= ctx:
            raise APIError(400, f"this model's maximum context length is {ctx} tokens, but the prompt has "
                                f"{prompt_len} tokens; shorten it to at most {ctx - 1}", param=param,
                           code="context_length_exceeded")
        if body.max_tokens is None:
            max_tokens = max(1, min(config.default_max_tokens, limit, ctx - prompt_len))
        else:
            max_tokens = max(1, body.max_tokens)  # 0 (echo: score the prompt) still runs the prefill's token
            if max_tokens > limit:
                raise APIError(400, f"max_tokens={max_tokens} exceeds this server's limit of {limit}",
                               param="max_tokens")
            if prompt_len + max_tokens > ctx:
                raise APIError(400, f"this model's maximum context length is {ctx} tokens; you requested "
                                    f"{prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} "
                                    f"in the completion); reduce the prompt or max_tokens", param="max_tokens",
                               code="context_length_exceeded")
        seed = body.seed % (1 << 64) if body.seed is not None else None
        # Like vLLM, temperatures this close to 0 mean greedy (dividing logits by them overflows to inf/NaN).
        temperature = body.temperature if body.temperature >= SAMPLING_EPS else 0.0
        bias = body.token_bias
        if bias:
            vocab = host.target.backend.vocab_size
            bad = [t for t in bias if t >= vocab]
            if bad:
                raise APIError(400, f"logit_bias: token id {bad[0]} is out of range: this model's vocabulary has "
                                    f"{vocab} ids", param="logit_bias")
        want = body.want_logprobs
        if body.echo and want is not None:
            budget.check(prompt_len)
        try:
            return GenerationConfig(max_new_tokens=max_tokens, temperature=temperature, top_p=body.top_p,
                                    top_k=max(0, body.top_k), seed=seed, stop=body.stop_list,
                                    ignore_eos=body.ignore_eos,
                                    strict=body.strict if body.strict is not None else (config.strict or None),
                                    repetition_penalty=body.repetition_penalty,
                                    presence_penalty=body.presence_penalty,
                                    frequency_penalty=body.frequency_penalty, logit_bias=bias, min_p=body.min_p,
                                    logprobs=want, prompt_logprobs=want if body.echo and want is not None else None,
                                    prompt_logprobs_chunk=score_chunk)
        except ConfigError as e:
            raise APIError(400, str(e)) from None

    def retry_after() -> str:
        per = (host.service_s or 10.0) / scheduler.slots
        return str(max(1, min(3600, math.ceil(per * (scheduler.waiting + 1)))))

    async def take_slot(place: Place, deadline: float) -> None:
        """Wait for ``place``'s slot; 504 when the deadline passes first (the place is given back either way)."""
        try:
            await place.acquire(deadline)
        except SlotTimeout:
            metrics.outcome("timeout")
            raise APIError(504, f"the request waited longer than this server's timeout of "
                                f"{config.request_timeout:g} s for the model", type="timeout_error",
                           code="timeout") from None

    def start_job(handle: EngineHandle, ids: list[int], cfg: GenerationConfig, arrival: float,
                  deadline: float, place: Place) -> Job:
        """Start generating on ``place``'s slot, which the job releases when the generation thread finishes. Must
        follow ``take_slot`` with no ``await`` in between (so no cancellation can land while the slot is unowned)."""
        loop = asyncio.get_running_loop()
        job = Job(host, handle, ids, cfg, arrival, deadline, metrics, loop)
        if host.runner is not None:  # a row of the continuous batch
            job.on_end = lambda: loop.call_soon_threadsafe(place.release_slot)
            place.hand_over()
            host.runner.submit(job)
            return job
        fut = loop.run_in_executor(host.generate_executor, job.run)  # raises: the place still holds the slot
        place.hand_over()
        fut.add_done_callback(lambda _: place.release_slot())
        return job

    async def prepare(request: Request, body, chat: bool):
        arrival = time.monotonic()
        refuse_lone_surrogates(body)
        check_model(body.model)
        handle = resolve_settings(body)
        plan = plan_request(body) if chat else StructuredPlan()
        if chat:
            body._structured = plan
        ids = await encode(body, chat)
        cfg = generation_config(body, len(ids), chat)
        key = None if config.suffix_share else getattr(request.state, KEY_ID_STATE, None)
        cfg = dataclasses.replace(cfg, cache_partition=suffix_partition(key))
        if plan.constraint is not None:  # compiled before the request takes a place (400 on a bad grammar)
            await asyncio.get_running_loop().run_in_executor(host.encode_executor, compile_request, host, handle,
                                                             plan)
            cfg = dataclasses.replace(cfg, response_format=plan.constraint)
        return arrival, handle, ids, cfg

    def timeout_error() -> APIError:
        return APIError(504, f"generation stopped: the request ran past this server's timeout of "
                             f"{config.request_timeout:g} s", type="timeout_error", code="timeout")

    def job_error(job: Job) -> APIError:
        if isinstance(job.error, AdaspecError):
            return APIError(400, str(job.error), param="prompt" if isinstance(job.error, ContextLengthError) else None)
        return APIError(500, f"generation failed: {type(job.error).__name__}", type="server_error")

    def usage(job: Job, scored: bool = False) -> dict:
        s = job.result.stats
        new = 0 if scored else s.new_tokens
        return {"prompt_tokens": s.prompt_tokens, "completion_tokens": new, "total_tokens": s.prompt_tokens + new}

    # Log-probabilities (OpenAI's two formats) ---------------------------------------------------------------
    detok = copy.deepcopy(host.tokenizer)  # the event-loop and render threads' own copy
    detok_lock = threading.Lock()

    @functools.lru_cache(maxsize=1 << 16)
    def piece(token_id: int) -> str:
        with detok_lock:
            return detok.decode([token_id])

    def chat_logprobs(items) -> dict | None:
        if items is None:
            return None

        def entry(token_id: int, logprob: float) -> dict:
            text = piece(token_id)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

        return {"content": [{**entry(t.token_id, t.logprob), "top_logprobs": [entry(i, v) for i, v in t.top]}
                            for t in items]}

    def completion_logprobs(items, prompt_ids=None, prompt_items=None, offset: int = 0) -> dict | None:
        if items is None:
            return None
        pairs = []
        if prompt_ids is not None and prompt_items is not None:
            pairs += list(zip(prompt_ids, prompt_items))
        pairs += [(t.token_id, t) for t in items]
        tokens, values, tops, offsets = [], [], [], []
        for token_id, item in pairs:
            text = piece(token_id)
            tokens.append(text)
            values.append(item.logprob if item is not None else None)
            tops.append({piece(i): v for i, v in item.top} if item is not None and item.top else None)
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}

    def prompt_text(body, ids: list[int]) -> str:
        if isinstance(body.prompt, str):
            return body.prompt
        with detok_lock:
            return detok.decode(ids)

    async def generate(request: Request, body, chat: bool):
        try:
            arrival, handle, ids, cfg = await prepare(request, body, chat)
        except APIError:
            metrics.outcome("invalid")
            raise
        deadline = arrival + config.request_timeout
        if body.n > scheduler.slots + scheduler.max_waiting:
            metrics.outcome("invalid")
            raise APIError(400, f"n={body.n} choices need {body.n} places, but this server has {scheduler.slots} "
                                f"running and {scheduler.max_waiting} waiting", param="n")
        try:  # one place per choice (with --max-batch > 1 the choices decode together, up to the per-request cap)
            places = reserve_places(scheduler, body.n, owner=object(),
                                    client=request.client.host if request.client else None)
        except QueueFull as e:
            metrics.outcome("rejected")
            raise APIError(503, f"the server is busy: {e}; retry later",
                           type="server_busy", code="queue_full", headers={"retry-after": retry_after()}) from None
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        # choice i samples with seed + i (or its own random seed), as vLLM does for n > 1; the prompt is scored
        # once, by choice 0 (its prompt logprobs serve every choice)
        cfgs = [cfg if i == 0 else dataclasses.replace(
                    cfg, seed=None if cfg.seed is None else (cfg.seed + i) % (1 << 64), prompt_logprobs=None)
                for i in range(body.n)]
        if body.stream:
            return stream_response(request, body, chat, rid, places, handle, ids, cfgs, arrival, deadline)
        return await complete(request, body, chat, rid, places, handle, ids, cfgs, arrival, deadline)

    async def _disconnected(request: Request) -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    async def complete(request, body, chat, rid, places, handle, ids, cfgs, arrival, deadline):
        jobs: list[Job | None] = [None] * len(places)

        async def one(i: int) -> None:
            """Choice i: wait for its place, generate, wait for its end."""
            await take_slot(places[i], deadline)
            job = jobs[i] = start_job(handle, ids, cfgs[i], arrival, deadline, places[i])
            while (await job.events.get())[0] != "end":
                pass

        tasks = [asyncio.ensure_future(one(i)) for i in range(len(places))]
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
            for place in places:
                place.give_back()  # a choice cancelled before it ran (or while queued) leaves no slot behind
        if failed is not None:
            raise failed
        if left.is_set():
            if all(j is None for j in jobs):
                metrics.outcome("cancelled")
            return Response(status_code=499)
        for job in jobs:
            if job.error is not None:
                raise job_error(job)
            if job.outcome == "timeout" or job.result is None:
                raise timeout_error()
        scored = not chat and body.max_tokens == 0  # echo + max_tokens 0: the prompt only
        shared_prompt_lp = jobs[0].result.prompt_logprobs  # scored once, by choice 0

        def build() -> list[dict]:  # on the render thread: one decode per token and alternative
            choices = []
            for i, job in enumerate(jobs):
                result = job.result
                logprobs = result.logprobs if not scored else ([] if result.logprobs is not None else None)
                if chat:
                    message, finish = chat_message(body._structured, result.text, result.finish_reason)
                    choice = {"index": i, "message": message, "logprobs": chat_logprobs(logprobs),
                              "finish_reason": finish}
                else:
                    text = "" if scored else result.text
                    lp = completion_logprobs(logprobs, ids if body.echo else None, shared_prompt_lp)
                    if body.echo:
                        text = prompt_text(body, ids) + text
                    choice = {"index": i, "text": text, "logprobs": lp,
                              "finish_reason": "length" if scored else result.finish_reason}
                if len(jobs) > 1:
                    choice["speculation"] = job.summary()
                choices.append(choice)
            return choices

        choices = await asyncio.get_running_loop().run_in_executor(render, build)
        use = usage(jobs[0], scored)
        for job in jobs[1:]:
            extra = usage(job, scored)["completion_tokens"]
            use["completion_tokens"] += extra
            use["total_tokens"] += extra
        return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": served, "choices": choices, "usage": use, "speculation": jobs[0].summary()}

    def stream_response(request, body, chat, rid, places, handle, ids, cfgs, arrival, deadline):
        """Server-sent events for ``len(places)`` choices: each waits for its own place and generates; their chunks
        are interleaved as they come (``index`` tells them apart), each ends with its own finish chunk."""
        n = len(places)
        states = [{"job": None} for _ in range(n)]
        closed = {"done": False}  # the response ended (or never started): no pump may start a generation after it
        created_at = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        scored = not chat and body.max_tokens == 0
        sent = [0] * n  # text offset of each choice's next completion token (completions' logprobs)

        streamed = [StreamedChoice(body._structured) for _ in range(n)] if chat else []

        def chunk(i: int, delta_text: str | None, finish: str | None = None, *, role: bool = False, logprobs=None,
                  delta: dict | None = None, **extra) -> dict:
            if chat:
                delta = delta if delta is not None else {"role": "assistant", "content": ""} if role else (
                    {"content": delta_text} if delta_text is not None else {})
                choice = {"index": i, "delta": delta, "logprobs": chat_logprobs(logprobs), "finish_reason": finish}
            else:
                choice = {"index": i, "text": delta_text or "", "logprobs": logprobs, "finish_reason": finish}
            return {"id": rid, "object": obj, "created": created_at, "model": served, "choices": [choice], **extra}

        async def pump(i: int, merged: asyncio.Queue) -> None:
            """Choice i's events into ``merged`` as (i, kind, item); always ends with (i, "end", None)."""
            try:
                await take_slot(places[i], deadline)
            except APIError as e:  # timed out in the queue
                await merged.put((i, "queue_error", e))
                await merged.put((i, "end", None))
                return
            except BaseException:  # cancelled (client gone) while queued; take_slot gave the place back
                metrics.outcome("cancelled")
                raise
            if closed["done"]:  # the response already ended: give the slot straight back
                places[i].give_back()
                return
            try:
                job = states[i]["job"] = start_job(handle, ids, cfgs[i], arrival, deadline, places[i])
            except Exception as e:
                places[i].give_back()
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

        async def events() -> AsyncIterator[str]:
            merged: asyncio.Queue = asyncio.Queue()
            pumps = [asyncio.ensure_future(pump(i, merged)) for i in range(n)]
            try:
                if chat:
                    for i in range(n):
                        yield _sse(chunk(i, None, role=True))
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
                        yield _sse(item.body())
                    elif kind == "chunk":
                        if echo[i]:
                            echo[i] = False
                            text = prompt_text(body, ids)
                            prompt_lp = item.prompt_logprobs if item.prompt_logprobs is not None else shared["lp"]
                            lp_out = None
                            if cfgs[i].logprobs is not None:
                                lp_out = await asyncio.get_running_loop().run_in_executor(
                                    render, completion_logprobs, [], ids, prompt_lp)
                            yield _sse(chunk(i, text, logprobs=lp_out))
                            sent[i] = len(text)
                        lp = item.logprobs if cfgs[i].logprobs is not None else None
                        if not scored and (item.text or lp):
                            if chat:
                                deltas = streamed[i].deltas(item.text)
                                for j, d in enumerate(deltas or ([{"content": ""}] if lp else [])):
                                    yield _sse(chunk(i, None, logprobs=lp if j == 0 else None, delta=d))
                            else:
                                out = completion_logprobs(lp, offset=sent[i]) if lp is not None else None
                                if out is not None and out["tokens"]:  # offsets follow the tokens' pieces
                                    sent[i] = out["text_offset"][-1] + len(out["tokens"][-1])
                                else:
                                    sent[i] += len(item.text)
                                yield _sse(chunk(i, item.text, logprobs=out))
                    elif kind == "end":
                        ended += 1
                        job = states[i]["job"]
                        if job is None:
                            continue  # its queue error was sent
                        if job.error is not None:
                            yield _sse(job_error(job).body())
                        elif job.outcome == "timeout" or job.result is None:
                            yield _sse(timeout_error().body())
                        else:
                            total_new += usage(job, scored)["completion_tokens"]
                            finish = "length" if scored else job.result.finish_reason
                            if chat:
                                last, finish = streamed[i].finish(finish)
                                for d in last:
                                    yield _sse(chunk(i, None, delta=d))
                            yield _sse(chunk(i, None, finish, speculation=job.summary()))
                if body.include_usage:
                    done = [st["job"] for st in states if st["job"] is not None and st["job"].result is not None]
                    if done:
                        use = usage(done[0], scored)
                        use["completion_tokens"] = total_new
                        use["total_tokens"] = use["prompt_tokens"] + total_new
                        yield _sse({"id": rid, "object": obj, "created": created_at, "model": served, "choices": [],
                                    "usage": use})
                yield "data: [DONE]\n\n"
            finally:
                closed["done"] = True
                for t in pumps:
                    t.cancel()

        def cleanup() -> None:
            never_ran = not closed["done"]
            closed["done"] = True
            for state, place in zip(states, places):
                job = state["job"]
                if job is not None:
                    if job.finished is None:
                        job.cancel.set()  # client gone mid-stream: stop after the current step
                elif place.state == "queued" and never_ran:  # the body never ran
                    metrics.outcome("cancelled")
                place.give_back()  # no-op once handed to a job; a place still queued or holding goes back

        return _SSEResponse(events(), cleanup)

    @app.post("/v1/completions", summary="Text completion (OpenAI-compatible)")
    async def completions(request: Request, body: CompletionRequest):
        return await generate(request, body, chat=False)

    @app.post("/v1/chat/completions", summary="Chat completion (OpenAI-compatible)")
    async def chat_completions(request: Request, body: ChatCompletionRequest):
        return await generate(request, body, chat=True)

    # Middlewares: the last added runs first. Auth before reading any body.
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes)
    if api_keys(config.api_key):
        app.add_middleware(AuthMiddleware, api_keys=api_keys(config.api_key))
    if config.allowed_hosts is not None:  # first of all: a rebound web page learns nothing, not even 401
        app.add_middleware(HostCheckMiddleware, allowed=config.allowed_hosts)
    return app
