"""KV-cache rollback: after any accept/reject pattern the cache must be exactly the accepted prefix.

Checked against a fresh backend prefilled with the same sequence (fp32, atol 1e-4), directly on TorchBackend, through
the engine, and for the ModelDrafter's own cache. Also chunked prefill vs one-shot.
"""

from __future__ import annotations

import random

import pytest
import torch

from adaspec.backends import TorchBackend, truncated_layers
from adaspec.drafters import ModelDrafter
from adaspec.engine import GenerationConfig
from adaspec.errors import ContextLengthError
from adaspec.sampling import SamplingParams

from conftest import VOCAB

ATOL = 1e-4


def fresh_logits(model, seq: list[int], num_logits: int = 1) -> torch.Tensor:
    backend = TorchBackend(model)
    out = backend.forward(seq, num_logits)
    assert backend.seq_len == len(seq)
    return out


@pytest.mark.parametrize("arch", ["qwen", "llama"])
@pytest.mark.parametrize("k", [1, 4])
def test_truncate_then_forward_equals_fresh_forward(models, arch, k):
    model = models[arch]
    rng = random.Random(k)
    prompt = [rng.randrange(VOCAB) for _ in range(9)]
    block = [rng.randrange(VOCAB) for _ in range(k + 1)]  # [pending] + K drafts
    backend = TorchBackend(model)
    for keep in range(k + 2):  # accept 0..K drafts (+ the pending token), i.e. every accept/reject pattern
        backend.reset()
        assert backend.seq_len == 0
        backend.forward(prompt, 1)
        verify_logits = backend.forward(block, k + 1)
        assert verify_logits.shape == (k + 1, VOCAB)
        assert backend.seq_len == len(prompt) + k + 1
        # the verification logits equal a fresh forward's logits at the same positions
        torch.testing.assert_close(verify_logits, fresh_logits(model, prompt + block, k + 1), atol=ATOL, rtol=0)
        backend.truncate(len(prompt) + keep)
        assert backend.seq_len == len(prompt) + keep
        nxt = rng.randrange(VOCAB)
        got = backend.forward([nxt], 1)
        want = fresh_logits(model, prompt + block[:keep] + [nxt])
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ["qwen", "llama"])
def test_many_rounds_of_verify_and_rollback(models, arch):
    """A long random walk of speculation steps: after each rollback the next verification's logits match a fresh
    forward over the whole accepted sequence."""
    model = models[arch]
    rng = random.Random(1 if arch == "qwen" else 2)
    seq = [rng.randrange(VOCAB) for _ in range(5)]
    backend = TorchBackend(model)
    backend.forward(seq[:-1], 1)  # engine invariant: every token but the pending one is cached
    for _ in range(8):
        k = rng.randrange(0, 6)
        drafts = [rng.randrange(VOCAB) for _ in range(k)]
        logits = backend.forward([seq[-1]] + drafts, k + 1)
        torch.testing.assert_close(logits, fresh_logits(model, seq + drafts, k + 1), atol=ATOL, rtol=0)
        n_acc = rng.randrange(0, k + 1)
        backend.truncate(len(seq) + n_acc)
        seq = seq + drafts[:n_acc] + [rng.randrange(VOCAB)]
        assert backend.seq_len == len(seq) - 1


def test_truncate_no_op_zero_and_errors(qwen):
    backend = TorchBackend(qwen, max_context=16)
    backend.forward([1, 2, 3, 4, 5], 2)
    before = backend.forward([6], 1)
    backend.truncate(5)  # drop the 6
    backend.truncate(5)  # a no-op at the current length
    assert backend.seq_len == 5
    again = backend.forward([6], 1)
    torch.testing.assert_close(before, again, atol=ATOL, rtol=0)
    backend.truncate(backend.seq_len)  # truly a no-op
    assert backend.seq_len == 6
    with pytest.raises(ValueError):
        backend.truncate(7)
    with pytest.raises(ValueError):
        backend.truncate(-1)
    with pytest.raises(ValueError):
        backend.forward([1, 2], 3)
    with pytest.raises(ValueError):
        backend.forward([1, 2], 0)
    backend.truncate(0)
    assert backend.seq_len == 0
    torch.testing.assert_close(backend.forward([9, 8, 7], 1), fresh_logits(qwen, [9, 8, 7]), atol=ATOL, rtol=0)
    with pytest.raises(ContextLengthError, match="16"):
        backend.forward(list(range(14)), 1)  # 3 + 14 > 16
    assert backend.seq_len == 3  # a refused forward leaves the cache alone
    backend.forward(list(range(13)), 1)  # exactly fills the window
    assert backend.seq_len == 16


@pytest.mark.parametrize("drafter,controller", [("trunc", 3), ("indep", 5), ("ngram", 2), ("trunc", "adaptive"),
                                                ("trunc", "heuristic"), ("self", 4), (None, 0)])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_engine_leaves_target_cache_at_sequence_minus_one(make_engine, models, drafter, controller, temperature):
    prompt = [7, 3, 3, 50, 21, 7, 3]
    engine = make_engine("qwen", drafter, controller)
    r = engine.generate(prompt, GenerationConfig(max_new_tokens=23, temperature=temperature, seed=3,
                                                 ignore_eos=True))
    assert r.finish_reason == "length"
    seq = prompt + r.token_ids
    assert engine.target.seq_len == len(seq) - 1
    # ...and its content is that sequence: the next logits equal a fresh forward's
    got = engine.target.forward([seq[-1]], 1)
    torch.testing.assert_close(got, fresh_logits(models["qwen"], seq), atol=ATOL, rtol=0)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("draft_kind", ["trunc", "indep"])
def test_model_drafter_cache_is_consistent_after_rejections(models, temperature, draft_kind):
    """Drive a ModelDrafter through random accept/reject patterns; each proposal equals a fresh drafter's proposal
    for the same ids (same seed)."""
    target = models["qwen"]
    draft_model = truncated_layers(target, 2) if draft_kind == "trunc" else models["qwen_indep"]
    sp = SamplingParams(temperature=temperature)
    rng = random.Random(42)
    prompt = [rng.randrange(VOCAB) for _ in range(6)]
    ids = prompt + [rng.randrange(VOCAB)]  # prompt + the first generated token
    drafter = ModelDrafter(TorchBackend(draft_model, "d"))
    drafter.prefill(prompt)
    stop = (lambda pos, probs, tok: pos == 1) if temperature == 0.0 else None  # an early stop, sometimes
    for round_ in range(10):
        k = rng.randrange(1, 6)
        use_stop = stop if round_ % 3 == 0 else None
        draft = drafter.propose(ids, k, sp, torch.Generator().manual_seed(round_), use_stop)
        fresh = ModelDrafter(TorchBackend(draft_model, "d"))
        fresh.prefill(prompt)
        ref = fresh.propose(ids, k, sp, torch.Generator().manual_seed(round_), use_stop)
        assert draft.tokens.tolist() == ref.tokens.tolist()
        assert len(draft) == (min(k, 2) if use_stop is not None else k)  # a model drafter stops only when told
        if temperature > 0:
            torch.testing.assert_close(draft.probs, ref.probs, atol=1e-5, rtol=0)
            assert draft.probs.shape == (len(draft), VOCAB)
        else:
            assert draft.probs is None
        # verifier outcome: accept a random prefix, then a correction that differs from the rejected draft
        d = draft.tokens.tolist()
        n_acc = rng.randrange(0, len(d) + 1)
        corr = rng.randrange(VOCAB)
        if n_acc < len(d) and corr == d[n_acc]:
            corr = (corr + 1) % VOCAB
        ids = ids + d[:n_acc] + [corr]


@pytest.mark.parametrize("arch", ["qwen", "llama"])
@pytest.mark.parametrize("n,num_logits", [(30, 1), (30, 5), (30, 30), (14, 1), (14, 8), (7, 1), (8, 2), (22, 16)])
def test_chunked_prefill_equals_one_shot(models, arch, n, num_logits):
    model = models[arch]
    ids = [(i * 37 + 11) % VOCAB for i in range(n)]
    chunked = TorchBackend(model, prefill_chunk=7)
    one_shot = TorchBackend(model)
    a = chunked.forward(ids, num_logits)
    b = one_shot.forward(ids, num_logits)
    assert a.shape == (num_logits, VOCAB)
    assert chunked.seq_len == one_shot.seq_len == n
    torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
    torch.testing.assert_close(chunked.forward([5, 6], 2), one_shot.forward([5, 6], 2), atol=ATOL, rtol=0)


def test_chunked_prefill_through_the_engine(make_engine):
    prompt = [(i * 13 + 5) % VOCAB for i in range(40)]
    a = make_engine("qwen", "trunc", 3, prefill_chunk=7).generate(prompt, GenerationConfig(max_new_tokens=20,
                                                                                          ignore_eos=True))
    b = make_engine("qwen").generate(prompt, GenerationConfig(max_new_tokens=20, ignore_eos=True))
    assert a.token_ids == b.token_ids
