"""Bad requests and settings through the engine: each is a clear AdaspecError subclass, raised before any work."""

from __future__ import annotations

import pytest

from adaspec.controllers import FixedController, make_controller
from adaspec.engine import GenerationConfig, SpeculativeEngine
from adaspec.errors import AdaspecError, ConfigError, ContextLengthError


@pytest.mark.parametrize("drafter,k", [(None, 0), ("trunc", 3), ("ngram", 2)])
@pytest.mark.parametrize("extra", [0, 1, 15])
def test_prompt_longer_than_the_context_window(make_engine, drafter, k, extra):
    engine = make_engine("qwen", drafter, k, max_context=32)
    prompt = [1] * (32 + extra)
    with pytest.raises(ContextLengthError, match="32") as info:
        engine.generate(prompt, GenerationConfig(max_new_tokens=4))
    assert isinstance(info.value, AdaspecError)
    msg = str(info.value)
    assert "context window" in msg and "qwen" in msg and str(len(prompt)) in msg
    # The engine is still usable afterwards.
    assert len(engine.generate([1, 2, 3], GenerationConfig(max_new_tokens=3, ignore_eos=True)).token_ids) == 3


def test_prompt_exactly_the_window_is_refused_but_window_minus_one_gives_one_token(make_engine):
    engine = make_engine("qwen", "trunc", 3, max_context=16)
    with pytest.raises(ContextLengthError):
        engine.generate([2] * 16, GenerationConfig(max_new_tokens=5))
    r = engine.generate([2] * 15, GenerationConfig(max_new_tokens=5, ignore_eos=True))
    assert len(r.token_ids) == 1 and r.finish_reason == "length"


def test_default_context_window_comes_from_the_model_config(make_engine):
    engine = make_engine("qwen")
    assert engine.target.max_context == 256
    with pytest.raises(ContextLengthError, match="256"):
        engine.generate([1] * 300)


@pytest.mark.parametrize("drafter,k", [(None, 0), ("trunc", 3)])
def test_empty_prompt(make_engine, drafter, k):
    engine = make_engine("qwen", drafter, k)
    with pytest.raises(ConfigError, match="empty"):
        engine.generate([], GenerationConfig(max_new_tokens=4))
    with pytest.raises(ConfigError):
        next(iter(engine.stream((), None)))


@pytest.mark.parametrize("n", [0, -1, -100])
def test_max_new_tokens_below_one(n):
    with pytest.raises(ConfigError, match="max_new_tokens"):
        GenerationConfig(max_new_tokens=n)


@pytest.mark.parametrize("kw", [dict(temperature=-0.5), dict(top_k=-3), dict(top_p=0.0), dict(top_p=1.01)])
def test_invalid_sampling_settings(kw):
    with pytest.raises(ConfigError):
        GenerationConfig(**kw)


def test_negative_k(make_engine):
    with pytest.raises(ConfigError, match="-1"):
        make_engine("qwen", "trunc", -1)
    with pytest.raises(ConfigError):
        FixedController(-3)
    for name in ("fixed", "adaptive", "heuristic"):
        with pytest.raises(ConfigError):
            make_controller(name, -1)


def test_positive_k_without_a_drafter(make_engine):
    with pytest.raises(ConfigError, match="drafter"):
        make_engine("qwen", None, 3)


def test_adaptive_without_a_drafter_is_plain(make_engine):
    engine = make_engine("qwen", None, "adaptive")
    assert isinstance(engine.controller, FixedController) and engine.controller.next_k() == 0
    r = engine.generate([1, 2, 3], GenerationConfig(max_new_tokens=5, ignore_eos=True))
    assert r.stats.k_trace == [0, 0, 0, 0]


def test_config_errors_are_value_errors_and_adaspec_errors():
    with pytest.raises(ValueError):
        GenerationConfig(max_new_tokens=0)
    with pytest.raises(AdaspecError):
        GenerationConfig(max_new_tokens=0)


def test_non_int_prompt_ids_are_coerced(make_engine):
    import torch

    engine: SpeculativeEngine = make_engine("qwen", "trunc", 2)
    a = engine.generate(torch.tensor([3, 17, 42]), GenerationConfig(max_new_tokens=6, ignore_eos=True))
    b = engine.generate([3, 17, 42], GenerationConfig(max_new_tokens=6, ignore_eos=True))
    assert a.token_ids == b.token_ids
    assert all(type(t) is int for t in a.token_ids)
