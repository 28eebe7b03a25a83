"""Draft-length controllers. ``make_controller(name, k)`` builds one by name."""

from __future__ import annotations

from adaspec.controllers.adaptive import AdaptiveConfig, AdaptiveController
from adaspec.controllers.base import Controller
from adaspec.controllers.fixed import FixedController
from adaspec.controllers.heuristic import HeuristicController
from adaspec.errors import ConfigError

CONTROLLERS = ("adaptive", "fixed", "heuristic")


def make_controller(name: str = "adaptive", k: int | None = None) -> Controller:
    """Build a controller by name; ``k`` is the fixed K, or the initial K of the others.

    Raises:
        ConfigError: unknown name or an invalid K (K < 0; K = 0 only makes sense for ``fixed``).
    """
    if k is not None and k < 0:
        raise ConfigError(f"draft length K must be >= 0, got {k}")
    if name == "fixed":
        return FixedController(4 if k is None else k)
    if name in ("adaptive", "heuristic") and k == 0:
        return FixedController(0)
    if name == "heuristic":
        return HeuristicController() if k is None else HeuristicController(k_init=k, k_max=max(16, k))
    if name == "adaptive":
        if k is None:
            return AdaptiveController()
        return AdaptiveController(k_init=k, k_max=max(AdaptiveConfig.k_max, k))
    raise ConfigError(f"unknown controller {name!r}; choose one of {', '.join(CONTROLLERS)}")


__all__ = ["AdaptiveConfig", "AdaptiveController", "CONTROLLERS", "Controller", "FixedController",
           "HeuristicController", "make_controller"]
