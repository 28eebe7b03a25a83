"""adaspec: adaptive, lossless speculative decoding, and tools to measure where it pays.

Heavy modules (torch, transformers) load on first use, so ``adaspec models list`` starts instantly.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "load": "adaspec.api", "SpeculativeLM": "adaspec.api",
    "GenerationConfig": "adaspec.request", "GenerationResult": "adaspec.request",
    "SpeculativeEngine": "adaspec.engine", "StreamChunk": "adaspec.request",
    "GenerationStats": "adaspec.stats", "StepRecord": "adaspec.stats",
    "AdaspecError": "adaspec.errors",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'adaspec' has no attribute {name!r}")
