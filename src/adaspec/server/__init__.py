"""``adaspec serve``: an OpenAI-compatible HTTP server with speculative-decoding metrics.

Needs the ``serve`` extra (``pip install 'adaspec[serve]'``): FastAPI, uvicorn and prometheus-client.
See ``docs/server.md``.
"""

from __future__ import annotations

__all__ = ["ModelHost", "ServerConfig", "create_app"]


def __getattr__(name: str):  # lazy: importing adaspec.server must not need the extra
    if name == "create_app":
        from adaspec.server.app import create_app

        return create_app
    if name == "ServerConfig":
        from adaspec.server.settings import ServerConfig

        return ServerConfig
    if name == "ModelHost":
        from adaspec.server.host import ModelHost

        return ModelHost
    raise AttributeError(name)
