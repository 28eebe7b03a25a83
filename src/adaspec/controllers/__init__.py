"""Draft-length controllers. ``make_controller(name, k)`` builds one by name."""

from __future__ import annotations

from adaspec.controllers.adaptive import AdaptiveConfig, AdaptiveController
from adaspec.controllers.bandit import BanditController
from adaspec.controllers.base import Controller
from adaspec.controllers.confidence import ConfidenceController
from adaspec.controllers.entropy import EntropyController
from adaspec.controllers.fixed import FixedController
from adaspec.controllers.goodput import GoodputConfig, GoodputController
from adaspec.controllers.heuristic import HeuristicController
from adaspec.errors import ConfigError

CONTROLLERS = ("adaptive", "fixed", "heuristic", "goodput", "confidence", "entropy", "bandit")


def make_controller(name: str = "goodput", k: int | None = None) -> Controller:
    """Build a controller by name; ``k`` is the fixed K, the initial K (adaptive, heuristic, goodput), the most
    tokens per draft (confidence, entropy) or the largest K arm (bandit).

    Raises:
        ConfigError: unknown name or an invalid K (K < 0; K = 0 makes any of them plain decoding).
    """
    if k is not None and k < 0:
        raise ConfigError(f"draft length K must be >= 0, got {k}")
    if name not in CONTROLLERS:
        raise ConfigError(f"unknown controller {name!r}; choose one of {', '.join(CONTROLLERS)}")
    if name == "fixed":
        return FixedController(4 if k is None else k)
    if k == 0:
        return FixedController(0)
    if name == "heuristic":
        return HeuristicController() if k is None else HeuristicController(k_init=k, k_max=max(16, k))
    if name == "adaptive":
        if k is None:
            return AdaptiveController()
        return AdaptiveController(k_init=k, k_max=max(AdaptiveConfig.k_max, k))
    if name == "goodput":
        if k is None:
            return GoodputController()
        return GoodputController(k_init=k, k_max=max(GoodputConfig.k_max, k))
    if name == "confidence":
        return ConfidenceController() if k is None else ConfidenceController(k_max=k)
    if name == "entropy":
        return EntropyController() if k is None else EntropyController(k_max=k)
    arms = (1, 2, 3, 4, 6, 8)
    return BanditController(arms if k is None else sorted({x for x in arms if x <= k} | {k}))


__all__ = ["AdaptiveConfig", "AdaptiveController", "BanditController", "CONTROLLERS", "ConfidenceController",
           "Controller", "EntropyController", "FixedController", "GoodputConfig", "GoodputController",
           "HeuristicController", "make_controller"]
