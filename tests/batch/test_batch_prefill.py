"""Prefill in the batch engine: chunks sized by a time budget (adaspec.chunking) and prompt prefixes shared between
rows (Backend.share_prefix), e.g. the n choices of one request."""

from __future__ import annotations

import importlib.util
import types

import pytest
import torch
from hypothesis import given
from conftest import tiny_model as build_tiny_model
from hypothesis import strategies as st

import adaspec.batch.engine
import adaspec.batch.prefill
from adaspec.backends.base import BatchRow
from adaspec.backends.torch_backend import TorchBackend
from adaspec.batch import BatchEngine
from adaspec.chunking import MIN_PREFILL_CHUNK, StepCosts, common_prefix
from adaspec.engine import GenerationConfig
from adaspec.errors import ConfigError

HAVE_IK = importlib.util.find_spec("ik_llama_cpp") is not None


@pytest.fixture(scope="module")
def tiny_model():
    return build_tiny_model("qwen", seed=0, max_positions=1024)


# --------------------------------------------------------------------------------------------------------------
# The cost model
# --------------------------------------------------------------------------------------------------------------


def test_step_costs_fit_tokens_to_a_budget_from_measured_forwards():
    c = StepCosts(weight=0.5)
    assert c.tokens_within(1000) is None  # nothing measured yet
    c.forward(4, 100.0)  # under MIN_PREFILL_CHUNK tokens: not a per-token measurement
    assert c.per_token_ms is None
    c.forward(40, 400.0)  # no curve: no fixed part, 10 ms per token
    assert c.per_token_ms == pytest.approx(10.0)
    assert c.tokens_within(300.0) == 30 and c.tokens_within(300.0, other_tokens=9) == 21
    c.forward(20, 400.0)  # 20 ms per token now; the average moves half way
    assert c.per_token_ms == pytest.approx(15.0)
    assert c.tokens_within(10.0, other_tokens=5) < 0  # the budget is spent


def test_step_costs_take_the_fixed_part_and_the_first_slope_from_the_pricers_curve():
    c = StepCosts(weight=1.0)
    c.forward(1, 60.0, curve={1: 60.0, 9: 140.0, 33: 380.0})
    assert c.base_ms == 60.0 and c.per_token_ms == pytest.approx(10.0)  # (380 - 60) / 32
    c.forward(32, 700.0, curve={1: 60.0, 9: 140.0, 33: 380.0})
    assert c.per_token_ms == pytest.approx(20.0)  # (700 - 60) / 32
    assert c.tokens_within(460.0) == 20


def test_step_costs_price_draft_feeds_per_model():
    c = StepCosts(weight=1.0)
    assert c.feed_tokens_within("d", 100.0) is None
    assert c.feed_tokens_within("d", 100.0, prior_ms_per_token=4.0) == 25
    c.fed("d", 50, 100.0)
    assert c.feed_tokens_within("d", 100.0, prior_ms_per_token=4.0) == 50  # measured beats the prior
    assert c.feed_tokens_within("other", 100.0) is None
    with pytest.raises(ValueError, match="weight"):
        StepCosts(weight=0)


@given(st.lists(st.integers(0, 3), max_size=600), st.lists(st.integers(0, 3), max_size=600),
       st.none() | st.integers(0, 700))
def test_common_prefix_equals_a_token_by_token_scan(a, b, limit):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    want = n if limit is None else min(n, limit)
    assert common_prefix(a, b, limit) == want


def test_common_prefix_across_block_boundaries():
    a = list(range(1000))
    for cut in (0, 255, 256, 257, 511, 999):
        b = a[:cut] + [-1] + a[cut + 1:]
        assert common_prefix(a, b) == cut
    assert common_prefix(a, list(a)) == 1000 and common_prefix(a, a[:300]) == 300


# --------------------------------------------------------------------------------------------------------------
# Chunks sized by time: a fake clock that a forward advances by base + per-token cost × tokens
# --------------------------------------------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class _TimedBackend(TorchBackend):
    """A forward takes ``base_ms + (per_token_ms + context/100) × tokens`` on ``clock`` (cost grows with context)."""

    clock: _Clock
    base_ms = 10.0
    per_token_ms = 5.0

    def forward_batch(self, rows):
        longest = max(self.seq_len_of(r.seq) for r in rows)
        tokens = sum(len(r.input_ids) for r in rows)
        self.clock.now += (self.base_ms + (self.per_token_ms + longest / 100) * tokens) / 1e3
        return super().forward_batch(rows)


def test_prefill_chunks_shrink_to_keep_each_step_within_its_budget(tiny_model, monkeypatch):
    clock = _Clock()
    for module in (adaspec.batch.engine, adaspec.batch.prefill):
        monkeypatch.setattr(module, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    backend = _TimedBackend(tiny_model, "t", max_sequences=2)
    backend.clock = clock
    engine = BatchEngine(backend, max_batch=2, prefill_chunk=64, prefill_step_ms=100.0)
    cfg = GenerationConfig(max_new_tokens=80, ignore_eos=True)
    short = engine.add([5, 6, 7], cfg)
    engine.step()  # the short row prefills alone and decodes from now on
    long_prompt = [(i * 7) % 60 + 3 for i in range(400)]
    long = engine.add(long_prompt, GenerationConfig(max_new_tokens=2, ignore_eos=True))
    chunks, step_ms = [], []
    while True:
        start = clock.now
        out = engine.step()
        assert short in out and out[short].token_ids  # the short row advances at every step
        chunks.append(engine.last_prefill_tokens)
        step_ms.append((clock.now - start) * 1e3)
        if long in out:
            break
    assert chunks[0] == 64  # before any forward of MIN_PREFILL_CHUNK tokens: the cap
    assert max(step_ms[2:]) <= 100.0 * 1.15  # then each step keeps near the budget as the context grows ...
    assert all(c >= MIN_PREFILL_CHUNK for c in chunks[:-1]) and chunks[2] > chunks[-2]  # ... by shrinking chunks
    assert sum(chunks) == len(long_prompt)
    # the answer is the one an unchunked batch gives
    ref = BatchEngine(TorchBackend(tiny_model, "t", max_sequences=2), max_batch=2, prefill_chunk=None)
    want = ref.generate([long_prompt], GenerationConfig(max_new_tokens=2, ignore_eos=True))[0]
    assert out[long].token_ids == want.token_ids[:1]


def test_a_lone_prefill_ignores_the_budget_and_bad_budgets_are_refused(tiny_model):
    engine = BatchEngine(TorchBackend(tiny_model, "t", max_sequences=2), max_batch=2, prefill_chunk=8,
                         prefill_step_ms=0.001)
    engine.add(list(range(3, 43)), GenerationConfig(max_new_tokens=2))
    engine.step()
    assert engine.last_prefill_tokens == 4 * 8  # nobody waits on it: four chunks, as without a budget
    for bad in (0, -5.0):
        with pytest.raises(ConfigError, match="prefill_step_ms"):
            BatchEngine(TorchBackend(tiny_model, "t", max_sequences=2), max_batch=2, prefill_step_ms=bad)


# --------------------------------------------------------------------------------------------------------------
# Shared prefixes
# --------------------------------------------------------------------------------------------------------------


def test_torch_share_prefix_equals_prefilling_the_same_tokens(tiny_model):
    b = TorchBackend(tiny_model, "t", max_sequences=3)
    prompt = [(i * 5) % 60 + 3 for i in range(30)]
    b.forward_batch([BatchRow(0, prompt, 1)])
    b.share_prefix(0, 1, 0, 20)
    assert b.seq_len_of(1) == 20 and b.seq_len_of(0) == 30
    shared = b.forward_batch([BatchRow(1, prompt[20:], 10)])[0]
    own = b.forward_batch([BatchRow(2, prompt, 10)])[0]
    torch.testing.assert_close(shared, own, atol=1e-4, rtol=1e-4)
    b.truncate_seq(0, 0)  # the donor leaving does not touch the copy
    again = b.forward_batch([BatchRow(1, [7], 1)])[0]
    torch.testing.assert_close(again, b.forward_batch([BatchRow(2, [7], 1)])[0], atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="holds"):
        b.share_prefix(2, 1, 0, 5)  # sequence 1 is not at position 0
    with pytest.raises(ValueError, match="cannot share positions"):
        b.share_prefix(0, 1, 31, 40)  # the donor holds nothing there


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_IK, reason="needs ik-llama-cpp-python")
def test_ik_share_prefix_joins_the_donors_cells():
    from adaspec.api import load_model

    b = load_model("smollm2-135m-instruct@ik", progress=False, threads=2, max_sequences=3).backend
    try:
        assert b.shares_prefix
        prompt = [(i * 5) % 2000 + 100 for i in range(80)]
        b.forward_batch([BatchRow(0, prompt, 1)])
        b.share_prefix(0, 1, 0, 79)
        assert b.seq_len_of(1) == 79
        b.truncate_seq(0, 40)  # the donor's later removals leave the shared cells in place (and compact)
        shared = b.forward_batch([BatchRow(1, prompt[79:] + [5, 6], 3)])[0]
        b.forward_batch([BatchRow(2, prompt[:79], 1)])  # the same tokens, fed by the row itself in the same chunks
        own = b.forward_batch([BatchRow(2, prompt[79:] + [5, 6], 3)])[0]
        assert torch.isfinite(shared).all()
        assert shared.argmax(-1).tolist() == own.argmax(-1).tolist()
        # ik's rows are not bit-independent of the others in the cache (rows_independent); measured here: 0.3
        # between two rows prefilled alike, 4.4 between a 79 + 3 and an 82-token prefill of the same tokens
        assert (shared - own).abs().max().item() < 1.0
    finally:
        b.close()


def test_n_choices_of_one_prompt_prefill_it_once_and_decode_as_alone(tiny_model):
    prompt = [(i * 11) % 60 + 3 for i in range(50)]
    cfg = GenerationConfig(max_new_tokens=6, ignore_eos=True)
    alone = BatchEngine(TorchBackend(tiny_model, "t", max_sequences=1), max_batch=1,
                        prefill_chunk=16).generate([prompt], cfg)[0]
    engine = BatchEngine(TorchBackend(tiny_model, "t", max_sequences=3), max_batch=3, prefill_chunk=16)
    rids = [engine.add(prompt, cfg) for _ in range(3)]
    prefilled = shared = 0
    results = {}
    while len(results) < 3:
        out = engine.step()
        prefilled += engine.last_prefill_tokens
        shared += engine.last_shared_tokens
        results.update({rid: c.result for rid, c in out.items() if c.result is not None})
    assert prefilled == len(prompt) + 2 and shared == 2 * (len(prompt) - 1)  # the others feed only the last token
    assert sorted(results[rid].stats.cached_tokens for rid in rids) == [0, len(prompt) - 1, len(prompt) - 1]
    for rid in rids:
        assert results[rid].token_ids == alone.token_ids


def test_a_prompt_that_extends_a_running_rows_prompt_takes_its_prefix(tiny_model):
    engine = BatchEngine(TorchBackend(tiny_model, "t", max_sequences=2), max_batch=2, prefill_chunk=None)
    first = [(i * 3) % 60 + 3 for i in range(30)]
    cfg = GenerationConfig(max_new_tokens=8, ignore_eos=True)
    a = engine.add(first, cfg)
    engine.step()
    longer = first[:24] + [9, 9, 9]
    b = engine.add(longer, GenerationConfig(max_new_tokens=3, ignore_eos=True))
    engine.step()
    assert engine.last_shared_tokens == 24 and engine.last_prefill_tokens == 3
    ref = BatchEngine(TorchBackend(tiny_model, "t", max_sequences=1), max_batch=1, prefill_chunk=None)
    want = ref.generate([longer], GenerationConfig(max_new_tokens=3, ignore_eos=True))[0]
    results = {}
    while b not in results or a not in results:
        results.update({rid: c.result for rid, c in engine.step().items() if c.result is not None})
    assert results[b].token_ids == want.token_ids
    assert results[b].stats.cached_tokens == 24 and results[a].stats.cached_tokens == 0


def test_strict_batches_and_scored_rows_never_share(tiny_model):
    prompt = [i % 60 + 3 for i in range(30)]
    strict = TorchBackend(tiny_model, "t", max_sequences=2)
    strict.batch_invariant = True
    engine = BatchEngine(strict, max_batch=2, prefill_chunk=None)
    engine.add(prompt, GenerationConfig(max_new_tokens=2, strict=True))
    engine.add(prompt, GenerationConfig(max_new_tokens=2, strict=True))
    engine.step()
    assert engine.last_shared_tokens == 0 and engine.last_prefill_tokens == 2 * len(prompt)
    engine = BatchEngine(TorchBackend(tiny_model, "t", max_sequences=2), max_batch=2, prefill_chunk=None)
    engine.add(prompt, GenerationConfig(max_new_tokens=2))
    engine.step()
    engine.add(prompt, GenerationConfig(max_new_tokens=2, prompt_logprobs=0))
    engine.step()
    assert engine.last_shared_tokens == 0  # a scored row needs its own logits at every position
