"""The UCB bandit over (drafter, K) arms on a simulated machine (no model, no timing)."""

from __future__ import annotations

import random

import pytest

from adaspec.controllers import BanditController, make_controller
from adaspec.controllers.bandit import PLAIN
from adaspec.errors import ConfigError
from adaspec.stats import StepRecord


def simulate(k: int, drafter: str, rng: random.Random, *, alpha: dict, draft_ms: dict, verify_ms: float = 100.0):
    a = 0
    while a < k and rng.random() < alpha.get(drafter, 0.0):
        a += 1
    return StepRecord(k=k, drafted=k, accepted=a, emitted=a + 1, context_len=10, draft_ms=k * draft_ms.get(drafter, 0),
                      verify_ms=verify_ms, total_ms=k * draft_ms.get(drafter, 0) + verify_ms,
                      drafter=drafter if k else "")


def test_plays_every_arm_once_then_converges_to_the_best():
    ctrl = BanditController(ks=(1, 2, 4, 8))
    rng = random.Random(0)
    played = []
    for _ in range(400):
        k = ctrl.next_k()
        played.append(k)
        ctrl.update(simulate(k, "", rng, alpha={"": 0.9}, draft_ms={"": 10.0}))
    assert sorted(played[:5]) == [0, 1, 2, 4, 8]
    late = played[-150:]
    assert max(set(late), key=late.count) == 8  # (1 - 0.9^9) / 0.1 / 180 ms beats the shorter drafts


def test_goes_plain_when_speculation_loses():
    ctrl = BanditController()
    rng = random.Random(1)
    played = []
    for _ in range(400):
        k = ctrl.next_k()
        played.append(k)
        ctrl.update(simulate(k, "", rng, alpha={"": 0.1}, draft_ms={"": 50.0}))
    assert played[-150:].count(0) >= 130


def test_routes_between_drafters_and_skips_unavailable_arms():
    ctrl = BanditController(ks=(2, 8))
    rng = random.Random(2)
    alpha = {"ngram": 0.8, "model": 0.8}
    cost = {"ngram": 0.1, "model": 40.0}
    chosen = []
    for i in range(300):
        options = {"ngram": 10 if i % 2 else 0, "model": None}
        d = ctrl.choose_drafter(options)
        k = ctrl.next_k()
        assert d != "ngram" or options["ngram"] > 0
        assert (d is None) == (k == 0)
        chosen.append((i % 2, d, k))
        ctrl.update(simulate(k, d or "", rng, alpha=alpha, draft_ms=cost))
    with_match = [(d, k) for m, d, k in chosen[-100:] if m]
    assert with_match.count(("ngram", 8)) >= 35  # a free draft of 8 wins whenever there is a match
    assert ctrl.arms({"ngram": 3, "model": None}) == [PLAIN, ("ngram", 2), ("model", 2), ("model", 8)]
    assert ctrl.arms({"ngram": 1}) == [PLAIN, ("ngram", 2)]  # a short match still gets the shortest arm


def test_discount_lets_it_follow_a_change():
    ctrl = BanditController(ks=(1, 4), discount=0.95)
    rng = random.Random(3)
    for _ in range(200):
        ctrl.update(simulate(ctrl.next_k(), "", rng, alpha={"": 0.95}, draft_ms={"": 10.0}))
    late = []
    for _ in range(200):
        k = ctrl.next_k()
        late.append(k)
        ctrl.update(simulate(k, "", rng, alpha={"": 0.0}, draft_ms={"": 30.0}))
    assert late[-100:].count(0) >= 70


def test_value_is_relative_to_plain():
    ctrl = BanditController(ks=(2,))
    ctrl.next_k()
    ctrl.update(StepRecord(k=0, drafted=0, accepted=0, emitted=1, context_len=1, draft_ms=0, verify_ms=100,
                           total_ms=100))
    assert ctrl.next_k() == 2
    ctrl.update(StepRecord(k=2, drafted=2, accepted=2, emitted=3, context_len=1, draft_ms=50, verify_ms=100,
                           total_ms=150))
    assert ctrl.value(PLAIN) == pytest.approx(1.0)
    assert ctrl.value(("", 2)) == pytest.approx(2.0)  # 3 tokens / 150 ms against 1 / 100 ms


def test_validation_and_factory():
    for kw in (dict(ks=()), dict(ks=(0, 2)), dict(c=-1), dict(discount=0)):
        with pytest.raises(ConfigError):
            BanditController(**kw)
    assert make_controller("bandit").ks == (1, 2, 3, 4, 6, 8)
    assert make_controller("bandit", 3).ks == (1, 2, 3)
    assert make_controller("bandit", 0).next_k() == 0
