"""The cost model: fitting synthetic timings with known coefficients, and the closed-form predictions."""

from __future__ import annotations

import math
import random

import pytest

from adaspec.bench.costmodel import FittedCostModel, fit_line, leviathan_alpha, relative_errors
from adaspec.controllers.costmodel import expected_tokens
from adaspec.errors import ConfigError

# A known cost law (ms): T_v(n, L) = 200 + 6 (n - 1) + 0.02 L + 0.004 (n - 1) L; T_d(L) = 90 + 0.01 L; o = 3.
A, B, C, D = 200.0, 6.0, 0.02, 0.004


def t_verify(n: int, ctx: int) -> float:
    return A + B * (n - 1) + C * ctx + D * (n - 1) * ctx


def t_draft(ctx: int) -> float:
    return 90.0 + 0.01 * ctx


def synthetic_model(noise: float = 0.0, seed: int = 0) -> FittedCostModel:
    rng = random.Random(seed)
    jitter = (lambda: 1 + rng.uniform(-noise, noise)) if noise else (lambda: 1.0)
    contexts = [256, 1024, 2048, 4096]
    verify = [(n, ctx, t_verify(n, ctx) * jitter()) for n in (1, 2, 3, 5, 9) for ctx in contexts for _ in range(3)]
    draft = [("draft", ctx, t_draft(ctx) * jitter()) for ctx in contexts for _ in range(3)]
    return FittedCostModel.fit(verify, draft, overhead_ms=3.0)


def test_fit_line_recovers_exact_coefficients():
    xs = [0, 1, 2, 3, 10]
    a, b = fit_line(xs, [5 + 2 * x for x in xs])
    assert a == pytest.approx(5) and b == pytest.approx(2)
    assert fit_line([7, 7, 7], [1.0, 2.0, 3.0], relative=False) == pytest.approx((2.0, 0.0))
    with pytest.raises(ConfigError):
        fit_line([], [])


def test_fit_recovers_the_known_cost_law():
    m = synthetic_model()
    for n in (1, 2, 3, 5, 9):
        a_n, c_n = m.verify[n]
        assert a_n == pytest.approx(A + B * (n - 1))
        assert c_n == pytest.approx(C + D * (n - 1))
    e, f = m.draft["draft"]
    assert e == pytest.approx(90.0) and f == pytest.approx(0.01)
    # Interpolation between measured widths is exact for a law linear in n; so is extrapolation in L.
    for n in (4, 7):
        for ctx in (512, 8192, 16384):
            assert m.verify_ms(n, ctx) == pytest.approx(t_verify(n, ctx))
    assert m.draft_ms("draft", 8192) == pytest.approx(t_draft(8192))


def test_fit_with_noise_stays_close():
    m = synthetic_model(noise=0.03, seed=1)
    for n in (1, 5, 9):
        for ctx in (256, 4096):
            assert m.verify_ms(n, ctx) == pytest.approx(t_verify(n, ctx), rel=0.03)


def test_speedup_closed_form_matches_hand_computation():
    m = synthetic_model()
    alpha, k, ctx = 0.8, 4, 1000
    tokens = (1 - alpha ** (k + 1)) / (1 - alpha)
    spec = k * t_draft(ctx) + t_verify(k + 1, ctx) + 3.0
    plain = t_verify(1, ctx) + 3.0
    assert m.speedup(alpha, k, ctx, "draft") == pytest.approx(tokens / spec * plain)
    # A fixed per-token cost (the calibrated drafter) and free drafting (n-gram).
    assert m.speedup(alpha, k, ctx, 10.0) == pytest.approx(tokens / (40 + t_verify(5, ctx) + 3) * plain)
    assert m.speedup(alpha, k, ctx, "ngram") == pytest.approx(tokens / (t_verify(5, ctx) + 3) * plain)
    assert m.speedup(alpha, 0, ctx, "draft") == 1.0
    # Steps that draft nothing run at plain speed.
    assert m.speedup(alpha, k, ctx, "draft", plain_fraction=1.0) == pytest.approx(1.0)


def test_reduces_to_leviathan_when_verification_is_free():
    c = 0.05
    m = FittedCostModel({1: (100.0, 0.0), 9: (100.0, 0.0)}, {"d": (100.0 * c, 0.0)})
    for alpha in (0.5, 0.8, 0.95):
        for k in (1, 3, 7):
            expected = (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1))
            assert m.speedup(alpha, k, 500, "d") == pytest.approx(expected)


def test_boundaries():
    m = synthetic_model()
    for k in (1, 2, 4, 8):
        a = m.min_alpha(k, 256, "draft")
        assert 0 < a < 1
        assert m.speedup(a, k, 256, "draft") == pytest.approx(1.0, abs=1e-6)
    # Longer drafts need higher acceptance when a draft token costs ~0.45 steps.
    assert m.min_alpha(1, 256, "draft") < m.min_alpha(4, 256, "draft") < m.min_alpha(8, 256, "draft")
    # A free drafter with free verification always pays; an absurdly costly one never does.
    assert FittedCostModel({1: (100.0, 0.0)}).min_alpha(4, 256, None) == 0.0
    assert math.isnan(m.min_alpha(4, 256, 10_000.0))
    k, s = m.best_k(0.9, 256, "draft")
    assert k >= 1 and s == max(m.speedup(0.9, kk, 256, "draft") for kk in range(1, 17))
    assert m.best_k(0.1, 256, "draft") == (0, 1.0)
    # Verification cost grows with context faster for wide verifies, so there is a break-even context.
    x = m.break_even_context(0.8, 4, "draft")
    assert 0 < x < math.inf
    assert m.speedup(0.8, 4, x * 0.99, "draft") >= 1 > m.speedup(0.8, 4, x * 1.01, "draft")


def test_expected_tokens_and_alpha_estimators():
    assert expected_tokens(1.0, 4) == 5
    assert expected_tokens(0.0, 4) == 1
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert leviathan_alpha(8, 2) == pytest.approx(0.8)
    assert leviathan_alpha(0, 0) == 0.0
    assert relative_errors([(1.1, 1.0), (0.9, 1.0), (1.0, 0.0)]) == pytest.approx([0.1, 0.1])


def test_serialisation_round_trip():
    m = synthetic_model()
    again = FittedCostModel.from_dict(m.to_dict())
    assert again.speedup(0.7, 3, 3000, "draft") == pytest.approx(m.speedup(0.7, 3, 3000, "draft"))


def test_fit_needs_plain_steps():
    with pytest.raises(ConfigError):
        FittedCostModel.fit([(2, 256, 10.0)])


def test_context_slopes_do_not_cross():
    # Two contexts, noisy per-width slopes: n = 2 grows slower with context than n = 1 in the raw data. Fitted
    # separately, T_v(2, L) would fall below T_v(1, L) at long contexts; the shared slope keeps widths ordered.
    samples = [(1, 256, 334.0), (1, 1024, 447.0), (2, 256, 510.0), (2, 1024, 591.0), (5, 256, 1045.0),
               (5, 1024, 1167.0), (9, 256, 1733.0), (9, 1024, 1892.0)]
    m = FittedCostModel.fit(samples)
    for ctx in (256, 4096, 16384, 65536):
        widths = [m.verify_ms(n, ctx) for n in (1, 2, 5, 9)]
        assert widths == sorted(widths)
    slopes = [m.verify[n][1] for n in (1, 2, 5, 9)]
    assert slopes == sorted(slopes) and slopes[0] >= 0
    for n, ctx, ms in samples:  # still close to the measurements
        assert m.verify_ms(n, ctx) == pytest.approx(ms, rel=0.06)


def test_a_cost_that_is_not_a_line_in_context_follows_its_measured_curve():
    """llama.cpp's measured verify(5) at 256 … 16K (docs/results/boundary/epyc-avx2-2c/
    2026-11-30-bench/boundary-cpu.jsonl): not a line in L. Within the
    measured contexts the model returns the measured medians (and interpolates between them); beyond, the last one
    plus the fitted slope; a width measured at one context keeps its line."""
    measured = {256: 285.0, 1024: 236.0, 2048: 227.0, 4096: 318.0, 8192: 296.0, 16384: 451.0}
    verify = [(1, ctx, 80.0 + 0.005 * ctx) for ctx in measured for _ in range(3)]
    verify += [(5, ctx, ms * f) for ctx, ms in measured.items() for f in (0.9, 1.0, 1.3)]  # median = ms
    verify += [(9, 1024, 500.0)]
    draft = [("d", 256, 37.0), ("d", 4096, 51.0), ("d", 16384, 136.0)]
    model = FittedCostModel.fit(verify, draft)
    for ctx, ms in measured.items():
        assert model.verify_ms(5, ctx) == pytest.approx(ms)
    assert model.verify_ms(5, 1536) == pytest.approx((236.0 + 227.0) / 2)
    slope = model.verify[5][1]
    assert slope > 0
    assert model.verify_ms(5, 32768) == pytest.approx(451.0 + slope * (32768 - 16384))
    assert model.verify_ms(9, 4096) == pytest.approx(model.verify[9][0] + model.verify[9][1] * 4096)
    assert model.draft_ms("d", 16384) == pytest.approx(136.0)  # the line through the three says 126.5
    assert model.draft_ms("d", 10240) == pytest.approx(51.0 + (136.0 - 51.0) * (10240 - 4096) / (16384 - 4096))
    # the curves survive serialisation
    again = FittedCostModel.from_dict(model.to_dict())
    assert again.verify_ms(5, 3000) == pytest.approx(model.verify_ms(5, 3000))
    assert again.draft_ms("d", 9000) == pytest.approx(model.draft_ms("d", 9000))


def test_study_and_controller_share_one_cost_model():
    from adaspec.controllers.costmodel import CostModel, MeasuredCosts
    from adaspec.stats import StepRecord

    live = MeasuredCosts()
    for k, verify_ms in ((0, 100.0), (2, 120.0)):
        live.observe(StepRecord(k=k, drafted=k, accepted=k, emitted=k + 1, context_len=10, draft_ms=10.0 * k,
                                verify_ms=verify_ms, total_ms=10.0 * k + verify_ms + 3.0, drafter="d"), behind=2)
    fitted = FittedCostModel({1: (100.0, 0.0), 3: (120.0, 0.0)}, {"d": (10.0, 0.0)}, overhead_ms=3.0)
    assert isinstance(live, CostModel) and isinstance(fitted, CostModel)
    assert live.spec_step_ms(2, 0, "d") == fitted.spec_step_ms(2, 10, "d") == 2 * 10.0 + 120.0 + 3.0
    assert live.plain_step_ms(0) == fitted.plain_step_ms(10) == 103.0
    assert live.speedup(0.8, 2, 0, "d") == pytest.approx(fitted.speedup(0.8, 2, 10, "d"))
