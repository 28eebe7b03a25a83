"""The engine end to end: greedy losslessness, sampling reproducibility and exactness, stats, streaming, and the
context window."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from adaspec.backends import TorchBackend
from adaspec.controllers import AdaptiveController, FixedController
from adaspec.drafters import ModelDrafter, NgramDrafter
from adaspec.engine import GenerationConfig, SpeculativeEngine
from adaspec.sampling import SamplingParams, logits_to_probs

from conftest import VOCAB, MarkovBackend, markov_table, tiny_model

CONTROLLERS = [1, 2, 5, "heuristic", "adaptive"]
DRAFTERS = ["trunc", "indep", "ngram"]
COMBOS = list(itertools.product(CONTROLLERS, DRAFTERS))


def greedy(max_new: int, **kw) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=max_new, **{"ignore_eos": True, **kw})


def cut_at_eos(tokens: list[int], eos: int) -> list[int]:
    return tokens[:tokens.index(eos) + 1] if eos in tokens else tokens


# Greedy losslessness -----------------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=30),
       max_new=st.integers(1, 40),
       combo=st.sampled_from(COMBOS),
       arch=st.sampled_from(["qwen", "llama"]),
       eos_at=st.one_of(st.none(), st.floats(0.0, 1.0)))
def test_greedy_speculative_equals_plain(make_engine, prompt, max_new, combo, arch, eos_at):
    controller, drafter = combo
    plain = make_engine(arch).generate(prompt, greedy(max_new)).token_ids
    assert len(plain) == max_new
    spec_engine = make_engine(arch, drafter, controller)
    spec = spec_engine.generate(prompt, greedy(max_new))
    assert spec.token_ids == plain
    assert spec.finish_reason == "length"
    if eos_at is not None:
        # EOS = a token that the target really emits; both stop right after its first occurrence.
        eos = plain[min(int(eos_at * len(plain)), len(plain) - 1)]
        cfg = GenerationConfig(max_new_tokens=max_new, eos_token_ids=[eos])
        want = cut_at_eos(plain, eos)
        got_plain = make_engine(arch).generate(prompt, cfg)
        got_spec = spec_engine.generate(prompt, cfg)  # the same engine again: caches are reset per request
        assert got_plain.token_ids == want
        assert got_spec.token_ids == want
        assert got_spec.finish_reason == ("stop" if want[-1] == eos else "length")


@pytest.fixture(scope="module")
def plain_outputs(make_engine):
    prompts = {"qwen": [3, 17, 42, 5, 9, 9, 12], "llama": [60, 1, 2, 33]}
    return {arch: (p, make_engine(arch).generate(p, greedy(40)).token_ids) for arch, p in prompts.items()}


LLAMA_COMBOS = list(itertools.product([2, "adaptive"], DRAFTERS))


@pytest.mark.parametrize("arch,controller,drafter",
                         [("qwen", *c) for c in COMBOS] + [("llama", *c) for c in LLAMA_COMBOS])
def test_greedy_every_controller_and_drafter(make_engine, plain_outputs, arch, controller, drafter):
    prompt, plain = plain_outputs[arch]
    result = make_engine(arch, drafter, controller).generate(prompt, greedy(40))
    assert result.token_ids == plain
    stats = result.stats
    assert stats.new_tokens == 40
    if isinstance(controller, int):
        assert stats.speculation_steps > 0


def test_greedy_drafters_are_partly_accepted(make_engine, plain_outputs):
    """The fixtures exercise both accept and reject paths (otherwise the losslessness tests prove little)."""
    prompt, plain = plain_outputs["qwen"]
    alphas = {}
    for drafter in ("trunc", "ngram"):
        r = make_engine("qwen", drafter, 3).generate(prompt, greedy(40))
        assert r.token_ids == plain
        alphas[drafter] = r.stats.acceptance_rate
        rejected = sum(1 for s in r.stats.steps if s.accepted < s.drafted)
        assert rejected > 0 or drafter == "ngram"
    assert 0.0 < alphas["trunc"] < 1.0
    assert alphas["ngram"] > 0.0


def test_eos_mid_output_and_from_tokenizer_default(make_engine, plain_outputs):
    prompt, plain = plain_outputs["qwen"]
    j = next(i for i in range(5, 40) if plain[i] not in plain[:i])
    eos = plain[j]
    for drafter, ctrl in (("trunc", 4), ("ngram", 3), (None, 0)):
        # engine-level default EOS ids (no per-request override)
        engine = make_engine("qwen", drafter, ctrl, eos_token_ids=[eos])
        r = engine.generate(prompt, GenerationConfig(max_new_tokens=40))
        assert r.token_ids == plain[:j + 1]
        assert r.finish_reason == "stop"
        assert r.stats.new_tokens == j + 1
        # ignore_eos overrides it
        assert engine.generate(prompt, greedy(40)).token_ids == plain


# Sampling: reproducibility -----------------------------------------------------------------------------------
@pytest.mark.parametrize("drafter", ["trunc", "ngram", None])
def test_sampling_same_seed_same_output_different_seed_differs(make_engine, drafter):
    prompt = [5, 6, 7, 8, 5, 6, 7]
    def cfg(seed):
        return GenerationConfig(max_new_tokens=20, temperature=1.0, top_p=0.95, seed=seed, ignore_eos=True)

    engine = make_engine("qwen", drafter, 3 if drafter else 0)
    a = engine.generate(prompt, cfg(123)).token_ids
    b = engine.generate(prompt, cfg(123)).token_ids
    c = make_engine("qwen", drafter, 3 if drafter else 0).generate(prompt, cfg(123)).token_ids
    d = engine.generate(prompt, cfg(124)).token_ids
    assert len(a) == 20
    assert a == b == c
    assert a != d


# Sampling: exactness end to end ------------------------------------------------------------------------------
def chi2_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    counts = counts.ravel().astype(np.float64)
    probs = probs.ravel().astype(np.float64)
    probs = probs / probs.sum()
    n = counts.sum()
    zero = probs <= 1e-12
    assert counts[zero].sum() == 0, "a token with target probability 0 was emitted"
    exp = probs * n
    small = (exp < 5) & ~zero
    obs_l, exp_l = list(counts[~zero & ~small]), list(exp[~zero & ~small])
    if small.any():
        obs_l.append(counts[small].sum())
        exp_l.append(exp[small].sum())
    return chisquare(obs_l, exp_l).pvalue


def markov_reference(backend: MarkovBackend, prompt: list[int], steps: int, temperature: float,
                     transform=None) -> np.ndarray:
    """Exact joint distribution of the next ``steps`` tokens, ``[V] * steps``."""
    v = backend.vocab_size
    joint = np.zeros([v] * steps)
    for seq in itertools.product(range(v), repeat=steps):
        p, ctx = 1.0, list(prompt)
        for t in seq:
            dist = backend.next_probs(ctx, temperature) if transform is None else transform(ctx)
            p *= float(dist[t])
            ctx.append(t)
        joint[seq] = p
    return joint


MV = 5  # Markov vocabulary


@pytest.mark.parametrize("variant", ["model_drafter_k2", "model_drafter_topk_confidence_stop", "ngram"])
def test_sampling_output_distribution_equals_target(variant):
    """4 sampled tokens, N seeds: the joint law of (t1, t2, t3) and of (t3, t4) equals the target's exactly
    computed law (chi-square). The draft is a different (correlated) Markov model, so drafts are both accepted
    and rejected; t1 comes from the prefill, t2..t4 from speculation steps."""

    table = markov_table(MV, seed=0, scale=1.5)
    draft_table = table + torch.randn(table.shape, generator=torch.Generator().manual_seed(1))
    target = MarkovBackend(table, "target")
    prompt = [1, 2, 1, 2, 1]
    params = dict(temperature=1.0)
    if variant == "model_drafter_k2":
        drafter, controller = ModelDrafter(MarkovBackend(draft_table, "draft")), FixedController(2)
    elif variant == "model_drafter_topk_confidence_stop":
        params = dict(temperature=0.8, top_k=4, top_p=0.9)
        drafter = ModelDrafter(MarkovBackend(draft_table, "draft"))
        controller = AdaptiveController(k_init=3, calibration_steps=0, confidence_threshold=0.5)
    else:
        drafter, controller = NgramDrafter(), FixedController(3)
    engine = SpeculativeEngine(target, drafter, controller)
    n = 2_000 if variant == "model_drafter_topk_confidence_stop" else 3_000
    counts = np.zeros([MV] * 4, dtype=np.int64)
    drafted = accepted = 0
    short_drafts = 0
    for seed in range(n):
        r = engine.generate(prompt, GenerationConfig(max_new_tokens=4, seed=seed, ignore_eos=True, **params))
        counts[tuple(r.token_ids)] += 1
        drafted += r.stats.draft_tokens
        accepted += r.stats.accepted_tokens
        short_drafts += sum(1 for s in r.stats.steps if 0 < s.drafted < s.k)
    assert 0 < accepted < drafted  # both paths exercised
    if variant == "model_drafter_topk_confidence_stop":
        assert short_drafts > 0  # the confidence stop cut some drafts
    sp = SamplingParams(**params)
    ref_backend = MarkovBackend(table)

    def transform(ctx):
        prev2 = ctx[-2] if len(ctx) >= 2 else 0
        return logits_to_probs(ref_backend.table[prev2, ctx[-1]], sp)

    joint = markov_reference(ref_backend, prompt, 4, 1.0, transform)
    assert chi2_pvalue(counts.sum(3), joint.sum(3)) > 1e-3
    assert chi2_pvalue(counts.sum((0, 1)), joint.sum((0, 1))) > 1e-3


@pytest.fixture(scope="module")
def tiny_vocab_models():
    target = tiny_model("qwen", seed=5, layers=2, vocab=8, head_scale=10.0, damp_from=1, damp=0.5)
    draft = tiny_model("qwen", seed=6, layers=1, vocab=8, head_scale=10.0, damp_from=None)
    return target, draft


def test_sampling_exactness_with_real_models(tiny_vocab_models):
    """Real transformers target (vocab 8) + an independent 1-layer draft (α ≈ 0.4, so corrections are frequent):
    3 sampled tokens over many seeds; the joint law of (t1, t2) and of (t2, t3) matches the target's, computed
    exactly by one batched forward. (Sampling corrections from p instead of norm(max(p - q, 0)) fails this.)"""
    m, draft = tiny_vocab_models
    prompt = [1, 5, 2, 7]
    engine = SpeculativeEngine(TorchBackend(m), ModelDrafter(TorchBackend(draft)), FixedController(2))
    n = 500
    counts = np.zeros((8, 8, 8), dtype=np.int64)
    accepted = drafted = 0
    for seed in range(n):
        r = engine.generate(prompt, GenerationConfig(max_new_tokens=3, temperature=1.0, seed=seed,
                                                     ignore_eos=True))
        counts[tuple(r.token_ids)] += 1
        accepted += r.stats.accepted_tokens
        drafted += r.stats.draft_tokens
    assert 0 < accepted < drafted
    with torch.inference_mode():
        pairs = torch.tensor(list(itertools.product(range(8), repeat=2)))
        batch = torch.cat([torch.tensor(prompt).expand(64, -1), pairs], 1)
        logits = m(batch).logits.float()
        p1 = torch.softmax(logits[0, len(prompt) - 1], -1)  # P(t1)
        p2 = torch.softmax(logits[:, len(prompt)], -1).view(8, 8, 8)[:, 0]  # P(t2 | t1): rows indexed by t1
        p3 = torch.softmax(logits[:, len(prompt) + 1], -1).view(8, 8, 8)  # P(t3 | t1, t2)
    joint = (p1[:, None, None] * p2[:, :, None] * p3).numpy()
    assert chi2_pvalue(counts.sum(2), joint.sum(2)) > 1e-3
    assert chi2_pvalue(counts.sum(0), joint.sum(0)) > 1e-3


# Stats -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("drafter,controller", [("trunc", 3), ("indep", 2), ("ngram", 4), ("trunc", "adaptive"),
                                                ("trunc", "heuristic"), (None, 0)])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_stats_invariants(make_engine, drafter, controller, temperature):
    prompt = [3, 17, 42, 5, 9, 9, 12, 3, 17]
    r = make_engine("qwen", drafter, controller).generate(
        prompt, GenerationConfig(max_new_tokens=33, temperature=temperature, seed=7, ignore_eos=True))
    s = r.stats
    assert s.new_tokens == len(r.token_ids) == 33
    assert s.prompt_tokens == len(prompt)
    assert sum(step.emitted for step in s.steps) + 1 == s.new_tokens
    assert len(s.k_trace) == len(s.steps)
    assert s.draft_tokens == sum(step.drafted for step in s.steps)
    assert s.accepted_tokens <= s.draft_tokens
    assert 0.0 <= s.acceptance_rate <= 1.0
    assert sum(s.accepted_per_position) == s.accepted_tokens
    assert all(a >= b for a, b in zip(s.accepted_per_position, s.accepted_per_position[1:]))
    ctx = len(prompt) + 1
    for step in s.steps:
        assert 0 <= step.accepted <= step.drafted <= step.k
        assert step.emitted == step.accepted + 1  # no stop condition cut a step here
        assert step.context_len == ctx
        ctx += step.emitted
        assert step.total_ms >= 0 and step.draft_ms >= 0 and step.verify_ms >= 0
    if drafter is None:
        assert s.draft_tokens == 0 and s.acceptance_rate == 0.0 and s.mean_accepted_tokens == 0.0
        assert len(s.steps) == 32
    elif s.speculation_steps:
        spec = [st_ for st_ in s.steps if st_.drafted]
        assert s.mean_accepted_tokens == pytest.approx(sum(x.accepted + 1 for x in spec) / len(spec))
    summary = s.summary()
    assert summary["new_tokens"] == 33 and summary["steps"] == len(s.steps)
    assert summary["k_trace"] == s.k_trace
    assert len(s.to_dict()["step_records"]) == len(s.steps)


@pytest.mark.parametrize("k", [1, 3, 6])
def test_perfect_drafter_accepts_everything(make_engine, k):
    """Draft = the target itself (separate backend): α = 1, each full step emits K + 1; only the last step may be
    shorter (clamped to the tokens left)."""
    max_new = 1 + 4 * (k + 1) + 2  # first token, four full steps, then a clamped one
    r = make_engine("qwen", "self", k).generate([3, 17, 42, 5], greedy(max_new))
    s = r.stats
    assert s.acceptance_rate == 1.0
    assert s.k_trace[:4] == [k] * 4
    for step in s.steps[:4]:
        assert (step.drafted, step.accepted, step.emitted) == (k, k, k + 1)
    last = s.steps[-1]
    assert last.k == min(k, 1) and last.emitted == 2
    assert len(s.steps) == 5
    assert s.mean_accepted_tokens == pytest.approx((4 * (k + 1) + 2) / 5)
    assert s.accepted_per_position == [5] + [4] * (k - 1)


def test_perfect_drafter_tau_is_k_plus_one_when_steps_divide(make_engine):
    r = make_engine("qwen", "self", 4).generate([3, 17, 42, 5], greedy(1 + 5 * 6))
    assert r.stats.acceptance_rate == 1.0
    assert r.stats.mean_accepted_tokens == 5.0
    assert r.stats.k_trace == [4] * 6


# Streaming ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("drafter,controller", [("trunc", 3), (None, 0)])
def test_stream_chunks_concatenate_to_the_result(make_engine, drafter, controller):
    engine = make_engine("qwen", drafter, controller)
    chunks = list(engine.stream([3, 17, 42], greedy(25)))
    result = chunks[-1].result
    assert result is not None and all(c.result is None for c in chunks[:-1])
    assert [t for c in chunks for t in c.token_ids] == result.token_ids
    assert len(chunks) == 1 + len(result.stats.steps)
    assert chunks[0].token_ids == result.token_ids[:1]
    for chunk, step in zip(chunks[1:], result.stats.steps):
        assert len(chunk.token_ids) == step.emitted
    assert result.token_ids == engine.generate([3, 17, 42], greedy(25)).token_ids


def test_stream_single_token(make_engine):
    chunks = list(make_engine("qwen", "trunc", 3).stream([3, 17, 42], greedy(1)))
    assert [t for c in chunks for t in c.token_ids] == chunks[-1].result.token_ids
    assert len(chunks[-1].result.token_ids) == 1
    assert chunks[-1].result.stats.steps == []


# Context window ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("max_context", [20, 21, 22, 23])
@pytest.mark.parametrize("drafter", ["self", "trunc", "ngram"])
def test_context_window_is_respected_like_plain(make_engine, max_context, drafter):
    """prompt + output must fit in the context window, and the speculative engine stops exactly where plain
    decoding does (finish "length")."""
    prompt = list(range(1, 11))
    plain_engine = make_engine("qwen", max_context=max_context)
    plain = plain_engine.generate(prompt, greedy(100))
    assert len(prompt) + len(plain.token_ids) == max_context
    assert plain.finish_reason == "length"
    engine = make_engine("qwen", drafter, 3, max_context=max_context)
    spec = engine.generate(prompt, greedy(100))
    assert spec.finish_reason == "length"
    assert len(prompt) + len(spec.token_ids) <= max_context
    assert spec.token_ids == plain.token_ids
    assert engine.target.seq_len <= max_context


def test_prompt_that_fills_the_window_but_one_gives_one_token(make_engine):
    engine = make_engine("qwen", "trunc", 3, max_context=12)
    r = engine.generate(list(range(1, 12)), greedy(50))
    assert len(r.token_ids) == 1 and r.finish_reason == "length"
