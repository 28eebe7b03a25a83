"""logits_to_probs (temperature, top-k, top-p), sample, and SamplingParams validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from adaspec.errors import ConfigError
from adaspec.sampling import SamplingParams, logits_to_probs, sample

LOGITS = torch.log(torch.tensor([0.05, 0.4, 0.1, 0.25, 0.2]))  # softmax = these probabilities


def close(a: torch.Tensor, b) -> None:
    torch.testing.assert_close(a, torch.as_tensor(b, dtype=torch.float32), atol=1e-6, rtol=1e-5)


def test_temperature_one_is_softmax():
    close(logits_to_probs(LOGITS, SamplingParams(temperature=1.0)), [0.05, 0.4, 0.1, 0.25, 0.2])


def test_temperature_scales_logits():
    logits = torch.tensor([0.0, 1.0, 3.0])
    for t in (0.5, 2.0):
        e = [math.exp(x / t) for x in (0.0, 1.0, 3.0)]
        close(logits_to_probs(logits, SamplingParams(temperature=t)), [x / sum(e) for x in e])


def test_greedy_is_one_hot_on_argmax_and_float32():
    probs = logits_to_probs(torch.tensor([[0.1, 2.0, -1.0], [5.0, 4.0, 4.5]], dtype=torch.bfloat16),
                            SamplingParams())
    assert probs.dtype == torch.float32
    close(probs, [[0, 1, 0], [1, 0, 0]])


def test_top_k():
    probs = logits_to_probs(LOGITS, SamplingParams(temperature=1.0, top_k=2))
    close(probs, [0, 0.4 / 0.65, 0, 0.25 / 0.65, 0])
    probs = logits_to_probs(LOGITS, SamplingParams(temperature=1.0, top_k=1))
    close(probs, [0, 1, 0, 0, 0])
    # top_k >= V is a no-op
    close(logits_to_probs(LOGITS, SamplingParams(temperature=1.0, top_k=5)), [0.05, 0.4, 0.1, 0.25, 0.2])
    close(logits_to_probs(LOGITS, SamplingParams(temperature=1.0, top_k=50)), [0.05, 0.4, 0.1, 0.25, 0.2])


@pytest.mark.parametrize("top_p,kept", [
    (0.3, [1]),             # 0.4 alone already reaches 0.3
    (0.5, [1, 3]),          # 0.4 < 0.5: the token that crosses the mass (0.25) is kept
    (0.7, [1, 3, 4]),       # 0.4+0.25 = 0.65 < 0.7 → 0.2 kept too
    (0.88, [1, 3, 4, 2]),   # 0.85 < 0.88 → 0.1 kept
    (0.97, [1, 3, 4, 2, 0]),
    (0.01, [1]),            # at least one token always survives
])
def test_top_p_keeps_the_token_that_crosses_the_mass(top_p, kept):
    base = np.array([0.05, 0.4, 0.1, 0.25, 0.2])
    want = np.zeros(5)
    want[kept] = base[kept] / base[kept].sum()
    close(logits_to_probs(LOGITS, SamplingParams(temperature=1.0, top_p=top_p)), want)


def test_top_p_is_applied_after_temperature():
    # At T=0.5 the probabilities become ∝ p^2: [.0025,.16,.01,.0625,.04] / .275 → .582, .227, .145, ...
    p2 = np.array([0.05, 0.4, 0.1, 0.25, 0.2]) ** 2
    p2 /= p2.sum()
    probs = logits_to_probs(LOGITS, SamplingParams(temperature=0.5, top_p=0.7))
    want = np.zeros(5)
    want[[1, 3]] = p2[[1, 3]] / p2[[1, 3]].sum()  # .582 < .7 ≤ .582 + .227
    close(probs, want)


def test_top_k_then_top_p_and_batched_rows():
    logits = torch.stack([LOGITS, LOGITS.flip(0)])
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=3, top_p=0.6))
    # top-3 = {.4, .25, .2} renormalised to {.47, .29, .24}; top_p .6 keeps .47 and .29.
    w = np.array([0.4, 0.25]) / 0.65
    close(probs[0], [0, w[0], 0, w[1], 0])
    close(probs[1], [0, w[1], 0, w[0], 0])
    close(probs.sum(-1), [1.0, 1.0])


def test_filters_with_minus_inf_logits_and_rows_sum_to_one():
    logits = torch.tensor([[float("-inf"), 1.0, 2.0, float("-inf")]])
    probs = logits_to_probs(logits, SamplingParams(temperature=0.7, top_p=0.9, top_k=3))
    assert probs[0, 0] == 0 and probs[0, 3] == 0
    close(probs.sum(-1), [1.0])


def test_sample_one_hot_returns_its_id():
    g = torch.Generator().manual_seed(0)
    for i in range(7):
        probs = torch.zeros(7)
        probs[i] = 1.0
        for _ in range(5):
            assert int(sample(probs, g)) == i
    batch = torch.nn.functional.one_hot(torch.tensor([3, 0, 6]), 7).float()
    assert sample(batch, g).tolist() == [3, 0, 6]
    assert sample(batch, g).dtype == torch.int64


def test_sample_frequencies_match_probs():
    probs = torch.tensor([0.05, 0.4, 0.0, 0.1, 0.25, 0.2])
    g = torch.Generator().manual_seed(1)
    n = 40_000
    draws = sample(probs.expand(n, -1).contiguous(), g)  # one row per draw: vectorised
    counts = np.bincount(draws.numpy(), minlength=6)
    assert counts[2] == 0
    keep = probs.numpy() > 0
    assert chisquare(counts[keep], probs.numpy()[keep] * n).pvalue > 1e-3


def test_sample_is_reproducible_with_a_seeded_generator():
    probs = torch.softmax(torch.randn(20, generator=torch.Generator().manual_seed(2)), -1).expand(50, -1)
    a = sample(probs, torch.Generator().manual_seed(3))
    b = sample(probs, torch.Generator().manual_seed(3))
    c = sample(probs, torch.Generator().manual_seed(4))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("kwargs", [dict(temperature=-0.1), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5),
                                    dict(top_p=-0.2)])
def test_sampling_params_validation(kwargs):
    with pytest.raises(ConfigError):
        SamplingParams(**kwargs)


def test_sampling_params_valid_and_greedy_flag():
    assert SamplingParams().greedy
    assert SamplingParams(temperature=0.0, top_k=5, top_p=1.0).greedy
    assert not SamplingParams(temperature=0.3, top_p=0.5).greedy
    # ConfigError is also a ValueError
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1)


def test_tiny_temperature_is_greedy_not_nan():
    from adaspec.sampling import SamplingParams, logits_to_probs

    logits = torch.tensor([[0.0, 3.0, 1.0]])
    probs = logits_to_probs(logits, SamplingParams(temperature=1e-300))
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0]]))
