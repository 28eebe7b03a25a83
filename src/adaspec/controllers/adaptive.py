"""Sliding-window adaptive controller (the default): adapts K to live acceptance and timing, and turns speculation
off when it stops paying.

Decisions, after each step:

1. **K from acceptance.** Over the last ``window`` speculation steps, α_w = accepted / drafted. A step whose whole
   draft of K tokens was accepted while α_w >= ``grow_threshold`` (and the window pays, see 2) lengthens K by one;
   α_w < ``shrink_threshold`` shortens it by one; K stays in [k_min, k_max]. (The same idea as transformers' heuristic schedule, but judged
   over a window so one lucky or unlucky step does not swing K.)
2. **Shorten, then fall back, when it does not pay.** Plain steps measure the cost of one target step, t_plain
   (the first ``calibration_steps`` steps are plain, which costs nothing: they emit a token each at plain speed).
   Once the window holds ``min_window`` steps, speculation must deliver at least ``min_gain`` times plain goodput:
   Σ emitted / Σ step time >= min_gain / t_plain. If it does not, K is halved (a shorter draft may still pay where
   verifying many tokens is compute-bound) and K will not grow back past the K that failed until the next
   back-off; at K = k_min, or when α_w < ``alpha_floor``, the controller switches
   to K = 0 for ``backoff`` steps.
3. **Probe again.** After the back-off it speculates again; a failed probe doubles the back-off (up to
   ``backoff_max``), a successful one resets it. This is how it comes back when the text turns predictable.
   What it learnt about the hardware (t_plain, K, the back-off) carries over to the next request; only the
   acceptance window starts afresh.
4. **Confidence stop within a step.** Drafting stops after a token whose draft probability is below
   ``confidence_threshold`` (transformers' ``assistant_confidence_threshold``, default 0.4 there too).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from adaspec.controllers.base import Controller
from adaspec.drafters.base import DraftStop
from adaspec.errors import ConfigError
from adaspec.stats import StepRecord


@dataclass(frozen=True)
class AdaptiveConfig:
    """Thresholds of :class:`AdaptiveController` (see the module docstring for how each is used)."""

    k_init: int = 4
    k_min: int = 1
    k_max: int = 8
    window: int = 8
    min_window: int = 3
    grow_threshold: float = 0.8
    shrink_threshold: float = 0.5
    alpha_floor: float = 0.2
    min_gain: float = 1.0
    calibration_steps: int = 2
    backoff_init: int = 16
    backoff_max: int = 256
    confidence_threshold: float = 0.4

    def __post_init__(self) -> None:
        if not 1 <= self.k_min <= self.k_init <= self.k_max:
            raise ConfigError(f"need 1 <= k_min <= k_init <= k_max, got {self.k_min}, {self.k_init}, {self.k_max}")
        if not 1 <= self.min_window <= self.window:
            raise ConfigError(f"need 1 <= min_window <= window, got {self.min_window}, {self.window}")
        if not 0 <= self.shrink_threshold <= self.grow_threshold <= 1:
            raise ConfigError("need 0 <= shrink_threshold <= grow_threshold <= 1")
        if not 0 <= self.confidence_threshold < 1:
            raise ConfigError(f"confidence_threshold must be in [0, 1), got {self.confidence_threshold}")
        if self.backoff_init < 1 or self.backoff_max < self.backoff_init:
            raise ConfigError("need 1 <= backoff_init <= backoff_max")


class AdaptiveController(Controller):
    """Sliding-window acceptance + measured-goodput controller with back-off probing."""

    name = "adaptive"

    def __init__(self, config: AdaptiveConfig | None = None, **overrides) -> None:
        base = config or AdaptiveConfig()
        self.config = AdaptiveConfig(**{**base.__dict__, **overrides}) if overrides else base
        self.plain_ms: float | None = None  # EMA of a plain step's wall time, kept across requests
        self.reset()

    def reset(self) -> None:
        """New request: a fresh acceptance window; K, t_plain and the back-off state carry over."""
        c = self.config
        if not hasattr(self, "k"):
            self.k = c.k_init
            self.backoff = c.backoff_init
            self.plain_left = 0  # plain steps left in the current back-off
            self.k_ceiling = c.k_max  # largest K not yet seen failing to pay
        self.window: deque[StepRecord] = deque(maxlen=c.window)
        self.calibrating = c.calibration_steps if self.plain_ms is None else 0

    # Decisions --------------------------------------------------------------------------------------------
    def next_k(self) -> int:
        return 0 if self.calibrating > 0 or self.plain_left > 0 else self.k

    def draft_stop(self) -> DraftStop | None:
        threshold = self.config.confidence_threshold
        if threshold <= 0:
            return None

        def stop(position: int, probs: torch.Tensor, token: int) -> bool:
            return float(probs[token]) < threshold

        return stop

    @property
    def window_alpha(self) -> float:
        drafted = sum(s.depth for s in self.window)  # a tree: the positions along its path
        return sum(s.accepted for s in self.window) / drafted if drafted else 0.0

    def update(self, step: StepRecord) -> None:
        c = self.config
        if step.drafted == 0:
            self._update_plain(step)
            return
        self.window.append(step)
        alpha = self.window_alpha
        if alpha < c.shrink_threshold:
            self.k = max(self.k - 1, c.k_min)
        if len(self.window) < c.min_window:
            return  # judge cost only on evidence
        if self._pays(alpha):
            self.backoff = c.backoff_init
            if step.accepted == step.depth == step.k and alpha >= c.grow_threshold:
                self.k = min(self.k + 1, c.k_max, self.k_ceiling)
        elif self.k > c.k_min and alpha >= c.alpha_floor:
            self.k_ceiling = self.k - 1  # this K did not pay: do not grow back into it
            self.k = max(c.k_min, self.k // 2)  # a shorter draft may still pay; measure it afresh
            self.window.clear()
        else:
            self.plain_left = self.backoff
            self.backoff = min(2 * self.backoff, c.backoff_max)
            self.window.clear()

    def _update_plain(self, step: StepRecord) -> None:
        ms = step.total_ms
        self.plain_ms = ms if self.plain_ms is None else (min(self.plain_ms, ms) if self.calibrating else
                                                          0.8 * self.plain_ms + 0.2 * ms)
        if self.calibrating:
            self.calibrating -= 1
        elif self.plain_left:
            self.plain_left -= 1
            if not self.plain_left:
                self.k_ceiling = self.config.k_max  # conditions may have changed: explore again

    def _pays(self, alpha: float) -> bool:
        if alpha < self.config.alpha_floor:
            return False
        if self.plain_ms is None:
            return True
        emitted = sum(s.emitted for s in self.window)
        spent_ms = sum(s.total_ms for s in self.window)
        return emitted / spent_ms >= self.config.min_gain / self.plain_ms
