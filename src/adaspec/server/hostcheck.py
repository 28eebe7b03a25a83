"""The Host/Origin check against DNS rebinding (issue 41).

A server bound to loopback without an API key trusts whoever can reach it, and a web page can reach it: it makes
the browser resolve its own name to 127.0.0.1 (DNS rebinding), after which the page's scripts talk to the server
as a same-origin site. The browser still sends the page's name in ``Host`` (and ``Origin``), so the server refuses
requests whose ``Host`` (or ``Origin``, when present) names a host outside an allow-list, as Jupyter
(``ServerApp.allow_remote_access``/``local_hostnames``) and vLLM-style reverse-proxy setups do.

Default allow-list for a loopback bind: ``localhost``, ``127.0.0.1``, ``::1`` and the bind host (any port).
``adaspec serve --allowed-hosts a,b`` replaces it; ``*`` turns the check off (the default for a non-loopback bind,
which needs an API key anyway).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from urllib.parse import urlsplit

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def default_allowed_hosts(bind: str, loopback: bool) -> tuple[str, ...] | None:
    """The allow-list for a server bound to ``bind``: loopback names plus ``bind``, or None (no check) when the
    bind is not loopback."""
    if not loopback:
        return None
    return tuple(dict.fromkeys([*LOOPBACK_NAMES, normalise_host(bind)]))


def parse_allowed_hosts(value: str | None, bind: str, loopback: bool) -> tuple[str, ...] | None:
    """``--allowed-hosts`` (comma-separated names; ``*``: no check; None: the default for ``bind``)."""
    if value is None:
        return default_allowed_hosts(bind, loopback)
    names = [normalise_host(v) for v in value.split(",") if v.strip()]
    return None if "*" in names else tuple(dict.fromkeys(names))


def normalise_host(name: str) -> str:
    """Lower case, without brackets around an IPv6 address and without a port."""
    name = name.strip().lower()
    if name.startswith("["):
        return name[1:name.find("]")] if "]" in name else name[1:]
    if name.count(":") == 1:  # host:port (an IPv6 address without brackets has several colons)
        name = name.split(":", 1)[0]
    return name


def _origin_host(origin: str) -> str | None:
    try:
        return urlsplit(origin).hostname  # lower case, brackets and port removed
    except ValueError:
        return None


class HostCheckMiddleware:
    """Answers 403 (OpenAI-style body) to HTTP requests whose ``Host`` header, or ``Origin`` header when present
    (``null`` included), names a host outside ``allowed``. Runs before authentication."""

    def __init__(self, app, allowed: Iterable[str]) -> None:
        self.app = app
        self.allowed = frozenset(normalise_host(a) for a in allowed)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        host = origin = None
        for name, value in scope.get("headers", []):
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"origin":
                origin = value.decode("latin-1")
        problem = None
        if host is None or normalise_host(host) not in self.allowed:
            problem = f"the Host header {host!r} is not an allowed host name for this server"
        elif origin is not None and _origin_host(origin) not in self.allowed:
            problem = f"the Origin {origin!r} is not allowed by this server"
        if problem is None:
            return await self.app(scope, receive, send)
        body = json.dumps({"error": {"message": problem + " (DNS-rebinding protection; start the server with "
                                     "--allowed-hosts to add names)", "type": "invalid_request_error",
                                     "param": None, "code": "host_not_allowed"}}).encode()
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
