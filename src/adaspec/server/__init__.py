"""``adaspec serve``: an OpenAI-compatible HTTP server with speculative-decoding metrics.

Needs the ``serve`` extra (``pip install 'adaspec[serve]'``): FastAPI, uvicorn and prometheus-client.
See ``docs/server.md``.
"""

from __future__ import annotations

__all__ = ["ModelHost", "ServerConfig", "create_app"]


def __getattr__(name: str):  # lazy: importing adaspec.server must not need the extra
    if name in ("ServerConfig", "create_app"):
        from adaspec.server import app

        return getattr(app, name)
    if name == "ModelHost":
        from adaspec.server.runtime import ModelHost

        return ModelHost
    raise AttributeError(name)
