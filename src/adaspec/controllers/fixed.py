"""Fixed draft length: K every step (K = 0 is plain autoregressive decoding, the benchmarks' baseline)."""

from __future__ import annotations

from adaspec.controllers.base import Controller
from adaspec.errors import ConfigError


class FixedController(Controller):
    """Always drafts ``k`` tokens. Raises ConfigError for k < 0."""

    name = "fixed"

    def __init__(self, k: int = 4) -> None:
        if k < 0:
            raise ConfigError(f"draft length K must be >= 0, got {k}")
        self.k = k

    def next_k(self) -> int:
        return self.k
