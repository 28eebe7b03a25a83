"""The Hugging Face transformers schedule (``num_assistant_tokens_schedule="heuristic"``).

Source: transformers ``AssistedCandidateGenerator.update_candidate_strategy``: K += 2 when every drafted token
was accepted, otherwise K -= 1 (never below 1). Bounded here by ``k_max``.
"""

from __future__ import annotations

from adaspec.controllers.base import Controller
from adaspec.errors import ConfigError
from adaspec.stats import StepRecord


class HeuristicController(Controller):
    """+2 after a fully accepted draft, −1 otherwise, within [k_min, k_max]; starts at ``k_init``."""

    name = "heuristic"

    def __init__(self, k_init: int = 5, k_min: int = 1, k_max: int = 16) -> None:
        if not 1 <= k_min <= k_init <= k_max:
            raise ConfigError(f"need 1 <= k_min <= k_init <= k_max, got {k_min}, {k_init}, {k_max}")
        self.k_init, self.k_min, self.k_max = k_init, k_min, k_max
        self.k = k_init

    def next_k(self) -> int:
        return self.k

    def update(self, step: StepRecord) -> None:
        if step.drafted == 0:
            return
        if step.accepted == step.depth:
            self.k = min(self.k + 2, self.k_max)
        else:
            self.k = max(self.k - 1, self.k_min)

    def reset(self) -> None:
        self.k = self.k_init
