"""The FastAPI application: OpenAI-compatible routes, auth and body-size middlewares, OpenAI-style errors.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with ``stream``), ``GET /v1/models``,
``GET /v1/models/{model}``, ``GET /health`` (no auth), ``GET /metrics`` (Prometheus text format).

Request life: validate (pydantic; 400 with an OpenAI-style body naming the problem) → encode the prompt on the
encode thread → check it against the context window → take a place in the FIFO queue (503 + Retry-After when
full) → wait for a running slot (until the request's deadline: 504) → generate on the generation thread (alone, or
as one row of the continuous batch with ``--max-batch`` > 1) → answer. A client that goes away while queued leaves
the queue; one that goes away while generating stops its generation after the current step, which frees its slot
for the next request without disturbing the other rows. The routes parse and answer; the work is
:class:`~adaspec.server.service.CompletionService`'s.
"""

from __future__ import annotations

import json
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from adaspec.server.auth import AuthMiddleware, api_keys, send_json
from adaspec.server.host import ModelHost
from adaspec.server.hostcheck import HostCheckMiddleware
from adaspec.server.protocol import APIError, ChatCompletionRequest, CompletionRequest, error_body
from adaspec.server.service import CompletionService
from adaspec.server.settings import ServerConfig

__all__ = ["BodyLimitMiddleware", "ServerConfig", "create_app"]

log = logging.getLogger("adaspec.server")


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


# --------------------------------------------------------------------------------------------------------------
# The application
# --------------------------------------------------------------------------------------------------------------


def create_app(host: ModelHost, config: ServerConfig | None = None) -> FastAPI:
    """Build the ASGI app around a loaded :class:`ModelHost`."""
    config = config or ServerConfig()
    service = CompletionService(host, config)
    metrics = service.metrics

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        service.close()

    app = FastAPI(title="adaspec", version="0.1.0", lifespan=lifespan,
                  description="OpenAI-compatible API over adaspec's adaptive, lossless speculative decoding.")
    app.state.host = host
    app.state.metrics = metrics
    app.state.scheduler = service.scheduler
    app.state.config = config
    app.state.service = service

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

    # Routes --------------------------------------------------------------------------------------------------
    @app.get("/health", summary="Liveness and queue state (no auth)")
    async def health() -> dict:
        return service.health()

    @app.get("/v1/models", summary="The served model")
    async def list_models() -> dict:
        return service.models()

    @app.get("/v1/models/{model:path}", summary="One model")
    async def get_model(model: str) -> dict:
        return service.model(model)

    @app.get("/metrics", summary="Prometheus metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.post("/v1/completions", summary="Text completion (OpenAI-compatible)")
    async def completions(request: Request, body: CompletionRequest):
        return await service.generate(request, body, chat=False)

    @app.post("/v1/chat/completions", summary="Chat completion (OpenAI-compatible)")
    async def chat_completions(request: Request, body: ChatCompletionRequest):
        return await service.generate(request, body, chat=True)

    # Middlewares: the last added runs first. Auth before reading any body.
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes)
    if api_keys(config.api_key):
        app.add_middleware(AuthMiddleware, api_keys=api_keys(config.api_key))
    if config.allowed_hosts is not None:  # first of all: a rebound web page learns nothing, not even 401
        app.add_middleware(HostCheckMiddleware, allowed=config.allowed_hosts)
    return app
