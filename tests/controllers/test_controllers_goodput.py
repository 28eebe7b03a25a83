"""The goodput (cost-model) controller on scripted StepRecords and on a simulated machine (no model, no timing)."""

from __future__ import annotations

import dataclasses
import random
import statistics

import pytest
import torch

from adaspec.backends import Backend, costcurve
from adaspec.backends.costcurve import DEFAULT_WIDTHS, interpolate, measure_verify_curve
from adaspec.controllers import GoodputConfig, GoodputController, make_controller
from adaspec.controllers.costmodel import MeasuredCosts, Recent, bucket_of, expected_tokens
from adaspec.controllers.acceptance import Acceptance
from adaspec.errors import ConfigError
from adaspec.stats import StepRecord


def rec(drafted: int, accepted: int, *, draft_ms: float = 0.0, verify_ms: float = 100.0, ctx: int = 100,
        drafter: str = "d", k: int | None = None, overhead: float = 0.0) -> StepRecord:
    return StepRecord(k=drafted if k is None else k, drafted=drafted, accepted=accepted, emitted=accepted + 1,
                      context_len=ctx, draft_ms=draft_ms, verify_ms=verify_ms,
                      total_ms=draft_ms + verify_ms + overhead, drafter=drafter if drafted else "")


class Machine:
    """A simulated target + drafter: per-token draft cost, verify cost curve t_v(n), per-position acceptance."""

    def __init__(self, draft_ms: float, verify, alphas, *, seed: int = 0, ctx: int = 100) -> None:
        self.draft_ms, self.verify, self.alphas = draft_ms, verify, alphas
        self.rng = random.Random(seed)
        self.ctx = ctx

    def step(self, k: int, drafter: str = "d") -> StepRecord:
        accepted = 0
        while accepted < k and self.rng.random() < self.alphas[min(accepted, len(self.alphas) - 1)]:
            accepted += 1
        return rec(k, accepted, draft_ms=k * self.draft_ms, verify_ms=self.verify(k + 1), ctx=self.ctx,
                   drafter=drafter)

    def goodput(self, k: int) -> float:
        return expected_tokens(list(self.alphas) + [self.alphas[-1]] * 16, k) / (k * self.draft_ms + self.verify(k + 1))

    def best_k(self, k_max: int = 8) -> int:
        return max(range(k_max + 1), key=self.goodput)


def drive(ctrl, machine: Machine, steps: int) -> list[int]:
    ks = []
    for _ in range(steps):
        k = ctrl.next_k()
        ks.append(k)
        ctrl.update(machine.step(k))
    return ks


# Pieces -------------------------------------------------------------------------------------------------------
def test_expected_tokens_matches_leviathan_closed_form():
    for alpha in (0.0, 0.3, 0.8, 1.0):
        for k in range(6):
            closed = k + 1 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
            assert expected_tokens([alpha] * 8, k) == pytest.approx(closed)
    assert expected_tokens([0.5, 0.4], 2) == pytest.approx(1 + 0.5 + 0.2)


def test_recent_is_a_median():
    r = Recent(5)
    assert not r
    for x in (10, 11, 9, 500, 10):
        r.add(x)
    assert r.value == 10  # the outlier does not move it
    for x in (20, 20, 20):
        r.add(x)
    assert r.value == 20  # the window follows a real change


def test_buckets():
    assert bucket_of(0) == bucket_of(255) == 0
    assert bucket_of(256) == 1 and bucket_of(1023) == 2 and bucket_of(10**9) == 8


def test_cost_model_verify_curve_is_measured_and_filled_from_its_shape():
    costs = MeasuredCosts()
    assert not costs.measured
    costs.observe(rec(0, 0, verify_ms=100.0))
    assert costs.measured
    assert costs.verify_ms(5, 0) == 100.0  # one point: flat until measured
    costs.observe(rec(2, 1, draft_ms=20.0, verify_ms=120.0))  # n = 3
    assert costs.verify_ms(1, 0) == 100.0 and costs.verify_ms(3, 0) == 120.0
    assert costs.verify_ms(2, 0) == pytest.approx(110.0)  # interpolated
    assert costs.verify_ms(5, 0) == pytest.approx(140.0)  # extended linearly: 10 ms per token
    assert costs.draft_ms("d", 0) == 10.0 and costs.draft_ms("other", 0) is None
    # Another bucket with only plain steps measured takes its shape from the pooled curve.
    for _ in range(3):
        costs.observe(rec(0, 0, verify_ms=200.0, ctx=5000))
    b = bucket_of(5000)
    assert costs.verify_ms(1, b) == 200.0
    assert costs.verify_ms(3, b) == pytest.approx(200.0 * costs._shape(3, b) / costs._shape(1, b))
    assert costs.draft_ms("d", b) == 10.0  # nearest measured bucket
    assert costs.verify_ms(1, bucket_of(300)) == 100.0  # nearest bucket for an unmeasured one


def test_cost_model_overhead_and_a_compute_bound_curve():
    costs = MeasuredCosts()
    for n in range(1, 10):
        costs.observe(rec(n - 1, 0, draft_ms=5.0 * (n - 1), verify_ms=50.0 * n, overhead=3.0))
    assert costs.overhead_ms() == pytest.approx(3.0)
    assert [costs.verify_ms(n, 0) for n in (1, 4, 9)] == [50.0, 200.0, 450.0]
    assert costs.verify_ms(12, 0) == pytest.approx(600.0)


def test_acceptance_is_position_dependent_and_shrunk():
    acc = Acceptance(4, forget=1.0, shrink=2.0, prior=0.5)
    assert acc.rates() == [0.5] * 4
    for _ in range(20):
        acc.observe(4, 1)  # position 0 always accepted, position 1 always rejected
    a = acc.rates()
    assert a[0] == pytest.approx(21 / 22)
    assert a[1] == pytest.approx(2 * a[0] / 22)  # 0 of 20, shrunk toward a[0]
    assert a[2] == pytest.approx(a[1]) and a[3] == pytest.approx(a[1])  # never reached: the previous position
    acc.scale(0.0)
    assert acc.rates() == [0.5] * 4


def test_acceptance_forgets():
    acc = Acceptance(2, forget=0.5, shrink=1e-6, prior=0.5)
    for _ in range(10):
        acc.observe(1, 1)
    acc.observe(1, 0)
    assert acc.rates()[0] == pytest.approx(1 / 2, abs=0.01)  # the last rejection weighs as much as all the rest


# Decisions ----------------------------------------------------------------------------------------------------
def test_first_step_is_plain_then_an_unmeasured_drafter_is_tried_at_k_init():
    ctrl = GoodputController(k_init=3)
    assert ctrl.next_k() == 0
    ctrl.update(rec(0, 0))
    assert ctrl.next_k() == 3
    ctrl.update(rec(3, 3, draft_ms=30.0, verify_ms=101.0))
    assert ctrl.next_k() > 0


@pytest.mark.parametrize("draft_ms,verify,alphas", [
    (10.0, lambda n: 100.0, [0.9]),                   # memory-bound, good drafter: long drafts
    (10.0, lambda n: 100.0 + 40.0 * (n - 1), [0.9]),   # compute-bound verification: shorter
    (40.0, lambda n: 100.0, [0.7]),                    # expensive drafter
    (5.0, lambda n: 100.0 + 2 * n, [0.6, 0.8, 0.9]),   # acceptance rises with position
    (10.0, lambda n: 100.0 + 3 * n, [0.3, 0.2]),       # a poor drafter
])
def test_goodput_finds_the_best_k_of_a_simulated_machine(draft_ms, verify, alphas):
    machine = Machine(draft_ms, verify, alphas, seed=1)
    ctrl = GoodputController()
    ks = drive(ctrl, machine, 400)[-200:]
    best = machine.best_k()
    chosen = max(set(ks), key=ks.count)
    # The most used K is the optimum or a neighbour within 3% of its goodput.
    assert machine.goodput(chosen) >= 0.97 * machine.goodput(best), (chosen, best)
    assert sum(machine.goodput(k) for k in ks) / len(ks) >= 0.93 * machine.goodput(best)


def test_goodput_stays_plain_when_nothing_pays_and_probes_with_backoff():
    machine = Machine(60.0, lambda n: 100.0 + 5 * n, [0.2])  # best K is 0
    assert machine.best_k() == 0
    ctrl = GoodputController(probe_init=4, probe_max=16)
    ks = drive(ctrl, machine, 300)
    assert sum(k > 0 for k in ks[50:]) <= 20  # only the probes
    spec_positions = [i for i, k in enumerate(ks) if k > 0 and i >= 50]
    gaps = [b - a for a, b in zip(spec_positions, spec_positions[1:])]
    assert gaps and max(gaps) == 17  # the probe gap doubles to probe_max (16 plain steps, then the probe)


def test_goodput_returns_from_plain_when_the_text_turns_predictable():
    ctrl = GoodputController(probe_init=4, probe_max=16)
    drive(ctrl, Machine(30.0, lambda n: 100.0, [0.1], seed=2), 150)
    assert ctrl.next_k() == 0 or ctrl.plain_run == 0
    ks = drive(ctrl, Machine(30.0, lambda n: 100.0, [0.95], seed=3), 120)
    assert sum(k > 0 for k in ks[-40:]) >= 38


def test_goodput_min_gain():
    machine = Machine(10.0, lambda n: 100.0, [0.2])  # speculation pays a little (K=1: 1.2 / 110 > 1 / 100)
    assert machine.best_k() >= 1
    eager = GoodputController()
    reluctant = GoodputController(min_gain=1.3)
    assert sum(k > 0 for k in drive(eager, machine, 200)[100:]) > 90
    assert sum(k > 0 for k in drive(reluctant, Machine(10.0, lambda n: 100.0, [0.2]), 200)[100:]) < 20


def test_goodput_uses_the_context_bucket_of_the_current_step():
    ctrl = GoodputController()
    fast = Machine(10.0, lambda n: 100.0, [0.8], ctx=100)
    slow = Machine(10.0, lambda n: 100.0 + 60.0 * (n - 1), [0.8], ctx=6000)
    drive(ctrl, fast, 200)
    k_short = ctrl.next_k()
    drive(ctrl, slow, 200)
    k_long = ctrl.next_k()
    assert k_short > k_long >= 0


def test_goodput_reset_keeps_costs_and_carries_acceptance():
    ctrl = GoodputController(carry=0.5)
    drive(ctrl, Machine(10.0, lambda n: 100.0, [0.9]), 100)
    reached = list(ctrl.acceptance["d"].reached)
    ctrl.reset()
    assert ctrl.acceptance["d"].reached == pytest.approx([r * 0.5 for r in reached])
    assert ctrl.costs.measured and ctrl.next_k() == 0  # the first step of a request is plain...
    ctrl.update(rec(0, 0))
    assert ctrl.next_k() > 0  # ...then it speculates at once


def test_goodput_routes_between_drafters():
    ctrl = GoodputController()
    ctrl.update(rec(0, 0, verify_ms=100.0))
    # Two drafters measured: a free lookup with modest acceptance and a costly model with high acceptance.
    for _ in range(30):
        ctrl.update(rec(8, 2, draft_ms=0.1, verify_ms=100.0, drafter="ngram"))
        ctrl.update(rec(2, 2, draft_ms=60.0, verify_ms=100.0, drafter="model"))
    assert ctrl.choose_drafter({"ngram": 10, "model": None}) == "ngram"  # ~3 tokens for free beats 3 for 160 ms
    assert ctrl.next_k() >= 3
    assert ctrl.choose_drafter({"ngram": 0, "model": None}) == "model"  # no match: the model
    assert ctrl.next_k() >= 1
    assert ctrl.choose_drafter({"ngram": 2, "model": None}) in ("ngram", "model")
    k = ctrl.next_k()
    assert k >= 1
    assert ctrl.choose_drafter({"ngram": 2}) == "ngram" and ctrl.next_k() <= 2  # capped by the match
    ctrl.choose_drafter({"fresh": None})
    assert ctrl.next_k() == ctrl.config.k_init  # a new drafter is tried once at k_init
    assert ctrl.choose_drafter({"ngram": 0}) is None and ctrl.next_k() == 0  # nothing can propose: plain


def test_goodput_config_validation():
    for kw in (dict(k_init=0), dict(k_init=9), dict(min_gain=0), dict(forget=1.5), dict(carry=-0.1),
               dict(shrink=0), dict(window=0), dict(probe_init=0), dict(probe_init=9, probe_max=8)):
        with pytest.raises(ConfigError):
            GoodputController(**kw)


def test_make_controller_goodput():
    g = make_controller("goodput")
    assert isinstance(g, GoodputController) and g.config.k_init == 2 and g.config.k_max == 8
    g = make_controller("goodput", 12)
    assert g.config.k_init == 12 and g.config.k_max == 12
    assert make_controller("goodput", 0).next_k() == 0


def _peaked(q: float, vocab: int = 10) -> torch.Tensor:
    probs = torch.full((vocab,), (1 - q) / (vocab - 1))
    probs[0] = q
    return probs


def _draft(stop, qs: list[float], k: int) -> int:
    """Tokens drafted before the stop rule ends the draft (asked after every token but the K-th)."""
    for i, q in enumerate(qs[:k]):
        if i == k - 1 or stop(i, _peaked(q), 0):
            return i + 1
    return min(k, len(qs))


def test_goodput_stop_within_a_step_follows_calibrated_confidence():
    rng = random.Random(4)
    ctrl = GoodputController()
    stop = ctrl.draft_stop()
    ctrl.update(rec(0, 0, verify_ms=100.0))
    assert ctrl.next_k() == 2  # an unmeasured drafter: k_init, and it turns out to consult the stop rule
    assert stop(0, _peaked(0.9), 0) is False  # no plan yet: no stop
    ctrl.update(rec(2, 2, draft_ms=20.0))  # the first draft feeds the whole prompt: not a steady measurement
    assert "d" in ctrl.stoppable
    assert ctrl.next_k() == 2  # so it is tried again, now steady (it drafted the step before)
    ctrl.update(rec(2, 2, draft_ms=20.0, ctx=103))
    for _ in range(150):  # tokens the draft is sure of (q = 0.95) are accepted, unsure ones (q = 0.3) rejected
        k = ctrl.next_k()
        assert k == 8
        qs = [0.3 if rng.random() < 0.2 else 0.95 for _ in range(k)]
        n = _draft(stop, qs, k)
        accepted = next((i for i, q in enumerate(qs[:n]) if q < 0.5), n)
        ctrl.update(rec(n, accepted, draft_ms=10.0 * n, k=k))
    assert ctrl.calibration(0.95) > 0.9 and ctrl.calibration(0.3) < 0.1
    assert _draft(stop, [0.95] * 8, ctrl.next_k()) >= 6  # sure all along: a long draft
    assert _draft(stop, [0.95, 0.3] + [0.95] * 6, ctrl.next_k()) == 2  # stops right after the unsure token
    assert GoodputController(confidence_stop=False).draft_stop() is None


def _draft_asked_at_every_token(stop, qs: list[float], k: int) -> int:
    """Tokens drafted before the stop rule ends the draft, asked after every token as ModelDrafter does."""
    for i, q in enumerate(qs[:k]):
        if stop(i, _peaked(q), 0) or i == k - 1:
            return i + 1
    return min(k, len(qs))


def test_a_probe_drafts_deep_enough_to_learn_that_a_sure_draft_model_pays():
    # A draft model the target always agrees with (q = 0.95 at every token), at a cost where one drafted token does
    # not pay under the prior acceptance but four do: plain 50 ms, t_d 27 ms, t_v(n) = 50 + 12 (n - 1).
    verify = lambda n: 50.0 + 12.0 * (n - 1)  # noqa: E731
    ctrl = GoodputController(probe_init=6)
    ctrl.seed_draft_costs({"d": (27.0, 1.0)})
    stop = ctrl.draft_stop()
    ctrl.update(rec(0, 0, verify_ms=verify(1)))
    ctrl.next_k()  # the seeded drafter is priced: one step of it is the first probe
    drafted = []
    for step in range(60):
        k = ctrl.next_k()
        n = _draft_asked_at_every_token(stop, [0.95] * 8, k) if k else 0
        drafted.append(n)
        ctrl.update(rec(n, n, draft_ms=27.0 * n, verify_ms=verify(n + 1), ctx=100 + step, k=k))
    # A probe at the best K under what is known (one token) would never observe the later positions: the probe
    # drafts on while the draft is sure, and a probe that beat plain decoding keeps the probe gap short, so the
    # second probe is already deep and after a few more the controller speculates deep at every step.
    first_deep = next(i for i, n in enumerate(drafted) if n >= 4)
    assert first_deep <= 1 + 6 + 1 + 12 and drafted[first_deep] == 8
    assert min(drafted[35:]) >= 4


def test_draft_cost_and_catch_up_cost_are_measured_apart():
    ctrl = GoodputController()
    ctrl.update(rec(0, 0, ctx=100))
    ctrl.update(rec(2, 2, draft_ms=634.0, ctx=101))  # first draft: feeds the whole sequence (a lazy prefill)
    assert ctrl.costs.draft_ms("d", 0) is None  # not a draft time: unknown until a step without catch-up
    assert ctrl.next_k() == 2  # so the drafter is tried again
    ctrl.update(rec(2, 2, draft_ms=40.0, ctx=104))  # drafted the step before: only 2 tokens to feed
    assert ctrl.costs.draft_ms("d", 0) == 20.0
    assert ctrl.costs.feed_ms("d", 0) == 6.0  # the first draft, booked as catch-up: (634 - 2 * 20) / (101 - 2)
    for ctx in range(107, 117):
        ctrl.update(rec(0, 0, ctx=ctx))
    ctrl.update(rec(1, 1, draft_ms=60.0, ctx=117))  # 12 tokens behind: 10 beyond the steady 2, 40 ms of catch-up
    assert ctrl.costs.feed_ms("d", 0) == 5.0 and ctrl.costs.draft_ms("d", 0) == 20.0  # median of 6 and 4
    ctrl.reset()
    ctrl.update(rec(0, 0, ctx=300))
    ctrl.update(rec(2, 2, draft_ms=2000.0, ctx=301))  # a new request: lazily prefilled again
    assert ctrl.costs.draft_ms("d", 0) == 20.0
    assert ctrl.costs.feed_ms("d", 0) == 6.0  # median of 6, 4 and (2000 - 40) / 299 = 6.6


def test_catch_up_cost_keeps_a_lagging_draft_model_out_unless_it_pays_back():
    def trained(feed_ms: float) -> GoodputController:
        ctrl = GoodputController(horizon=16)
        ctx = 100
        ctrl.update(rec(0, 0, ctx=ctx))
        for i in range(20):  # steady drafting: 3 tokens per 130 ms against 1 per 100 ms plain
            ctx += 1 if i == 0 else 3  # (the first draft also feeds the 99 prompt tokens it has not seen)
            ctrl.update(rec(2, 2, draft_ms=20.0 + (99 * feed_ms if i == 0 else 0.0), ctx=ctx))
        for _ in range(12):
            ctx += 1
            ctrl.update(rec(0, 0, ctx=ctx))
        ctrl.update(rec(2, 2, draft_ms=20.0 + 10 * feed_ms, ctx=ctx + 1))  # 12 behind: 10 tokens of catch-up
        ctrl.reset()  # a new request with a 1000-token prompt: the draft model has seen none of it
        ctrl.update(rec(0, 0, ctx=1000))
        return ctrl

    assert trained(feed_ms=0.5).next_k() > 0  # 1000 tokens × 0.5 ms, spread over 16 steps: still pays
    cheap_to_skip = trained(feed_ms=30.0)
    assert cheap_to_skip.costs.feed_ms("d", 0) == pytest.approx(30.0)
    assert cheap_to_skip.next_k() == 0  # 30 s of catch-up for a 2x gain on 16 steps does not pay
    probes = []
    for i in range(60):  # and no probe either: catching up costs far more than the probe budget
        probes.append(cheap_to_skip.next_k())
        cheap_to_skip.update(rec(0, 0, ctx=1001 + i))
    assert probes == [0] * 60


# A measured verification curve (seeded in the warm-up) ---------------------------------------------------------
# One forward of n tokens, ms, of llama.cpp-like runtimes on 2 AVX2 cores: verification cheap but not flat, and
# verification expensive.
CHEAP = {1: 65.0, 2: 80.0, 3: 87.0, 4: 99.0, 5: 111.0, 6: 123.0, 8: 157.0}
EXPENSIVE = {1: 80.0, 2: 122.0, 3: 163.0, 4: 201.0, 5: 256.0, 6: 292.0, 8: 426.0}


def piecewise(curve: dict, n: int) -> float:
    """The curve read independently: the straight line between the measured widths around n; beyond the largest,
    the last segment's line."""
    if n in curve:
        return curve[n]
    xs = sorted(curve)
    lo, hi = (xs[-2], xs[-1]) if n > xs[-1] else (max(x for x in xs if x < n), min(x for x in xs if x > n))
    return curve[lo] + (curve[hi] - curve[lo]) * (n - lo) / (hi - lo)


def brute_force_k(curve: dict, alpha: float, draft_ms: float, overhead: float, k_max: int = 8) -> int:
    """argmax over K = 0..k_max of E(K) / (K t_d + t_v(K + 1) + o), E(K) = Σ_{j<=K} α^j (K = 0: plain)."""
    def goodput(k: int) -> float:
        return sum(alpha ** j for j in range(k + 1)) / (k * draft_ms + piecewise(curve, k + 1) + overhead)
    return max(range(k_max + 1), key=goodput)


def seeded(curve: dict, alpha: float, draft_ms: float, overhead: float = 3.0, ctx: int = 100) -> GoodputController:
    """A controller whose verification costs come from ``curve`` alone (seeded; the steps it saw agree with it),
    with draft time ``draft_ms`` per token, acceptance ``alpha`` at every position and a synced drafter."""
    ctrl = GoodputController()
    ctrl.costs.seed_verify(curve, ctx)
    ctrl.acceptance["d"] = Acceptance(ctrl.config.k_max, forget=1.0, shrink=2.0, prior=alpha)  # no counts: α
    ctrl.update(rec(0, 0, verify_ms=curve[1], ctx=ctx, overhead=overhead))  # a request's first (plain) step
    ctrl.costs.observe(rec(1, 1, draft_ms=draft_ms, verify_ms=curve[2], ctx=ctx, overhead=overhead), behind=2)
    ctrl.set_synced({"d": ctrl.context_len})  # nothing to catch up
    return ctrl


def test_cost_model_seeded_curve_is_interpolated_extended_and_overridden():
    costs = MeasuredCosts()
    costs.seed_verify(CHEAP, context_len=100)
    assert costs.measured
    assert {n: costs.verify_ms(n, 0) for n in CHEAP} == CHEAP
    assert costs.verify_ms(7, 0) == pytest.approx(140.0)  # between 6 and 8: (123 + 157) / 2
    assert costs.verify_ms(9, 0) == pytest.approx(174.0)  # beyond 8: the last segment's slope, 17 ms per token
    assert costs.verify_ms(10, 0) == pytest.approx(191.0)
    assert costs.verify_ms(9, bucket_of(5000)) == pytest.approx(174.0)  # an empty bucket: the nearest one's
    # Real observations win in their bucket, and set the seeded curve's level there: a width not observed is its
    # nearest observed width scaled by the seed's shape, never the seed's own value next to observed ones.
    costs.observe(rec(2, 1, draft_ms=20.0, verify_ms=95.0))  # n = 3, observed 95 / 87 of the seed
    assert costs.verify_ms(3, 0) == 95.0
    assert costs.verify_ms(2, 0) == pytest.approx(95.0 * 80.0 / 87.0)
    assert costs.verify_ms(4, 0) == pytest.approx(95.0 * 99.0 / 87.0)
    assert costs.verify_ms(9, 0) == pytest.approx(95.0 * 174.0 / 87.0)
    costs.observe(rec(0, 0, verify_ms=65.0))  # n = 1 as seeded: one level for the bucket, the median of the two
    level = (95.0 / 87.0 + 65.0 / 65.0) / 2
    assert costs.verify_ms(2, 0) == pytest.approx(80.0 * level)
    assert costs.verify_ms(5, 0) == pytest.approx(111.0 * level)
    assert costs.verify_ms(1, 0) == 65.0 and costs.verify_ms(3, 0) == 95.0  # observed widths as observed
    # A bucket with observations of its own: its nearest observed width scaled by the seeded curve's shape.
    b = bucket_of(5000)
    costs.observe(rec(0, 0, verify_ms=130.0, ctx=5000))  # twice the seeded t_v(1)
    assert costs.verify_ms(1, b) == 130.0
    assert costs.verify_ms(4, b) == pytest.approx(2 * 99.0)
    assert costs.verify_ms(7, b) == pytest.approx(2 * 140.0)
    assert costs.verify_ms(9, b) == pytest.approx(2 * 174.0)
    with pytest.raises(ValueError):
        costs.seed_verify({}, 100)


def test_interpolate():
    assert interpolate({3: 50.0}, 7) == 50.0  # one point: flat
    assert interpolate({1: 10.0, 3: 30.0}, 2) == pytest.approx(20.0)
    assert interpolate({1: 10.0, 3: 30.0, 4: 50.0}, 6) == pytest.approx(90.0)  # last segment: 20 per token
    assert interpolate({2: 10.0, 4: 30.0}, 1) == pytest.approx(0.5)  # first segment, floored at 5% of the minimum


@pytest.mark.parametrize("curve", [CHEAP, EXPENSIVE], ids=["cheap", "expensive"])
@pytest.mark.parametrize("alpha", [0.9, 0.95])
@pytest.mark.parametrize("draft_ms", [0.0, 10.0], ids=["free-drafter", "10ms-drafter"])
def test_goodput_picks_the_best_k_on_a_seeded_curve(curve, alpha, draft_ms):
    ctrl = seeded(curve, alpha, draft_ms)
    assert ctrl.next_k() == brute_force_k(curve, alpha, draft_ms, overhead=3.0)


def brute_force_forced_k(curve: dict, alpha: float, draft_ms: float, overhead: float, forced: int,
                         k_max: int = 8) -> int:
    """argmax over K = 0..k_max of (f + E(K)) / (K t_d + f t_f + t_v(f + K + 1) + o): the step verifies the f
    forced tokens ahead of K (emitted with certainty); a draft model feeds them first at t_f = t_d / 4 per token
    (the cost model's feed price before one is measured); K = 0 drafts nothing, so feeds nothing."""
    def goodput(k: int) -> float:
        feed = forced * draft_ms / 4 if k else 0.0
        return (forced + sum(alpha ** j for j in range(k + 1))) / (
            k * draft_ms + feed + piecewise(curve, forced + k + 1) + overhead)
    return max(range(k_max + 1), key=goodput)


@pytest.mark.parametrize("curve", [CHEAP, EXPENSIVE], ids=["cheap", "expensive"])
@pytest.mark.parametrize("alpha,draft_ms", [(0.95, 0.0), (0.95, 10.0), (0.9, 4.0)])
@pytest.mark.parametrize("forced", [0, 3, 6])
def test_goodput_prices_k_behind_the_grammars_forced_tokens(curve, alpha, draft_ms, forced):
    """With f forced tokens ahead of the draft, each drafted token adds verification at width f + K + 1 (where the
    curve is steeper on a CPU) while the step already emits f + 1 tokens: the best K is the brute-force optimum of
    that step, and never deeper than without forced tokens."""
    ctrl = seeded(curve, alpha, draft_ms)
    ctrl.probe_gap["d"] = 99  # not due for a probe: where nothing pays, the step drafts nothing of its own
    ctrl.set_forced(forced)
    expected = brute_force_forced_k(curve, alpha, draft_ms, overhead=3.0, forced=forced)
    assert expected <= brute_force_k(curve, alpha, draft_ms, overhead=3.0)
    assert ctrl.next_k() == expected
    ctrl.reset()
    assert ctrl.forced == 0  # told again before each step of the next request
    unpriced = seeded(curve, alpha, draft_ms)
    unpriced.config = GoodputConfig(price_forced=False)
    unpriced.set_forced(forced)  # ignored: K as if nothing were forced
    assert unpriced.next_k() == brute_force_k(curve, alpha, draft_ms, overhead=3.0)


def test_the_cost_model_prices_a_step_behind_forced_tokens():
    """T_F(K) = K t_d + F t_f + t_v(F + K + 1) + o and T_F(plain) = t_v(F + 1) + o, on a seeded curve."""
    costs = MeasuredCosts()
    costs.seed_verify(CHEAP, 100)
    costs.seed_draft("d", 4.0, 1.0)  # 4 ms per drafted token, 1 ms per token fed
    b = bucket_of(100)
    assert costs.plain_step_ms(b, 3) == CHEAP[4] and costs.plain_step_ms(b) == CHEAP[1]
    assert costs.spec_step_ms(2, b, "d", 5.0, forced=3) == pytest.approx(2 * 4.0 + 3 * 1.0 + CHEAP[6] + 5.0)
    assert costs.spec_step_ms(2, b, "d") == pytest.approx(2 * 4.0 + CHEAP[3])


def test_forced_tokens_price_the_width_they_were_verified_at():
    """A step the controller sees without the grammar's forced tokens (drafted = the wrapped drafter's own) was
    verified f wider: its time is the verification of f + drafted + 1 tokens, not of a plain step, and the
    drafter has fed the forced tokens too."""
    ctrl = GoodputController()
    ctrl.update(rec(0, 0, verify_ms=50.0, ctx=100))
    forced_only = StepRecord(k=0, drafted=0, accepted=0, emitted=5, context_len=101, draft_ms=0.0, verify_ms=90.0,
                             total_ms=90.0, forced=4)
    ctrl.update(forced_only)
    b = bucket_of(101)
    assert ctrl.costs.verify[b][1].value == 50.0 and ctrl.costs.verify[b][5].value == 90.0
    ctrl.update(StepRecord(k=2, drafted=2, accepted=1, emitted=5, context_len=106, draft_ms=0.1, verify_ms=110.0,
                           total_ms=110.1, drafter="d", forced=2))
    assert ctrl.costs.verify[b][5].value == pytest.approx((90.0 + 110.0) / 2)  # widths 2 + 2 + 1 and 4 + 1
    assert ctrl.synced["d"] == 106 + 2 + 1  # the forced tokens and its first draft; the rejected one is gone
    off = GoodputController(price_forced=False)  # the ablation: the width as the drafted tokens alone
    off.update(forced_only)
    assert off.costs.verify[b][1].value == 90.0


def test_drafts_behind_forced_tokens_keep_their_own_acceptance():
    """Behind a forced run the next token is often all but forced (a quote or bracket the grammar allows in several
    spellings): the drafter's acceptance there is counted apart from its other drafts, so a drafter that misses
    elsewhere still drafts behind forced tokens, and not the other way round."""
    ctrl = seeded(CHEAP, 0.5, 0.0)
    for _ in range(10):
        ctrl.update(rec(2, 0, verify_ms=CHEAP[3]))  # free text: always wrong
        ctrl.update(dataclasses.replace(rec(2, 2, verify_ms=CHEAP[6]), forced=3))  # behind 3 forced: always right
    assert ctrl.acceptance["d|forced"].rates()[0] > 0.8 and ctrl.acceptance["d"].rates()[0] < 0.2
    ctrl.set_forced(3)
    assert ctrl.next_k() >= 2
    ctrl.set_forced(0)
    assert ctrl.next_k() == 0
    shared = seeded(CHEAP, 0.5, 0.0)
    shared.config = GoodputConfig(forced_apart=False)
    for _ in range(10):
        shared.update(rec(2, 0, verify_ms=CHEAP[3]))
        shared.update(dataclasses.replace(rec(2, 2, verify_ms=CHEAP[6]), forced=3))
    assert "d|forced" not in shared.acceptance and 0.3 < shared.acceptance["d"].rates()[0] < 0.7


def test_behind_forced_tokens_the_depth_probe_reads_the_acceptance_the_plan_was_priced_on():
    """Behind a forced token a lookup's drafts are all or nothing (every other one accepted to its end): only a
    depth probe finds that deep drafts pay there. It must read the record behind forced tokens (measured at its
    first position only), whatever the drafter's free-text record says (measured 8 deep here)."""
    ctrl = seeded(CHEAP, 0.9, 0.0)
    c = ctrl.config
    behind = Acceptance(c.k_max, c.forget, c.shrink, 0.9)
    free = Acceptance(c.k_max, c.forget, c.shrink, 0.9)
    for i in range(12):
        behind.observe(1, i % 2)  # K = 1 steps, half accepted
        free.observe(8, 8)
    ctrl.acceptance["d"], ctrl.acceptance["d|forced"] = free, behind
    ks = []
    for i in range(40):
        ctrl.set_forced(1)
        k = ctrl.next_k()
        ks.append(k)
        accepted = k if i % 2 == 0 else 0
        ctrl.update(dataclasses.replace(rec(k, accepted, verify_ms=CHEAP.get(k + 2, 157.0)), forced=1))
    assert max(ks) >= 5 and behind.reached[4] > 0, ks  # probed deep, and the probe's record is the one behind


def test_cheap_verification_reaches_long_drafts_and_expensive_stays_short():
    cheap = seeded(CHEAP, 0.95, 0.0).next_k()
    expensive = seeded(EXPENSIVE, 0.95, 0.0).next_k()
    # long drafts where verifying is cheap, short ones where it is not: exactly the brute-force optimum on each curve
    assert (cheap, expensive) == (brute_force_k(CHEAP, 0.95, 0.0, overhead=3.0),
                                  brute_force_k(EXPENSIVE, 0.95, 0.0, overhead=3.0)) == (6, 3)
    assert seeded(EXPENSIVE, 0.9, 10.0).next_k() < seeded(CHEAP, 0.9, 10.0).next_k()
    # Unseeded, the same controller knows only the widths it ran (n = 1 and 2 here): the seed is what lets K grow
    # on the real curve, not on a line through its first two points.
    ctrl = GoodputController()
    ctrl.acceptance["d"] = Acceptance(ctrl.config.k_max, forget=1.0, shrink=2.0, prior=0.95)
    ctrl.update(rec(0, 0, verify_ms=CHEAP[1], overhead=3.0))
    ctrl.costs.observe(rec(1, 1, verify_ms=CHEAP[2], overhead=3.0), behind=2)
    ctrl.set_synced({"d": ctrl.context_len})
    assert ctrl.costs.verify_ms(9, 0) == pytest.approx(65.0 + 8 * 15.0)  # linear through (1, 65) and (2, 80)


@pytest.mark.parametrize("slow", [1.5, 1.25, 0.8])
def test_a_curve_seeded_while_the_machine_ran_slow_or_fast_does_not_change_the_decisions(slow):
    """The warm-up's curve was measured while the VM ran ``slow`` times as slow as while decoding (it drifts 10-20 %
    within minutes; an `adaspec serve` warm-up measured 80 ms per plain step against 63-69 ms). Before the seed's
    level followed the live steps, a seed measured slow priced every width not yet run above the observations of
    the widths run, and the controller kept to the short drafts it kept confirming: on this machine (α = 0.8,
    best K = 5) it drafted at mean K 2.0-2.2 and reached 89 % of the best goodput with a 1.5x seed (90-93 % with
    1.25x). Now the seed gives only the shape: every decision is the one the controller seeded at the true level
    makes."""
    true = {n: 52.0 + 9.0 * n for n in range(1, 10)}  # ik_llama.cpp 1.5B Q4_K_M on 2 AVX2 cores: 61 / 97 ms at 1 / 5
    ks = {}
    for level in (1.0, slow):
        machine = Machine(0.3, lambda n: true[n], [0.8] * 8, seed=1)
        ctrl = GoodputController()
        ctrl.costs.seed_verify({n: level * ms for n, ms in true.items()}, 100)
        ks[level] = drive(ctrl, machine, 200)
    assert ks[slow] == ks[1.0]
    assert machine.best_k() == 5
    efficiency = statistics.mean(machine.goodput(k) for k in ks[slow][100:]) / machine.goodput(5)
    assert efficiency > 0.95
    # Observed widths at the machine's true speed, the rest from the seed: the seed's level cancels, so every
    # width is priced at its true cost (the old rule priced n = 7 at the seed's slow x 115 ms next to K = 2's
    # observed 79 ms).
    costs = MeasuredCosts()
    costs.seed_verify({n: slow * ms for n, ms in true.items()}, 100)
    for n in (1, 3):
        costs.observe(rec(n - 1, 0, verify_ms=true[n]))
    assert [costs.verify_ms(n, 0) for n in true] == pytest.approx(list(true.values()))


def test_a_noisy_seed_is_made_non_decreasing_and_one_level_serves_the_bucket():
    """A seed sample that went the wrong way (`adaspec serve` run 6c's warm-up: t(5) = 134, t(6) = 124 ms) is pooled,
    so K = 5 is not priced below K = 4; and observed widths timed in different spells of the VM set one level for
    the bucket (a median), so the widths between them keep rising with n."""
    seed = {1: 93.0, 2: 101.0, 3: 103.0, 4: 115.0, 5: 134.0, 6: 124.0, 7: 154.0, 9: 203.0}
    costs = MeasuredCosts()
    costs.seed_verify(seed, 100)
    assert costs.seeded[0][5] == costs.seeded[0][6] == pytest.approx(129.0)
    assert {n: v for n, v in costs.seeded[0].items() if n not in (5, 6)} == {n: v for n, v in seed.items()
                                                                            if n not in (5, 6)}
    true = {n: 52.0 + 9.0 * n for n in range(1, 10)}
    costs = MeasuredCosts()
    costs.seed_verify(true, 100)
    costs.observe(rec(0, 0, verify_ms=1.2 * true[1]))  # plain steps timed in a slow spell
    costs.observe(rec(4, 4, verify_ms=true[5]))  # K = 4 steps at the true speed
    curve = [costs.verify_ms(n, 0) for n in range(1, 10)]
    assert all(a <= b for a, b in zip(curve, curve[1:])), curve
    level = (1.2 + 1.0) / 2
    assert costs.verify_ms(3, 0) == pytest.approx(level * true[3])


def test_a_batched_rows_seed_stands_as_measured():
    """A batched row's observed steps time the whole batch's forward, while the batch's seed is indexed by the tokens
    in that forward: they are not on one curve, so the row keeps the seed's values as measured beside them."""
    ctrl = GoodputController()
    ctrl.seed_verify_costs(CHEAP, 64, level_from_steps=False)  # the batch pricer measures at 64 tokens
    ctrl.costs.observe(rec(2, 1, verify_ms=150.0))  # n = 3 in a batch: the whole forward
    assert ctrl.costs.verify_ms(3, 0) == 150.0
    assert ctrl.costs.verify_ms(5, 0) == CHEAP[5] and ctrl.costs.verify_ms(8, 0) == CHEAP[8]
    assert ctrl.costs.verify_ms(7, 0) == pytest.approx(140.0)
    # A row whose context passed 512 tokens records its steps in a bucket of its own: the old rule there too (the
    # nearest observed width scaled by the seed's shape), not a median level.
    b = bucket_of(600)
    for n, ms in ((1, 140.0), (5, 170.0)):
        ctrl.costs.observe(rec(n - 1, 0, verify_ms=ms, ctx=600))
    assert ctrl.costs.verify_ms(2, b) == pytest.approx(140.0 * 80.0 / 65.0)  # nearest: n = 1
    assert ctrl.costs.verify_ms(6, b) == pytest.approx(170.0 * 123.0 / 111.0)  # nearest: n = 5


def test_reseeding_smooths_the_raw_samples_and_bad_seeds_are_refused():
    costs = MeasuredCosts()
    costs.seed_verify({5: 134.0, 6: 124.0, 7: 154.0}, 100)
    for _ in range(5):
        costs.seed_verify({6: 124.0}, 100)  # the same sample again: no drift
    assert costs.seeded[0] == pytest.approx({5: 129.0, 6: 129.0, 7: 154.0})
    costs.seed_verify({1: 100.0, 2: 90.0}, 100)
    for _ in range(5):
        costs.seed_verify({2: 90.0, 3: 95.0}, 100)
    assert costs.seeded[0][1] == costs.seeded[0][2] == pytest.approx(95.0)  # pooled {100, 90}
    for bad in ({1: float("nan"), 2: 100.0}, {1: float("inf")}, {1: 0.0}, {}):
        with pytest.raises(ValueError, match="positive, finite"):
            costs.seed_verify(bad, 100)


class FakeClock:
    def __init__(self) -> None:
        self.ms = 0.0

    def perf_counter(self) -> float:
        return self.ms / 1e3


class CurveBackend(Backend):
    """A model-free backend whose forward of n tokens advances a fake clock by ``curve[n]`` ms (prefill: 1 ms per
    token); logs every forward as ``(n, num_logits)``."""

    def __init__(self, curve: dict, clock: FakeClock, max_context: int = 4096) -> None:
        self.curve, self.clock = curve, clock
        self.name, self.vocab_size, self.max_context = "curve", 16, max_context
        self.ids: list[int] = []
        self.log: list[tuple[int, int]] = []

    @property
    def seq_len(self) -> int:
        return len(self.ids)

    def forward(self, input_ids, num_logits=1):
        self.check_forward(len(input_ids), num_logits)
        self.log.append((len(input_ids), num_logits))
        self.clock.ms += self.curve.get(len(input_ids), float(len(input_ids)))
        self.ids.extend(int(t) for t in input_ids)
        return torch.zeros(num_logits, self.vocab_size)

    def truncate(self, length):
        assert 0 <= length <= len(self.ids)
        del self.ids[length:]


def test_measure_verify_curve_times_each_width_and_restores_the_cache(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(costcurve, "time", clock)
    backend = CurveBackend(CHEAP, clock)
    backend.forward([1, 2, 3], 1)
    before = list(backend.ids)
    backend.log.clear()
    curve = measure_verify_curve(backend, (1, 2, 3, 4, 5, 6, 8), context_len=300, repeats=3)
    assert curve == pytest.approx(CHEAP)
    assert backend.ids == before  # the cache holds exactly what it held
    assert backend.log[0] == (297, 1)  # extended to the asked context once
    assert sorted(backend.log[1:]) == sorted((n, n) for n in CHEAP for _ in range(3))  # logits for all n positions
    at_own_context = measure_verify_curve(backend, (1, 4), repeats=2)  # no context_len: at the cache's own
    assert at_own_context == pytest.approx({1: 65.0, 4: 99.0}) and backend.ids == before
    with pytest.raises(ValueError):
        measure_verify_curve(backend, (1, 8), context_len=4090)


def test_calibrate_seeds_the_controller_and_the_warm_up_calls_it(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(costcurve, "time", clock)
    ctrl = GoodputController()
    assert ctrl.calibrate(CurveBackend(CHEAP, clock), context_len=300, widths=tuple(CHEAP)) == pytest.approx(CHEAP)
    assert list(ctrl.costs.seeded) == [bucket_of(300)]
    assert ctrl.costs.seeded[bucket_of(300)] == pytest.approx(CHEAP)
    assert ctrl.calibrate(CurveBackend(CHEAP, clock, max_context=8), context_len=6) == pytest.approx({1: 65.0,
                                                                                                      2: 80.0})
    assert ctrl.calibrate(CurveBackend(CHEAP, clock, max_context=4), context_len=4) == {}  # no room: nothing
    # The engine's warm-up calibrates a controller that can, at the warm-up's context.
    from adaspec.drafters import NgramDrafter
    from adaspec.engine import SpeculativeEngine

    ctrl = GoodputController()
    full = {**CHEAP, 7: 140.0, 9: 174.0}  # every default width (the fake backend takes n ms for a width it lacks)
    engine = SpeculativeEngine(CurveBackend(full, clock), NgramDrafter(), ctrl)
    engine.warmup(list(range(1, 9)), steps=3)
    seeded = ctrl.costs.seeded[0]
    assert list(ctrl.costs.seeded) == [0] and sorted(seeded) == list(DEFAULT_WIDTHS)  # n = K + 1 up to k_max + 1
    assert seeded == pytest.approx({n: full[n] for n in DEFAULT_WIDTHS})
    assert engine.verify_curve == pytest.approx(seeded)  # kept for the server to print
    fixed = SpeculativeEngine(CurveBackend(CHEAP, clock), NgramDrafter(), make_controller("fixed", 3))
    fixed.warmup()  # no calibrate
    assert fixed.verify_curve == {}
    quiet = GoodputController()
    quiet.calibrate = lambda backend: None  # a controller whose calibrate returns nothing
    engine = SpeculativeEngine(CurveBackend(CHEAP, clock), NgramDrafter(), quiet)
    engine.warmup()
    assert engine.verify_curve == {}


# Catch-up when a draft model kept its cache from an earlier request ---------------------------------------------
def test_catch_up_counts_only_the_tokens_a_drafter_lacks():
    ctrl = GoodputController(horizon=16)
    ctx = 100
    ctrl.update(rec(0, 0, ctx=ctx))
    for i in range(20):  # steady drafting: 3 tokens per 120 ms against 1 per 100 ms plain; feeding: 30 ms per token
        ctx += 1 if i == 0 else 3
        ctrl.update(rec(2, 2, draft_ms=20.0 + (99 * 30.0 if i == 0 else 0.0), ctx=ctx))
    assert ctrl.costs.feed_ms("d", 0) == pytest.approx(30.0)
    ctrl.reset()  # a new 1000-token prompt of which the draft model's cache already holds 990 tokens
    ctrl.set_synced({"d": 990})
    ctrl.update(rec(0, 0, ctx=1000))
    assert ctrl.next_k() > 0  # 11 tokens behind: 9 × 30 ms of catch-up over 16 steps pays
    ctrl.update(rec(2, 2, draft_ms=20.0 + 9 * 30.0, ctx=1001))
    assert ctrl.costs.feed_ms("d", 0) == pytest.approx(30.0)  # and that step's catch-up is booked as 9 tokens
    ctrl.reset()  # the same prompt, told nothing: all 1000 tokens to feed (30 s) do not pay
    ctrl.update(rec(0, 0, ctx=1000))
    assert ctrl.next_k() == 0


def test_engine_tells_the_controller_what_the_draft_model_holds():
    from conftest import MarkovBackend, markov_table
    from test_drafters import Spy

    from adaspec.drafters import ModelDrafter
    from adaspec.engine import GenerationConfig, SpeculativeEngine

    class Always(GoodputController):
        """Speculates with K = 2 after each request's first step, whatever the costs (the bookkeeping under test)."""

        def decide(self, options):
            return (None, 0) if self.fresh else ("draft", 2)

    ctrl = Always()  # lazy prefill (the default): the draft feeds what it lacks at its first proposal
    behinds: list[tuple[StepRecord, int]] = []
    observe = ctrl.costs.observe
    ctrl.costs.observe = lambda step, behind=0: (behinds.append((step, behind)), observe(step, behind))
    table = markov_table(16, seed=3, scale=3.0)
    spy = Spy(MarkovBackend(table + 0.7 * torch.randn(table.shape, generator=torch.Generator().manual_seed(4)),
                            "draft"))
    engine = SpeculativeEngine(MarkovBackend(table, "target"), ModelDrafter(spy), ctrl)
    cfg = GenerationConfig(max_new_tokens=12, ignore_eos=True)
    p1 = [random.Random(6).randrange(16) for _ in range(50)]
    out1 = engine.generate(p1, cfg).token_ids
    p2 = p1 + out1 + [4, 4, 7]
    first_token = SpeculativeEngine(MarkovBackend(table, "target")).generate(p2, GenerationConfig(1)).token_ids[0]
    held = engine.drafter.cached_prefix(p2 + [first_token])
    assert held >= len(p1) + len(out1) - 3
    told: list[dict] = []
    set_synced = ctrl.set_synced
    ctrl.set_synced = lambda synced, catch_up=None: (told.append(dict(synced)), set_synced(synced, catch_up))
    behinds.clear()
    spy.fed.clear()
    engine.generate(p2, cfg)
    assert told == [{"draft": held}]  # at the request's start, after reset
    step, behind = next((step, behind) for step, behind in behinds if step.drafted)
    assert behind == spy.fed[0] == step.context_len - held  # priced as the tokens the draft really fed
    assert behind <= 3 + 2 + 3  # the new message, two target tokens, the previous answer's tail


# Probing is per drafter -------------------------------------------------------------------------------------------
def test_a_drafter_that_pays_now_and_then_does_not_keep_another_from_being_probed():
    """Hybrid drafting: a free lookup drafter that matches every third step (and pays then) and a draft model that
    does not pay on what is known of it. The draft model is still re-measured (probed) now and then, with its gap
    doubling while it keeps losing; before probes were counted per drafter, every lookup step reset the one probe
    counter and the draft model was never tried again."""
    ctrl = GoodputController(probe_init=4, probe_max=16)
    ctx = 100
    ctrl.update(rec(0, 0, ctx=ctx))
    for d, ms in (("lookup", 0.1), ("model", 40.0)):  # measured once each: lookup pays, the model not (α 0.25)
        for _ in range(3):
            ctrl.update(rec(2, 2 if d == "lookup" else 0, draft_ms=2 * ms, ctx=ctx, drafter=d))
            ctx += 1
    used = []
    for step in range(200):
        options = {"lookup": 4 if step % 3 == 0 else 0, "model": None}
        name = ctrl.choose_drafter(options)
        k = ctrl.next_k()
        used.append(name if k else None)
        if name == "lookup":
            ctrl.update(rec(k, k, draft_ms=0.1 * k, ctx=ctx, drafter="lookup"))
        elif name == "model":
            ctrl.update(rec(k, 0, draft_ms=40.0 * k, ctx=ctx, drafter="model"))
        else:
            ctrl.update(rec(0, 0, ctx=ctx))
        ctx += 1
    lookups = [i for i, n in enumerate(used) if n == "lookup"]
    probes = [i for i, n in enumerate(used) if n == "model"]
    assert len(lookups) >= 60  # the lookup drafter is used whenever it matches
    assert 4 <= len(probes) <= 20  # the model is probed, and not often
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps == sorted(gaps) and gaps[-1] > gaps[0]  # its probe gap grows while it keeps losing


def test_a_probe_may_spend_on_catch_up_only_a_share_of_the_request_so_far():
    """Ski-rental: a draft model 300 ms of catch-up behind (a chat prompt to feed) is not probed while the request
    has cost little (a short answer could not earn the prefill back), and is once it has run long enough:
    0.25 × the request's time >= 300 ms, i.e. after ~12 plain steps of 100 ms."""
    ctrl = GoodputController(probe_init=2, probe_max=2, probe_share=0.25, probe_budget=8.0)
    ctrl.update(rec(0, 0, ctx=10))
    for _ in range(3):  # the model's costs, measured earlier: 40 ms per draft token, 5 ms per token of catch-up
        ctrl.update(rec(2, 0, draft_ms=80.0, ctx=10, drafter="model"))
    ctrl.costs.feed["model"] = type(ctrl.costs.overhead)()
    ctrl.costs.feed["model"].add(5.0)
    ctrl.reset()  # a new request: the model holds nothing of its 62-token prompt -> 60 × 5 ms = 300 ms to feed
    ctrl.set_synced({"model": 0})
    ctrl.update(rec(0, 0, ctx=62))
    first_probe = None
    for step in range(1, 40):
        if ctrl.choose_drafter({"model": None}) == "model" and ctrl.next_k() > 0:
            first_probe = step
            break
        ctrl.next_k()
        ctrl.update(rec(0, 0, ctx=62 + step))
    assert ctrl.request_ms >= 0.25 ** -1 * 300.0 - 100.0  # not before ~12 steps of 100 ms ...
    assert first_probe is not None and 10 <= first_probe <= 20  # ... and soon after


# A draft model's first proposal, priced before it is paid -----------------------------------------------------------
def test_a_seeded_draft_model_is_priced_before_its_first_proposal():
    """Unseeded, the goodput controller tries a draft model it never measured at k_init at the request's second
    step, whatever the prompt it must feed first. Seeded with measured costs, it prices that first proposal: a short
    prompt's catch-up pays (it speculates), a 1000-token one does not and, costing more than the probe budget
    (8 plain steps), is never probed in a short request. Its own steps then replace the seed."""
    curve = {1: 100.0, 2: 104.0, 3: 108.0, 5: 116.0, 9: 132.0}

    def first_choices(seed: bool, ctx: int) -> list[int]:
        ctrl = GoodputController()
        ctrl.seed_verify_costs(curve, ctx)
        if seed:
            ctrl.seed_draft_costs({"model": (10.0, 2.0)})
        ctrl.set_synced({"model": 0})
        ks = []
        for step in range(30):
            ctrl.update(rec(0, 0, ctx=ctx + step))
            ctrl.choose_drafter({"model": None})
            ks.append(ctrl.next_k())
            if ks[-1]:
                break
        return ks

    assert first_choices(False, 1000) == [2]  # blind: tried at once, 1000 tokens fed inside that step
    assert first_choices(True, 20)[0] > 0  # 18 tokens × 2 ms of catch-up: speculating pays from the start
    assert first_choices(True, 1000) == [0] * 30  # 2 s of catch-up: neither pays nor fits a probe's budget
    ctrl = GoodputController()
    ctrl.seed_draft_costs({"model": (10.0, 2.0)})
    assert ctrl.costs.draft_ms("model", 0) == 10.0 and ctrl.costs.feed_ms("model", 0) == 2.0
    ctrl.update(rec(0, 0, ctx=20))
    for i in range(3):  # steady steps (nothing to catch up): 30 ms per drafted token measured
        ctrl.set_synced({"model": 21 + 3 * i})
        ctrl.update(rec(2, 2, draft_ms=60.0, ctx=21 + 3 * i, drafter="model"))
    assert ctrl.costs.draft_ms("model", 0) == pytest.approx(30.0)
    assert ctrl.draft_costs() == {"model": (pytest.approx(30.0), 2.0)}
    with pytest.raises(ValueError, match="draft_ms > 0"):
        ctrl.seed_draft_costs({"model": (0.0, 1.0)})


def test_measure_draft_costs_leaves_the_cache_as_it_was():
    from conftest import MarkovBackend, markov_table

    backend = MarkovBackend(markov_table(16, seed=1), "draft", max_context=80)
    backend.forward([1, 2, 3], 1)
    draft_ms, feed_ms = costcurve.measure_draft_costs(backend, feed_tokens=8, repeats=2)
    assert draft_ms > 0 and feed_ms > 0 and backend.ids == [1, 2, 3]
    assert backend.forward_calls == 1 + 2 * 2  # per repeat: one feed of 8 tokens, one drafting step
    with pytest.raises(ValueError, match="exceeds its context window"):
        costcurve.measure_draft_costs(backend, feed_tokens=77)


def test_warmup_measures_draft_costs_even_when_the_draft_cache_holds_the_warmup_prompt(qwen):
    """Engines sharing a drafter (compare's methods) warm up one after another on the same prompt: from the second on,
    the draft cache holds it, the warm-up generation times no catch-up, and the controller used to price the first
    real catch-up by a guess (a quarter of a drafting step per token: 17 times the measured cost of a bf16 catch-up
    with a 0.5B draft on an AMX CPU, which kept goodput on plain decoding for whole requests). The warm-up now measures both costs on the
    draft's backend and seeds them."""
    from adaspec.backends import TorchBackend
    from adaspec.backends.torch_models import truncated_layers
    from adaspec.controllers import FixedController
    from adaspec.drafters import ModelDrafter
    from adaspec.engine import SpeculativeEngine

    target = TorchBackend(qwen, "t")
    drafter = ModelDrafter(TorchBackend(truncated_layers(qwen, 2), "d"))
    SpeculativeEngine(target, drafter, FixedController(3)).warmup()  # leaves the warm-up prompt in the draft cache
    ctrl = GoodputController()
    SpeculativeEngine(target, drafter, ctrl).warmup()
    assert "d" not in ctrl.costs.feed  # no catch-up was timed by the warm-up generation...
    draft_ms, feed_ms = ctrl.costs.draft_seed["d"]  # ...but both costs were measured on the draft's backend
    assert 0 < feed_ms < draft_ms and ctrl.costs.feed_ms("d", 0) == feed_ms


def test_a_drafter_that_pays_does_not_keep_a_free_lookup_with_a_long_match_from_being_probed():
    """Hybrid drafting where the draft model pays (α 0.9) and the free lookup drafter failed once early on: when the
    lookup matches a long continuation again, it is probed (it would beat the model if its drafts were accepted),
    wins, and is used from then on; before, a paying draft model kept the lookup from ever being tried again."""
    rng = random.Random(1)
    ctrl = GoodputController(probe_init=4, probe_max=16)
    ctx = 100
    ctrl.update(rec(0, 0, ctx=ctx))
    for d, ms, acc in (("lookup", 0.1, 0), ("model", 20.0, 2)):  # the lookup fails at first, the model pays
        for _ in range(3):
            ctrl.update(rec(2, acc, draft_ms=2 * ms, ctx=ctx, drafter=d))
            ctx += 1
    used = []
    for _ in range(120):
        name = ctrl.choose_drafter({"lookup": 6, "model": None})  # the text now repeats: a 6-token match
        k = ctrl.next_k()
        used.append(name if k else None)
        if name == "lookup":
            ctrl.update(rec(k, k, draft_ms=0.1 * k, verify_ms=100.0 + 5 * k, ctx=ctx, drafter="lookup"))
        elif name == "model":
            accepted = next((i for i in range(k) if rng.random() > 0.9), k)
            ctrl.update(rec(k, accepted, draft_ms=20.0 * k, verify_ms=100.0 + 5 * k, ctx=ctx, drafter="model"))
        else:
            ctrl.update(rec(0, 0, ctx=ctx))
        ctx += 1
    first = used.index("lookup")
    assert first <= 4 + 2  # probed once it has sat out its gap
    assert used[60:].count("lookup") >= 55  # and used from then on


class AllOrNothing(Machine):
    """A lookup drafter on repeated text: with probability ``p`` the match is right and every draft is accepted,
    else the first draft is rejected (α[0] = p, α[i > 0] = 1: not i.i.d.)."""

    def step(self, k: int, drafter: str = "d") -> StepRecord:
        accepted = k if k and self.rng.random() < self.alphas[0] else 0
        return rec(k, accepted, draft_ms=0.0, verify_ms=self.verify(k + 1), ctx=self.ctx, drafter=drafter)

    def goodput(self, k: int) -> float:
        return (1 + self.alphas[0] * k) / self.verify(k + 1) if k else 1 / self.verify(1)


# ik_llama.cpp's verification curve on 2 Zen 5 cores (docs/results/ik-native): n = 2 is nearly free, n = 4 is not
ZEN5 = {1: 24.0, 2: 27.0, 4: 45.0, 6: 56.0, 8: 68.0, 9: 75.0}


def sessions(depth_probe: bool, seed: int, machines, steps: int = 24) -> tuple[float, list[list[int]]]:
    """Requests of ``steps`` steps, one per machine in turn, through one seeded controller: (tokens per ms, Ks)."""
    ctrl = GoodputController(depth_probe=depth_probe)
    ctrl.seed_verify_costs(ZEN5, 100)
    ctrl.seed_draft_costs({"d": (0.01, 0.0)})
    tokens = ms = 0.0
    ks = []
    for r, make in enumerate(machines):
        machine = make(seed * 100 + r)
        ctrl.reset()
        ks.append([])
        for _ in range(steps):
            k = ctrl.next_k()
            step = machine.step(k)
            ctrl.update(step)
            tokens, ms = tokens + step.emitted, ms + step.verify_ms
            ks[-1].append(k)
    return tokens / ms, ks


def test_depth_probes_find_sooner_that_an_all_or_nothing_lookup_pays_deep():
    """Novel requests (a lookup's first draft accepted 30 % of the time) alternate with repeated ones (95 %, then
    the whole match): on the repeated ones the best K is 8, but priced as i.i.d. from a record that the novel ones
    pulled down, K = 1 looks best and deeper positions go unmeasured until a run of luck lifts α[0]."""
    curve = lambda n: interpolate(ZEN5, n)  # noqa: E731
    novel, repeat = (lambda seed: AllOrNothing(0.0, curve, [0.3], seed=seed)), \
        (lambda seed: AllOrNothing(0.0, curve, [0.95], seed=seed))
    assert repeat(0).best_k() == 8 and repeat(0).goodput(8) > 1.4 * repeat(0).goodput(1)

    def first_deep(ks: list[list[int]]) -> float:  # mean index of the first step with K >= 3 in the repeated ones
        firsts = [next((i for i, k in enumerate(r) if k >= 3), len(r)) for r in ks[1::2]]
        return sum(firsts) / len(firsts)

    without = [sessions(False, seed, [novel, repeat] * 6) for seed in range(6)]
    probed = [sessions(True, seed, [novel, repeat] * 6) for seed in range(6)]
    assert sum(first_deep(ks) for _, ks in probed) < 0.75 * sum(first_deep(ks) for _, ks in without)
    assert sum(g for g, _ in probed) > 1.02 * sum(g for g, _ in without)


def test_depth_probes_back_off_and_cost_little_where_deeper_does_not_pay():
    curve = lambda n: interpolate(ZEN5, n)  # noqa: E731
    iid = lambda seed: Machine(0.0, curve, [0.8, 0.3], seed=seed)  # noqa: E731  (deeper positions do worse)
    assert iid(0).best_k() <= 2
    g_off, _ = sessions(False, 7, [iid] * 10, steps=40)
    g_on, ks = sessions(True, 7, [iid] * 10, steps=40)
    flat = [k for r in ks for k in r]
    deep = [i for i, k in enumerate(flat) if k > 2]
    gaps = [b - a for a, b in zip(deep, deep[1:])]
    assert gaps and max(gaps) >= GoodputConfig.probe_max  # the depth gap doubles while the probes lose
    assert len(deep) <= 20
    assert g_on >= 0.97 * g_off


# A draft model probed at once, priced per step and per token ----------------------------------------------------------
def model_ctrl(**overrides) -> GoodputController:
    """Plain step 100 ms; the draft model 10 ms per drafted token, 2 ms per token fed; never observed."""
    ctrl = GoodputController(**overrides)
    ctrl.seed_verify_costs({1: 100.0, 2: 104.0, 3: 108.0, 5: 116.0, 9: 132.0}, 200)
    ctrl.seed_draft_costs({"model": (10.0, 2.0)})
    return ctrl


def test_a_drafter_never_observed_is_probed_at_once_and_later_ones_wait_their_gap():
    """The draft model does not pay under the prior α (0.5) and the request's first probe comes at its second
    step, not after probe_init plain steps; a probe it loses sends it back to waiting probe_init steps, and in the
    next request, whose acceptance is carried, it waits its gap too."""
    ctrl = model_ctrl(probe_init=6)
    ctrl.seed_draft_costs({"model": (40.0, 2.0)})  # 40 % of a plain step per drafted token: pays only if α is high
    ctrl.set_synced({"model": 200})
    ctrl.update(rec(0, 0, ctx=200))
    ks = []
    for step in range(1, 12):
        name = ctrl.choose_drafter({"model": None})
        k = ctrl.next_k()
        ks.append(k if name else 0)
        ctrl.update(rec(k, 0, draft_ms=40.0 * k, verify_ms=100.0 + 4 * k, ctx=200 + step, drafter="model") if k
                    else rec(0, 0, ctx=200 + step))
    assert ks[0] > 0  # probed at once
    assert ks[1:7] == [0] * 6 and ks[7] > 0  # the probe lost (nothing accepted): its gap, then the next probe
    ctrl.reset()
    ctrl.set_synced({"model": 300})
    ctrl.update(rec(0, 0, ctx=300))
    assert [ctrl.choose_drafter({"model": None}) for _ in range(3)] == [None] * 3  # carried evidence: no rush


def test_the_stop_rule_looks_past_a_next_token_that_costs_a_step():
    """A verification curve that is flat, then one step dearer at the third token, then nearly flat again (as on a
    CPU, where n = 2 costs a plain step but n = 3 costs 1.5). After one sure token the next alone does not pay,
    while drafting on to the sixth does: the threshold is the best over every later stopping point, not the next
    token's alone."""
    ctrl = GoodputController()
    curve = {1: 100.0, 2: 100.0, 3: 150.0, 4: 152.0, 5: 154.0, 6: 156.0, 7: 158.0, 8: 160.0, 9: 162.0}
    ctrl.seed_verify_costs(curve, 100)
    ctrl.seed_draft_costs({"d": (5.0, 1.0)})
    alphas = [0.95] * 8
    gain = expected_tokens(alphas, 1) / (5.0 + 100.0)  # the plan: one drafted token per step
    thresholds = ctrl._stop_thresholds("d", gain, 0, 8, alphas)
    for j, t in enumerate(thresholds):  # brute force: the best later stopping point m
        reach, tokens, best = 1.0, 0.0, float("inf")
        for m in range(j + 1, 8):
            reach *= alphas[m]
            tokens += reach
            best = min(best, gain * ((m - j) * 5.0 + curve[m + 2] - curve[j + 2]) / tokens)
        assert t == pytest.approx(best)
    next_only = gain * (5.0 + curve[3] - curve[2]) / alphas[1]
    assert thresholds[0] < 0.95 < next_only  # a sure first token (0.95): draft on; the next-token rule stopped


def test_draft_time_is_fitted_per_step_and_per_token_once_two_lengths_are_seen():
    costs = MeasuredCosts()
    for _ in range(3):  # K = 1 only: 8 ms per step, all of it billed per token
        costs.observe(rec(1, 1, draft_ms=8.0), behind=2)
    assert costs.draft_step_ms(4, 0, "d") == pytest.approx(32.0) and costs.marginal_draft_ms("d", 0) == 8.0
    for _ in range(2):  # K = 4 at 23 ms: 3 ms per step (feeding the last draft and correction) + 5 ms per token
        costs.observe(rec(4, 4, draft_ms=23.0), behind=2)
    assert costs.draft_fit["d", 0] == (pytest.approx(3.0), pytest.approx(5.0))
    assert costs.draft_step_ms(6, 0, "d") == pytest.approx(33.0) and costs.marginal_draft_ms("d", 0) == 5.0
    assert costs.spec_step_ms(6, 0, "d") == pytest.approx(33.0 + costs.verify_ms(7, 0))
    for _ in range(3):  # tree steps: drafted counts nodes, not forwards; they are left out of the fit
        step = rec(16, 3, draft_ms=24.0)
        costs.observe(StepRecord(**{**step.__dict__, "tree": True}), behind=2)
    assert costs.draft_fit["d", 0] == (pytest.approx(3.0), pytest.approx(5.0))
    far = bucket_of(4000)  # a fit belongs to its context bucket: another bucket uses its own per-token median
    for _ in range(3):
        costs.observe(rec(1, 1, draft_ms=15.0, ctx=4000), behind=2)
    assert ("d", far) not in costs.draft_fit and costs.draft_step_ms(4, far, "d") == pytest.approx(60.0)
    odd = MeasuredCosts()  # a line that would need a negative per-step time is not kept
    for n, ms in ((1, 2.0), (1, 2.0), (4, 23.0), (4, 23.0)):
        odd.observe(rec(n, n, draft_ms=ms), behind=0)
    assert "d" not in odd.draft_fit and odd.draft_step_ms(2, 0, "d") == 2 * odd.draft_ms("d", 0)


# A bounded catch-up ------------------------------------------------------------------------------------------------
def test_a_bounded_catch_up_is_priced_at_its_bound_and_lets_a_long_prompt_be_probed():
    """A 2000-token prompt costs the draft model 4 s to feed at 2 ms a token: spread over the horizon that is more
    than the draft could save, and more than any probe may spend (8 plain steps at most), so it is never drafted.
    Told that the drafter feeds at most 64 tokens at once (it restarts from the sequence's last 64 beyond that), the
    controller prices its catch-up at the 62 tokens past the steady two: a cheap draft (10 ms a token) pays at once
    under the prior; a dear one (40 ms, no gain under the prior) is probed as soon as a quarter of the request's time
    covers the 124 ms."""
    def session(draft_ms, catch_up):
        ctrl = model_ctrl()
        ctrl.seed_draft_costs({"model": (draft_ms, 2.0)})
        ctrl.set_synced({"model": 0}, catch_up)
        ctrl.update(rec(0, 0, ctx=2000))
        for step in range(1, 41):
            name = ctrl.choose_drafter({"model": None})
            k = ctrl.next_k()
            if name and k:
                return step, ctrl.planned[1], ctrl._lag("model", ctrl.context_len), ctrl.probing is not None
            ctrl.update(rec(0, 0, ctx=2000 + step))
        return None, None, ctrl._lag("model", ctrl.context_len), False

    for draft_ms in (10.0, 40.0):
        assert session(draft_ms, None) == (None, None, 2041, False)
    assert session(10.0, {"model": 64}) == (1, pytest.approx(2.0 * (64 - 2)), 64, False)
    assert session(40.0, {"model": 64}) == (5, pytest.approx(2.0 * (64 - 2)), 64, True)  # 4 plain steps + the first
