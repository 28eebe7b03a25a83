"""The calibrated drafter: its measured acceptance matches the dial, output stays lossless, cost is charged."""

from __future__ import annotations

import math
import time

import pytest
import torch
from bench_tiny import tiny_model

from adaspec.backends import TorchBackend
from adaspec.backends.prefix_cache import PrefixCacheBackend
from adaspec.bench.costmodel import leviathan_alpha
from adaspec.controllers.costmodel import expected_tokens
from adaspec.controllers import FixedController
from adaspec.drafters.calibrated import CalibratedDrafter
from adaspec.engine import GenerationConfig, SpeculativeEngine
from adaspec.errors import ConfigError
from adaspec.sampling import SamplingParams

N = 160


@pytest.fixture(scope="module")
def setup():
    backend = PrefixCacheBackend(TorchBackend(tiny_model(3), "tiny"))
    prompt = list(range(10, 40))
    cfg = GenerationConfig(max_new_tokens=N, ignore_eos=True, seed=0)
    backend.record_top2 = []
    ref = SpeculativeEngine(backend, None, None).generate(prompt, cfg)
    alternatives = [b for _, b in backend.record_top2]
    backend.record_top2 = None
    return backend, prompt, cfg, ref.token_ids, alternatives


def run(setup, alpha: float, k: int, seed: int = 0, cost_ms: float = 0.0):
    backend, prompt, cfg, ref, alternatives = setup
    drafter = CalibratedDrafter(ref, alpha, alternatives=alternatives, seed=seed, cost_ms=cost_ms, vocab_size=256)
    result = SpeculativeEngine(backend, drafter, FixedController(k)).generate(prompt, cfg)
    return drafter, result


@pytest.mark.parametrize("alpha", [0.0, 0.5, 0.9, 1.0])
def test_measured_alpha_matches_the_dial(setup, alpha):
    k = 4
    trials = accepted = 0
    for seed in range(2):
        drafter, result = run(setup, alpha, k, seed)
        assert result.token_ids == setup[3]  # lossless: the target's greedy output, whatever was drafted
        assert drafter.offpath == 0
        steps = [s for s in result.stats.steps if s.drafted > 0]
        rejections = sum(1 for s in steps if s.accepted < s.drafted)
        accepted += result.stats.accepted_tokens
        trials += result.stats.accepted_tokens + rejections
    measured = leviathan_alpha(accepted, trials - accepted)
    sigma = math.sqrt(max(alpha * (1 - alpha), 1e-9) / trials)
    assert abs(measured - alpha) <= 3 * sigma + 1e-9, (measured, alpha, trials)


def test_tokens_per_step_follow_the_iid_model(setup):
    alpha, k = 0.7, 3
    emitted = steps = 0
    for seed in range(3):
        _, result = run(setup, alpha, k, seed)
        spec = [s for s in result.stats.steps if s.drafted == k]
        emitted += sum(s.accepted + 1 for s in spec)
        steps += len(spec)
    assert emitted / steps == pytest.approx(expected_tokens(alpha, k), rel=0.08)


def test_other_tokens_are_plausible_and_always_rejected(setup):
    backend, prompt, cfg, ref, alternatives = setup
    drafter = CalibratedDrafter(ref, 0.0, alternatives=alternatives, vocab_size=256)
    drafter.prefill(prompt)
    draft = drafter.propose(prompt + ref[:5], 3, SamplingParams())
    assert draft.tokens.tolist() == [alternatives[5], alternatives[6], alternatives[7]]
    assert all(t != r for t, r in zip(draft.tokens.tolist(), ref[5:8]))
    # Without alternatives the "other" token is a nearby reference token that differs.
    bare = CalibratedDrafter([1, 2, 2, 3], 0.0)
    bare.prefill([9])
    assert bare.propose([9, 1], 2, SamplingParams()).tokens.tolist() == [1, 3]


def test_off_path_is_detected_and_counted(setup):
    backend, prompt, cfg, ref, alternatives = setup
    drafter = CalibratedDrafter(ref, 1.0, alternatives=alternatives, vocab_size=256)
    drafter.prefill(prompt)
    assert drafter.propose(prompt + ref[:3], 2, SamplingParams()).tokens.tolist() == ref[3:5]
    wrong = (ref[3] + 1) % 256
    draft = drafter.propose(prompt + ref[:3] + [wrong], 2, SamplingParams())
    assert drafter.offpath == 2 and draft.tokens.tolist() != ref[4:6]


def test_cost_is_charged_per_drafted_token(setup):
    backend, prompt, cfg, ref, alternatives = setup
    drafter = CalibratedDrafter(ref, 0.5, cost_ms=5.0)
    drafter.prefill(prompt)
    start = time.perf_counter()
    drafter.propose(prompt + ref[:2], 4, SamplingParams())
    assert time.perf_counter() - start >= 0.020


def test_bad_settings():
    with pytest.raises(ConfigError):
        CalibratedDrafter([1, 2], 1.5)
    with pytest.raises(ConfigError):
        CalibratedDrafter([1, 2], 0.5, cost_ms=-1)
    with pytest.raises(ConfigError):
        CalibratedDrafter([], 0.5)
    d = CalibratedDrafter([1, 2, 3], 0.5)
    with pytest.raises(ConfigError):
        d.propose([0, 1], 2, SamplingParams(temperature=0.7), torch.Generator())
