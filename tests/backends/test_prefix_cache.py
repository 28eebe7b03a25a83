"""The prefix cache between requests (``PrefixCacheBackend``, what ``adaspec serve`` runs its target through with
``--max-batch 1``): a prompt prefills only what it does not share with the sequence before it, the output stays the
cold run's, and every case that must start cold does."""

from __future__ import annotations

import pytest
import torch

from adaspec.backends import TorchBackend
from adaspec.backends.prefix_cache import PrefixCacheBackend
from adaspec.controllers import FixedController
from adaspec.drafters import NgramDrafter
from adaspec.engine import GenerationConfig, SpeculativeEngine

SHARED = [3, 17, 42, 5, 9, 9, 12, 3, 17, 42, 7, 3, 17, 8, 3, 17, 42, 5, 3, 17, 11, 23]
FIRST, SECOND = SHARED + [4, 4, 19], SHARED + [31, 2]
CFG = GenerationConfig(max_new_tokens=16)


@pytest.fixture()
def engines(qwen):
    """(a speculative engine through a server-style prefix cache, a cold plain engine on its own backend)."""
    cached = PrefixCacheBackend(TorchBackend(qwen, "t"), strict_cold=True)
    return (SpeculativeEngine(cached, NgramDrafter(), FixedController(4)),
            SpeculativeEngine(TorchBackend(qwen, "cold"), None, None))


@pytest.fixture()
def warm(engines):
    """``engines`` after a first request: (speculative engine, cold engine, the wrapper's inner backend)."""
    spec, cold = engines
    spec.generate(FIRST, CFG)
    return spec, cold, spec.target.inner


def assert_prefilled_cold(spec, cold, cfg=CFG):
    """The next request on ``spec`` reuses nothing and answers what a cold engine answers."""
    out = spec.generate(SECOND, cfg)
    assert out.stats.cached_tokens == 0 and out.token_ids == cold.generate(SECOND, cfg).token_ids


def test_a_prompt_prefills_only_what_it_does_not_share(engines):
    spec, cold = engines
    first = spec.generate(FIRST, CFG)
    assert first.stats.cached_tokens == 0 and first.token_ids == cold.generate(FIRST, CFG).token_ids
    second = spec.generate(SECOND, CFG)
    assert second.stats.cached_tokens == len(SHARED)  # the shared prefix, nothing of the first answer
    assert second.token_ids == cold.generate(SECOND, CFG).token_ids
    again = spec.generate(SECOND, CFG)  # the same prompt: all but its last token (its logits are needed)
    assert again.stats.cached_tokens == len(SECOND) - 1 and again.token_ids == second.token_ids
    follow_up = SECOND + second.token_ids + [6, 6]  # a next turn holds the answer before it
    turn = spec.generate(follow_up, CFG)
    assert turn.stats.cached_tokens >= len(SECOND) + len(second.token_ids) - 1
    assert turn.token_ids == cold.generate(follow_up, CFG).token_ids
    assert turn.stats.summary()["cached_tokens"] == turn.stats.cached_tokens


def test_another_owner_starts_cold(engines):
    spec, _ = engines
    target = spec.target
    target.owner = "key:a"
    spec.generate(FIRST, CFG)
    assert spec.generate(SECOND, CFG).stats.cached_tokens == len(SHARED)
    target.owner = "key:b"  # another API key's request: its prefill time must not tell what key a sent
    assert spec.generate(SECOND, CFG).stats.cached_tokens == 0
    target.owner = "key:a"  # the cache now holds key b's sequence
    assert spec.generate(SECOND, CFG).stats.cached_tokens == 0


def test_strict_requests_prefill_cold_where_asked(qwen):
    strict = GenerationConfig(max_new_tokens=8, strict=True)
    for strict_cold, reused in ((True, 0), (False, len(FIRST) - 1)):
        engine = SpeculativeEngine(PrefixCacheBackend(TorchBackend(qwen, "t"), strict_cold=strict_cold), None, None)
        engine.generate(FIRST, CFG)
        out = engine.generate(FIRST, strict)
        assert out.stats.cached_tokens == reused
        assert out.token_ids == SpeculativeEngine(TorchBackend(qwen, "c"), None, None).generate(FIRST, strict).token_ids


def test_a_cache_changed_behind_the_wrapper_starts_cold(warm):
    spec, cold, inner = warm
    inner.truncate(inner.seq_len - 3)  # someone used the inner backend directly
    assert_prefilled_cold(spec, cold)


def test_a_failed_forward_leaves_a_cold_cache(warm, monkeypatch):
    spec, cold, inner = warm
    real = inner.forward

    def failing(ids, num_logits=1):
        real(ids[:1], 1)  # part of the prompt reached the cache before the failure
        raise RuntimeError("out of memory")

    monkeypatch.setattr(inner, "forward", failing)
    with pytest.raises(RuntimeError, match="out of memory"):
        spec.generate(SECOND, CFG)
    monkeypatch.setattr(inner, "forward", real)
    assert_prefilled_cold(spec, cold)


def test_a_cache_that_cannot_be_cut_there_starts_cold(warm, monkeypatch):
    """A cache that refuses a cut (a sliding window past its size) must not fail every later request."""
    spec, cold, inner = warm
    real = inner.truncate

    def refuses(length):
        if 0 < length < inner.seq_len:
            raise RuntimeError("'crop' was called on a sliding-window cache")
        real(length)

    monkeypatch.setattr(inner, "truncate", refuses)
    for _ in range(2):
        assert_prefilled_cold(spec, cold, GenerationConfig(max_new_tokens=1))  # one token: no verification cut


def test_a_failed_tree_forward_empties_the_cache(warm, monkeypatch):
    """What a failed forward left in the inner cache is unknown (a model may append some layers' keys and values
    and not its length): the cache is emptied, and the next request prefills cold."""
    spec, cold, inner = warm
    target = spec.target
    target.reset()
    target.forward(SECOND, 1)

    def failing(ids, parents):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(inner, "forward_tree", failing)
    with pytest.raises(RuntimeError, match="out of memory"):
        target.forward_tree([5, 6, 7], [-1, 0, 0])
    assert target._ids == [] and inner.seq_len == 0
    monkeypatch.undo()
    assert_prefilled_cold(spec, cold)


# Stored copies (store_bytes > 0): interleaved sessions each find their own prefix --------------------------------
OTHER = [50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 44, 45, 46, 47]


def stored_engine(qwen, store_bytes: int) -> SpeculativeEngine:
    return SpeculativeEngine(PrefixCacheBackend(TorchBackend(qwen, "t"), strict_cold=True, store_bytes=store_bytes),
                             NgramDrafter(), FixedController(4))


@pytest.fixture()
def cold(qwen):
    return SpeculativeEngine(TorchBackend(qwen, "cold"), None, None)


def test_an_interleaved_session_restores_its_own_prefix(qwen, cold):
    for store_bytes, reused in ((0, 0), (1 << 30, len(SHARED))):
        spec = stored_engine(qwen, store_bytes)
        spec.generate(FIRST, CFG)
        spec.generate(OTHER, CFG)  # another session's request replaces the cached sequence
        out = spec.generate(SECOND, CFG)
        assert out.stats.cached_tokens == reused and spec.target.restored == bool(reused)
        assert out.token_ids == cold.generate(SECOND, CFG).token_ids
        again = spec.generate(OTHER + [20, 21], CFG)  # and the other session finds its own in turn
        assert (again.stats.cached_tokens >= len(OTHER)) if store_bytes else again.stats.cached_tokens == 0
        assert again.token_ids == cold.generate(OTHER + [20, 21], CFG).token_ids


def test_the_store_keeps_to_its_bytes_evicting_the_least_recently_used(qwen, cold):
    per_token = TorchBackend(qwen, "t").kv_bytes_per_token()
    one = (len(FIRST) + CFG.max_new_tokens + 1) * per_token  # room for one copy of a request
    spec = stored_engine(qwen, one)
    third = [30 + i for i in range(len(SHARED))]
    for prompt in (FIRST, OTHER, third):
        spec.generate(prompt, CFG)
    target = spec.target
    assert target.stored_sequences == 1 and 0 < target.stored_bytes <= one  # OTHER's copy; FIRST's was evicted
    assert spec.generate(SECOND, CFG).stats.cached_tokens == 0
    assert spec.generate(OTHER, CFG).stats.cached_tokens == 0  # evicted when `third`'s sequence was stored
    assert target.stored_bytes <= one


def test_a_full_store_never_evicts_the_copy_it_is_about_to_put_back(qwen, cold):
    """A, B, A again with room for one copy: storing B's sequence must not evict A's, which the request needs."""
    per_token = TorchBackend(qwen, "t").kv_bytes_per_token()
    spec = stored_engine(qwen, (len(FIRST) + CFG.max_new_tokens + 1) * per_token)
    spec.generate(FIRST, CFG)
    spec.generate(OTHER, CFG)
    out = spec.generate(SECOND, CFG)
    assert out.stats.cached_tokens == len(SHARED) and spec.target.restored
    assert out.token_ids == cold.generate(SECOND, CFG).token_ids
    assert spec.target.stored_bytes <= spec.target.store_bytes


def test_a_pending_tree_is_never_reused_as_a_sequence(qwen):
    """Tree nodes left in the cache by a forward_tree that no keep_tree_path followed are dropped at reset, so a
    later prompt that spells the nodes out is not served from them."""
    target = PrefixCacheBackend(TorchBackend(qwen, "t"), store_bytes=1 << 30)
    target.forward(SHARED, 1)
    target.forward_tree([7, 8, 9, 10], [-1, -1, 1])
    target.reset()
    target.forward(OTHER, 1)
    target.reset()
    target.forward(SHARED + [7, 8, 9, 10, 11], 1)
    assert target.reused_tokens == len(SHARED)


def test_a_copy_sits_in_host_memory_at_its_own_size(qwen):
    backend = TorchBackend(qwen, "t")
    backend.forward(SHARED, 1)
    backend.forward([1, 2, 3, 4], 4)
    backend.truncate(len(SHARED))  # a cropped cache: its tensors are views of larger storage
    snap = backend.snapshot()
    assert snap.nbytes == len(SHARED) * backend.kv_bytes_per_token()
    tensors = [t for layer in snap.data[0].layers for t in vars(layer).values() if isinstance(t, torch.Tensor)]
    assert tensors and all(t.device.type == "cpu" and t.untyped_storage().nbytes() == t.numel() * t.element_size()
                           for t in tensors)


def test_a_stored_copy_is_its_owners_only(qwen):
    spec = stored_engine(qwen, 1 << 30)
    target = spec.target
    target.owner = "key:a"
    spec.generate(FIRST, CFG)
    target.owner = "key:b"
    assert spec.generate(SECOND, CFG).stats.cached_tokens == 0  # key a's copy is not key b's to reuse
    target.owner = "key:a"
    assert spec.generate(SECOND, CFG).stats.cached_tokens == len(SHARED)  # key a's own, put back


def test_a_copy_that_cannot_go_back_is_dropped_and_the_request_prefills_cold(qwen, cold, monkeypatch):
    spec = stored_engine(qwen, 1 << 30)
    spec.generate(FIRST, CFG)
    spec.generate(OTHER, CFG)
    inner = spec.target.inner

    def refuses(snap):
        raise RuntimeError("no room left in the KV cache")

    monkeypatch.setattr(inner, "restore", refuses)
    out = spec.generate(SECOND, CFG)
    assert out.stats.cached_tokens == 0 and out.token_ids == cold.generate(SECOND, CFG).token_ids
    monkeypatch.undo()
    assert spec.target.stored_sequences == 1  # OTHER's copy; FIRST's, which failed, is gone
    assert spec.generate(SECOND + [9], CFG).stats.cached_tokens == len(SECOND)  # the sequence just run


def test_a_strict_request_starts_cold_but_keeps_the_copies(qwen, cold):
    spec = stored_engine(qwen, 1 << 30)
    spec.generate(FIRST, CFG)
    strict = GenerationConfig(max_new_tokens=8, strict=True)
    assert spec.generate(FIRST, strict).stats.cached_tokens == 0
    spec.generate(OTHER, CFG)
    out = spec.generate(SECOND, CFG)  # a copy of FIRST's sequence was stored before the strict request replaced it
    assert out.stats.cached_tokens == len(SHARED) and spec.target.restored
    assert out.token_ids == cold.generate(SECOND, CFG).token_ids


def test_a_negative_store_is_refused(qwen):
    with pytest.raises(ValueError, match="store_bytes"):
        PrefixCacheBackend(TorchBackend(qwen, "t"), store_bytes=-1)
