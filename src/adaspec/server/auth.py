"""Bearer-token authentication: one or more API keys, and the identity of the key a request used.

Each accepted key has an identity, :func:`key_id` (a SHA-256 digest, never the key itself), which the middleware
puts in the request's scope (``scope["state"]["api_key_id"]``, ``request.state.api_key_id`` in a route) so that
per-key state, such as the suffix cache's partitions (:mod:`adaspec.server.suffix_partitions`), never needs to
hold a key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence

from adaspec.server.protocol import error_body

KEY_ID_STATE = "api_key_id"


def key_id(api_key: str) -> str:
    """The identity of ``api_key``: 16 hex digits of SHA-256 over a fixed prefix and the key (64 bits: keys do not
    collide in practice; the key cannot be read back from it)."""
    return hashlib.sha256(b"adaspec api key\0" + api_key.encode()).hexdigest()[:16]


def api_keys(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """The keys of a ``ServerConfig.api_key`` value: one key, several, or none (empty keys are dropped)."""
    if value is None:
        return ()
    keys = (value,) if isinstance(value, str) else tuple(value)
    return tuple(k for k in keys if k)


def keys_from_cli(flags: Sequence[str] | None, env: str | None) -> tuple[str, ...] | None:
    """The keys of ``adaspec serve``: every ``--api-key`` flag, else the environment variable's keys separated by
    commas (surrounding spaces dropped); None when there are none."""
    keys = flags if flags else (env or "").split(",")
    return tuple(k.strip() for k in keys if k.strip()) or None


async def send_json(send, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
    """Answer an ASGI request with a JSON body (for middlewares, before any route runs)."""
    data = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})


class AuthMiddleware:
    """Bearer-token check on every HTTP route except ``/health``: ``Authorization: Bearer <key>`` with any of
    ``api_keys`` (each compared in constant time, all of them every time). An accepted request carries its key's
    :func:`key_id` in ``scope["state"]["api_key_id"]``."""

    def __init__(self, app, api_keys: Sequence[str], open_paths: tuple[str, ...] = ("/health",)) -> None:
        if not api_keys:
            raise ValueError("AuthMiddleware needs at least one API key")
        self.app = app
        self.expected = [(f"Bearer {k}".encode(), key_id(k)) for k in api_keys]
        self.open_paths = open_paths

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            return await self.app(scope, receive, send)
        given = b""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                given = value
                break
        found = None
        for expected, ident in self.expected:  # no early exit: the time taken says nothing about which key
            if hmac.compare_digest(given, expected):
                found = ident
        if found is None:
            message = ("missing API key: send it as 'Authorization: Bearer <key>'" if not given
                       else "incorrect API key provided")
            return await send_json(send, 401, error_body(message, code="invalid_api_key"),
                                   {"www-authenticate": "Bearer"})
        scope.setdefault("state", {})[KEY_ID_STATE] = found
        return await self.app(scope, receive, send)
