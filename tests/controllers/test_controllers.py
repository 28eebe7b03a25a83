"""Draft-length controllers driven by scripted StepRecord sequences (no model, no timing measured)."""

from __future__ import annotations

import pytest
import torch

from adaspec.controllers import (AdaptiveConfig, AdaptiveController, FixedController, HeuristicController,
                                 make_controller)
from adaspec.errors import ConfigError
from adaspec.stats import StepRecord

PLAIN_MS = 10.0


def plain(ms: float = PLAIN_MS) -> StepRecord:
    return StepRecord(k=0, drafted=0, accepted=0, emitted=1, context_len=10, draft_ms=0.0, verify_ms=ms,
                      total_ms=ms)


def spec(k: int, accepted: int, ms: float, drafted: int | None = None) -> StepRecord:
    drafted = k if drafted is None else drafted
    return StepRecord(k=k, drafted=drafted, accepted=accepted, emitted=accepted + 1, context_len=10,
                      draft_ms=ms / 2, verify_ms=ms / 2, total_ms=ms, drafter="d")


def full(ctrl, ms: float = 12.0) -> StepRecord:
    """A fully accepted step at the controller's current K; (K+1)/ms tokens per ms."""
    k = ctrl.next_k()
    assert k > 0
    return spec(k, k, ms)


def calibrated(**overrides) -> AdaptiveController:
    ctrl = AdaptiveController(**overrides)
    for _ in range(ctrl.config.calibration_steps):
        assert ctrl.next_k() == 0
        ctrl.update(plain())
    assert ctrl.plain_ms == PLAIN_MS
    return ctrl


# Fixed -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [0, 1, 4, 9])
def test_fixed_always_k(k):
    ctrl = FixedController(k)
    for rec in (spec(max(k, 1), 0, 5.0), spec(max(k, 1), max(k, 1), 5.0), plain()):
        ctrl.update(rec)
        assert ctrl.next_k() == k
    ctrl.reset()
    assert ctrl.next_k() == k
    assert ctrl.draft_stop() is None


def test_fixed_negative_k():
    with pytest.raises(ConfigError):
        FixedController(-1)


# Heuristic ---------------------------------------------------------------------------------------------------
def test_heuristic_schedule_and_bounds():
    ctrl = HeuristicController(k_init=5, k_min=1, k_max=10)
    trace = []
    for accepted_all in [True, True, True, True, False, False]:
        k = ctrl.next_k()
        ctrl.update(spec(k, k if accepted_all else k - 1, 5.0))
        trace.append(ctrl.next_k())
    assert trace == [7, 9, 10, 10, 9, 8]
    for _ in range(12):
        ctrl.update(spec(ctrl.next_k(), 0, 5.0))
    assert ctrl.next_k() == 1  # never below k_min
    ctrl.update(plain())  # a plain step (nothing drafted) changes nothing
    assert ctrl.next_k() == 1
    ctrl.update(spec(1, 1, 5.0))
    assert ctrl.next_k() == 3
    ctrl.reset()
    assert ctrl.next_k() == 5


def test_heuristic_full_acceptance_of_a_short_draft_counts_as_full():
    ctrl = HeuristicController(k_init=4)
    ctrl.update(spec(4, 2, 5.0, drafted=2))  # the drafter proposed only 2, both accepted
    assert ctrl.next_k() == 6


@pytest.mark.parametrize("kw", [dict(k_init=0), dict(k_min=0), dict(k_init=5, k_max=4), dict(k_min=3, k_init=2)])
def test_heuristic_validation(kw):
    with pytest.raises(ConfigError):
        HeuristicController(**kw)


# Adaptive ----------------------------------------------------------------------------------------------------
def test_adaptive_calibrates_with_plain_steps_first():
    ctrl = AdaptiveController()
    assert ctrl.next_k() == 0
    ctrl.update(plain(12.0))
    assert ctrl.next_k() == 0
    ctrl.update(plain(9.0))
    assert ctrl.plain_ms == 9.0  # the fastest calibration step
    assert ctrl.next_k() == AdaptiveConfig.k_init == 4


def test_adaptive_grows_to_k_max_under_sustained_full_acceptance():
    ctrl = calibrated()
    trace = []
    for _ in range(7):
        ctrl.update(full(ctrl))
        trace.append(ctrl.next_k())
    assert trace == [4, 4, 5, 6, 7, 8, 8]  # grows once the window (3 steps) shows it pays


def test_adaptive_does_not_grow_on_a_cut_draft():
    ctrl = calibrated()
    ctrl.update(spec(4, 2, 8.0, drafted=2))  # confidence stop after 2, both accepted: not a full K
    assert ctrl.next_k() == 4


def test_adaptive_shrinks_under_low_acceptance_while_still_paying():
    # α = 0.25: below shrink_threshold 0.5, above alpha_floor 0.2; 2 tokens per 5 ms beats 1 per 10 ms.
    ctrl = calibrated()
    trace = []
    for _ in range(6):
        k = ctrl.next_k()
        ctrl.update(StepRecord(k=k, drafted=4, accepted=1, emitted=2, context_len=10, draft_ms=2, verify_ms=3,
                               total_ms=5.0))
        trace.append(ctrl.next_k())
    assert trace == [3, 2, 1, 1, 1, 1]


def test_adaptive_keeps_k_in_the_middle_band():
    ctrl = calibrated()
    for _ in range(5):  # α = 0.75: neither grows (not full) nor shrinks
        ctrl.update(spec(4, 3, 6.0))
    assert ctrl.next_k() == 4


def _count_plain_steps(ctrl, limit: int = 1000) -> int:
    n = 0
    while ctrl.next_k() == 0:
        ctrl.update(plain())
        n += 1
        assert n < limit
    return n


def test_adaptive_halves_k_then_falls_back_when_goodput_is_below_plain_then_probes():
    ctrl = calibrated()
    # Fully accepted but slow: (K+1) tokens per 100 ms ≤ 9 / 100 < 1 / 10 ms plain.
    for i in range(2):
        ctrl.update(full(ctrl, ms=100.0))
        assert ctrl.next_k() == 4  # not judged before min_window = 3 steps, and no growth without evidence
    ctrl.update(full(ctrl, ms=100.0))
    assert ctrl.next_k() == 2  # does not pay: halved
    for expected in (1, 0):  # 2 → 1 (k_min) → back-off
        for _ in range(3):
            ctrl.update(full(ctrl, ms=100.0))
        assert ctrl.next_k() == expected
    assert _count_plain_steps(ctrl) == 16  # exactly backoff_init plain steps
    assert ctrl.next_k() == 1  # probes with the last K


def test_adaptive_shorter_draft_that_pays_is_kept():
    ctrl = calibrated(k_init=4, k_max=8)

    def cost(k):  # verification grows with K: K <= 3 pays (3/22, 4/37 tokens/ms), K = 4 does not (5/58)
        return 10.0 + 3.0 * k * k

    for _ in range(3):
        ctrl.update(full(ctrl, ms=cost(4)))
    assert ctrl.next_k() == 2
    ks = []
    for _ in range(40):
        ks.append(ctrl.next_k())
        ctrl.update(full(ctrl, ms=cost(ctrl.next_k())))
    # stays speculating around the K that pays (the windowed goodput lags, so K may overshoot by a step or two)
    assert 0 not in ks and max(ks) <= 6
    assert sum(k + 1 for k in ks) / sum(cost(k) for k in ks) > 1 / PLAIN_MS


def test_adaptive_backoff_doubles_after_failed_probes_and_resets_after_a_good_one():
    ctrl = calibrated(backoff_init=3, backoff_max=10, k_init=1, k_max=1)

    def bad_window():
        while ctrl.next_k() > 0:
            ctrl.update(full(ctrl, ms=200.0))

    def good_window():
        for _ in range(3):
            ctrl.update(full(ctrl, ms=5.0))

    bad_window()
    assert _count_plain_steps(ctrl) == 3
    bad_window()  # the probe fails
    assert _count_plain_steps(ctrl) == 6
    bad_window()
    assert _count_plain_steps(ctrl) == 10  # capped at backoff_max (12 → 10)
    bad_window()
    assert _count_plain_steps(ctrl) == 10
    good_window()  # the probe pays: back-off resets
    assert ctrl.next_k() > 0
    bad_window()
    assert _count_plain_steps(ctrl) == 3


def test_adaptive_falls_back_when_alpha_is_below_the_floor_even_if_fast():
    ctrl = calibrated()
    for _ in range(3):  # nothing accepted, but 1 token per 0.1 ms is much faster than plain
        ctrl.update(spec(ctrl.next_k(), 0, 0.1))
    assert ctrl.next_k() == 0
    assert _count_plain_steps(ctrl) == 16


def test_adaptive_with_alpha_just_above_the_floor_and_fast_keeps_speculating():
    ctrl = calibrated()
    for _ in range(8):  # α = 0.25 ≥ 0.2, 2 tokens per ms
        ctrl.update(StepRecord(k=ctrl.next_k(), drafted=4, accepted=1, emitted=2, context_len=0, draft_ms=0.5,
                               verify_ms=0.5, total_ms=1.0))
        assert ctrl.next_k() > 0


def test_adaptive_min_gain_boundary():
    # goodput exactly min_gain / plain: 1.5 * (1/10) = 0.15 tokens/ms → pays; a bit slower → falls back.
    ctrl = calibrated(min_gain=1.5)
    for _ in range(4):
        ctrl.update(StepRecord(k=ctrl.next_k(), drafted=4, accepted=2, emitted=3, context_len=0, draft_ms=10,
                               verify_ms=10, total_ms=20.0))
    assert ctrl.next_k() > 0
    ctrl = calibrated(min_gain=1.5)
    for _ in range(3):
        ctrl.update(StepRecord(k=ctrl.next_k(), drafted=4, accepted=2, emitted=3, context_len=0, draft_ms=10,
                               verify_ms=10, total_ms=21.0))
    assert ctrl.next_k() == 2  # does not pay: K halves before any back-off


def test_adaptive_reset_keeps_what_it_learnt_about_the_hardware():
    ctrl = calibrated(k_init=1, k_max=1)
    for _ in range(3):
        ctrl.update(full(ctrl, ms=100.0))
    assert ctrl.next_k() == 0
    ctrl.reset()
    assert ctrl.plain_ms == PLAIN_MS
    assert ctrl.next_k() == 0  # the back-off carries over to the next request
    assert _count_plain_steps(ctrl) == 16
    assert ctrl.next_k() == 1 and len(ctrl.window) == 0
    warm = calibrated()
    warm.reset()
    assert warm.next_k() == 4  # no calibration once plain timing is known
    fresh = AdaptiveController()
    fresh.reset()
    assert fresh.next_k() == 0  # never measured plain: calibrates


def test_adaptive_plain_ms_ema_outside_calibration():
    ctrl = calibrated(k_init=1, k_max=1)
    for _ in range(3):
        ctrl.update(full(ctrl, ms=100.0))
    ctrl.update(plain(20.0))  # during back-off: EMA 0.8 * 10 + 0.2 * 20
    assert ctrl.plain_ms == pytest.approx(12.0)


def test_adaptive_empty_draft_counts_as_plain_step():
    ctrl = calibrated()
    rec = StepRecord(k=4, drafted=0, accepted=0, emitted=1, context_len=0, draft_ms=0.1, verify_ms=10,
                     total_ms=10.0)
    for _ in range(10):
        ctrl.update(rec)
    assert len(ctrl.window) == 0
    assert ctrl.next_k() == 4


def test_draft_stop_threshold():
    ctrl = AdaptiveController(confidence_threshold=0.4)
    stop = ctrl.draft_stop()
    assert callable(stop)
    probs = torch.tensor([0.1, 0.39, 0.41, 0.1])
    assert stop(0, probs, 1) is True
    assert stop(3, probs, 0) is True
    assert stop(0, probs, 2) is False
    assert AdaptiveController(confidence_threshold=0.0).draft_stop() is None
    assert HeuristicController().draft_stop() is None


@pytest.mark.parametrize("kw", [dict(k_min=0), dict(k_init=9), dict(k_min=5, k_init=4), dict(min_window=0),
                                dict(min_window=9), dict(shrink_threshold=0.9), dict(grow_threshold=1.5),
                                dict(confidence_threshold=1.0), dict(confidence_threshold=-0.1),
                                dict(backoff_init=0), dict(backoff_init=10, backoff_max=5)])
def test_adaptive_config_validation(kw):
    with pytest.raises(ConfigError):
        AdaptiveController(**kw)
    with pytest.raises(ConfigError):
        AdaptiveConfig(**kw)


# make_controller ---------------------------------------------------------------------------------------------
def test_make_controller():
    from adaspec.controllers import GoodputController

    assert isinstance(make_controller(), GoodputController)  # the default
    assert isinstance(make_controller("adaptive"), AdaptiveController)
    fixed = make_controller("fixed")
    assert isinstance(fixed, FixedController) and fixed.next_k() == 4
    assert make_controller("fixed", 0).next_k() == 0
    assert make_controller("fixed", 7).next_k() == 7
    for name in ("adaptive", "heuristic"):
        zero = make_controller(name, 0)
        assert isinstance(zero, FixedController) and zero.next_k() == 0
    h = make_controller("heuristic", 20)
    assert isinstance(h, HeuristicController) and h.next_k() == 20 and h.k_max == 20
    assert make_controller("heuristic").next_k() == 5
    a = make_controller("adaptive", 12)
    assert isinstance(a, AdaptiveController) and a.config.k_init == 12 and a.config.k_max == 12
    assert make_controller("adaptive", 3).config.k_max == 8


@pytest.mark.parametrize("name,k", [("fixed", -1), ("adaptive", -2), ("heuristic", -1), ("bogus", None),
                                    ("bogus", 3), ("", None), ("Fixed", 2)])
def test_make_controller_errors(name, k):
    with pytest.raises(ConfigError):
        make_controller(name, k)
