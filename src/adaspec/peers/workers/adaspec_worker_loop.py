"""The JSON-lines loop of a peer worker (stdlib only; imported by the worker scripts next to it).

Protocol: one JSON object per line on stdin, one reply per line on the original stdout. ``{"op": "load", ...}``
loads the engine; ``{"op": "generate", "ids": [...], "max_new_tokens": N, "temperature": T, "seed": S}`` generates.
A reply is ``{"ok": true, ...}`` or ``{"ok": false, "status": "not installed" | "failed", "error": "..."}`` (an
ImportError while loading means the engine is not installed in this Python). Everything else the engine prints,
from Python or native code, goes to stderr (the peer's log): file descriptor 1 is pointed at stderr before loading.
"""

import json
import os
import sys
import traceback


def serve(load, generate) -> None:
    """Answer requests until stdin closes. ``load(request) -> dict`` and ``generate(request) -> dict`` return the
    reply's fields."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            op = request.get("op")
            if op == "load":
                reply = {"ok": True, **load(request)}
            elif op == "generate":
                reply = {"ok": True, **generate(request)}
            else:
                reply = {"ok": False, "status": "failed", "error": f"unknown op {op!r}"}
        except ImportError as e:
            traceback.print_exc()
            reply = {"ok": False, "status": "not installed", "error": f"{type(e).__name__}: {e}"}
        except Exception as e:  # noqa: BLE001 - reported to the comparison, which records it in the row
            traceback.print_exc()
            reply = {"ok": False, "status": "failed", "error": f"{type(e).__name__}: {e}"}
        sys.stderr.flush()
        protocol.write(json.dumps(reply) + "\n")
