"""Within-step draft stops (confidence / SpecDec++-style, entropy / AdaEDL) and their online threshold tuning."""

from __future__ import annotations

import math

import pytest
import torch

from adaspec.controllers import ConfidenceController, EntropyController, make_controller
from adaspec.controllers.entropy import entropy_bound
from adaspec.controllers.threshold import best_threshold
from adaspec.errors import ConfigError
from adaspec.stats import StepRecord


def step(drafted: int, accepted: int, *, draft_ms: float = 20.0, verify_ms: float = 100.0) -> StepRecord:
    return StepRecord(k=8, drafted=drafted, accepted=accepted, emitted=accepted + 1, context_len=10,
                      draft_ms=draft_ms * drafted, verify_ms=verify_ms, total_ms=draft_ms * drafted + verify_ms,
                      drafter="d" if drafted else "")


def peaked(p: float, vocab: int = 10, token: int = 0) -> torch.Tensor:
    """A distribution with mass p on ``token`` and the rest spread evenly."""
    probs = torch.full((vocab,), (1 - p) / (vocab - 1))
    probs[token] = p
    return probs


def run_draft(ctrl, qs: list[float]) -> int:
    """Feed the stop rule one token per q (as the model drafter does, never for the last of K); return how many
    tokens the draft has when it ends."""
    stop = ctrl.draft_stop()
    k = ctrl.next_k()
    for i, q in enumerate(qs[:k]):
        if i == k - 1 or stop(i, peaked(q), 0):
            return i + 1
    return min(len(qs), k)


# best_threshold ----------------------------------------------------------------------------------------------
def test_best_threshold_separates_and_weighs_costs():
    pairs = [(0.9, 1)] * 5 + [(0.8, 1)] * 5 + [(0.3, 0)] * 5 + [(0.2, 0)] * 5
    t = best_threshold(pairs, 1.0, 1.0, default=0.5)
    assert 0.3 < t <= 0.8
    mixed = [(0.9, 1)] * 10 + [(0.5, 1), (0.5, 0), (0.5, 0)] + [(0.1, 0)] * 10
    # At 0.5: one accepted, two rejected. Cheap continuation keeps 0.5 going; cheap stopping stops it.
    assert best_threshold(mixed, 1.0, 10.0, default=0.0) <= 0.5
    assert best_threshold(mixed, 10.0, 1.0, default=0.0) > 0.5
    assert best_threshold([(0.4, 1), (0.9, 1)], 1.0, 1.0, default=0.33) == 0.33  # one class only: the default
    assert best_threshold([], 1.0, 1.0, default=0.7) == 0.7


# Confidence (SpecDec++-style) ----------------------------------------------------------------------------------
def test_confidence_stops_when_probability_of_a_rejection_exceeds_h():
    ctrl = ConfidenceController(k_max=8, threshold=0.5, tune=False)
    assert ctrl.next_k() == 8
    # Uncalibrated, â(q) = q: cumulative 0.9, 0.81, 0.729, 0.656, 0.59, 0.531, 0.478 < 0.5 at the 7th token.
    assert run_draft(ctrl, [0.9] * 8) == 7
    assert run_draft(ctrl, [0.3] + [0.99] * 7) == 1
    assert run_draft(ctrl, [0.99] * 8) == 8


def test_confidence_calibrates_the_draft_probability_on_outcomes():
    ctrl = ConfidenceController(k_max=4, threshold=0.5, tune=False)
    for _ in range(50):  # tokens drafted with q = 0.95 are always rejected (an overconfident draft)
        n = run_draft(ctrl, [0.95] * 4)
        ctrl.update(step(n, 0))
    assert ctrl.calibrated(0.95) < 0.1
    assert run_draft(ctrl, [0.95] * 4) == 1
    assert ctrl.calibrated(0.35) == pytest.approx(0.35)  # an unseen bin keeps â(q) = q


def test_confidence_threshold_tuning_follows_outcomes_and_costs():
    ctrl = ConfidenceController(k_max=6, threshold=0.5)
    for i in range(60):
        # Tokens with q = 0.9 are accepted, tokens with q = 0.6 rejected.
        qs = [0.9, 0.9, 0.6, 0.9, 0.9, 0.9]
        n = run_draft(ctrl, qs)
        ctrl.update(step(n, min(n, 2)))
    # The calibrated cumulative score after the q = 0.6 token is near 0: the tuned threshold stops there.
    assert run_draft(ctrl, [0.9, 0.9, 0.6, 0.9, 0.9, 0.9]) == 3
    assert run_draft(ctrl, [0.9] * 6) >= 5


# Entropy (AdaEDL) ----------------------------------------------------------------------------------------------
def test_entropy_bound():
    assert entropy_bound(torch.tensor([1.0, 0.0, 0.0]), 0.5) == pytest.approx(1.0)
    uniform = torch.full((4,), 0.25)
    assert entropy_bound(uniform, 0.5) == pytest.approx(1 - math.sqrt(0.5 * math.log(4)))
    assert entropy_bound(uniform, 0.1) > entropy_bound(uniform, 0.5)


def test_entropy_stop_and_tuning():
    ctrl = EntropyController(k_max=8, threshold=0.4)
    assert run_draft(ctrl, [0.99] * 8) == 8
    assert run_draft(ctrl, [0.99, 0.2] + [0.99] * 6) == 2  # stops after the high-entropy token
    lam = ctrl.threshold
    for _ in range(40):  # confident tokens keep getting rejected at position 1: the bound is too optimistic
        n = run_draft(ctrl, [0.99] * 8)
        ctrl.update(step(n, 1))
    assert ctrl.threshold != lam
    for _ in range(40):
        ctrl.update(step(run_draft(ctrl, [0.99] * 8), 1))
    # Every score is the same (0.99), accepted once per rejection: with a draft token at 20 ms and a plain step at
    # 100 ms, continuing is worth it (a rejection costs 20, a false stop 80), so nothing stops.
    assert run_draft(ctrl, [0.99] * 8) == 8


def test_entropy_stop_learns_to_stop_where_acceptance_collapses():
    ctrl = EntropyController(k_max=6, threshold=0.0)  # starts never stopping
    for _ in range(60):
        qs = [0.99, 0.99, 0.5, 0.5, 0.5, 0.5]  # the draft is unsure from position 2 and is then always wrong
        n = run_draft(ctrl, qs)
        ctrl.update(step(n, min(n, 2)))
    assert run_draft(ctrl, [0.99, 0.99, 0.5, 0.5, 0.5, 0.5]) == 3


def test_stop_controllers_ignore_plain_steps_and_foreign_drafts():
    ctrl = ConfidenceController()
    ctrl.update(step(0, 0))
    ctrl.update(StepRecord(k=8, drafted=4, accepted=2, emitted=3, context_len=1, draft_ms=0.1, verify_ms=100,
                           total_ms=100.1, drafter="ngram"))  # the stop rule was never asked: no pairs
    assert len(ctrl.pairs) == 0


def test_stop_controller_validation_and_factory():
    with pytest.raises(ConfigError):
        ConfidenceController(k_max=0)
    with pytest.raises(ConfigError):
        ConfidenceController(bins=0)
    with pytest.raises(ConfigError):
        EntropyController(gamma=0)
    with pytest.raises(ConfigError):
        EntropyController(min_pairs=1)
    assert make_controller("confidence", 5).next_k() == 5
    assert isinstance(make_controller("entropy"), EntropyController)
    assert make_controller("entropy", 0).next_k() == 0
