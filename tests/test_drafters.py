"""NgramDrafter (prompt lookup) semantics and ModelDrafter proposals against the model's own greedy path."""

from __future__ import annotations

import random

import pytest
import torch

from adaspec.backends import TorchBackend, truncated_layers
from adaspec.drafters import ModelDrafter, NgramDrafter
from adaspec.errors import ConfigError
from adaspec.sampling import SamplingParams

GREEDY = SamplingParams()


def ngram_propose(ids, k, **kw):
    d = NgramDrafter(**kw)
    d.prefill(ids)
    draft = d.propose(list(ids), k, GREEDY)
    assert draft.probs is None
    return draft.tokens.tolist()


@pytest.mark.parametrize("ids,k,expected", [
    ([1, 2, 3, 4, 1, 2], 3, [3, 4, 1]),
    ([1, 2, 3, 1, 2, 4, 1, 2], 2, [4, 1]),       # the most recent occurrence of the suffix wins
    ([7, 2, 8, 2, 9, 7, 2], 2, [8, 2]),          # the longest matching suffix wins over a more recent shorter one
    ([1, 2, 3], 4, []),                          # no earlier occurrence of the last token
    ([5, 6, 5], 10, [6, 5]),                     # continuation shorter than k (runs to the end)
    ([1, 1, 1, 1], 3, [1]),                      # never matches the suffix with itself
    ([4], 3, []),
    ([1, 2, 3, 1, 2], 0, []),                    # k = 0
])
def test_ngram_lookup(ids, k, expected):
    assert ngram_propose(ids, k) == expected


def test_ngram_min_and_max_length():
    ids = [9, 3, 1, 2, 8, 8, 3]  # only a single-token match (3 → 1) exists
    assert ngram_propose(ids, 2) == [1, 2]
    assert ngram_propose(ids, 2, min_ngram=2) == []
    ids = [1, 2, 3, 4, 9, 9, 2, 3, 4, 5, 6, 1, 2, 3, 4]
    # suffix (1,2,3,4) occurred at 0..3 (→ 9); (2,3,4) more recently at 6..8 (→ 5)
    assert ngram_propose(ids, 1, max_ngram=4) == [9]
    assert ngram_propose(ids, 1, max_ngram=3) == [5]


def test_ngram_incremental_index_equals_fresh_lookup():
    rng = random.Random(0)
    ids = [rng.randrange(6) for _ in range(5)]
    drafter = NgramDrafter()
    drafter.prefill(ids)
    for _ in range(60):
        k = rng.randrange(1, 5)
        got = drafter.propose(ids, k, GREEDY).tokens.tolist()
        assert got == ngram_propose(ids, k)
        ids.append(rng.randrange(6))
    drafter.prefill([1, 2, 1])  # a new request forgets the old index
    assert drafter.propose([1, 2, 1], 2, GREEDY).tokens.tolist() == [2, 1]


@pytest.mark.parametrize("kw", [dict(min_ngram=0), dict(min_ngram=3, max_ngram=2), dict(max_ngram=0)])
def test_ngram_config_errors(kw):
    with pytest.raises(ConfigError):
        NgramDrafter(**kw)


def test_model_drafter_greedy_proposal_is_the_draft_models_greedy_continuation(qwen):
    draft_model = truncated_layers(qwen, 2)
    ids = [3, 17, 42, 5, 9]
    drafter = ModelDrafter(TorchBackend(draft_model, "d"))
    drafter.prefill(ids)
    got = drafter.propose(ids + [11], 5, GREEDY)
    # reference: 5 greedy steps of the draft model without any cache
    seq = ids + [11]
    with torch.inference_mode():
        for _ in range(5):
            seq.append(int(draft_model(torch.tensor([seq])).logits[0, -1].argmax()))
    assert got.tokens.tolist() == seq[-5:]
    assert got.probs is None
    assert drafter.propose(ids + [11], 0, GREEDY).tokens.numel() == 0


def test_model_drafter_sampling_probs_match_logits_to_probs(qwen):
    from adaspec.sampling import logits_to_probs

    draft_model = truncated_layers(qwen, 2)
    sp = SamplingParams(temperature=0.7, top_k=10)
    ids = [3, 17, 42, 5, 9, 11]
    drafter = ModelDrafter(TorchBackend(draft_model, "d"))
    drafter.prefill(ids[:-1])
    draft = drafter.propose(ids, 3, sp, torch.Generator().manual_seed(0))
    assert draft.probs.shape == (3, qwen.config.vocab_size)
    seq = ids + draft.tokens.tolist()
    with torch.inference_mode():
        logits = draft_model(torch.tensor([seq])).logits[0, len(ids) - 1:len(ids) + 2]
    torch.testing.assert_close(draft.probs, logits_to_probs(logits, sp), atol=1e-5, rtol=0)
    assert all(float(draft.probs[i, t]) > 0 for i, t in enumerate(draft.tokens.tolist()))
    assert ((draft.probs > 0).sum(-1) <= 10).all()  # top-k applied to q as well


def test_model_drafter_confidence_stop(qwen):
    drafter = ModelDrafter(TorchBackend(truncated_layers(qwen, 2), "d"))
    ids = [3, 17, 42, 5, 9, 11]
    drafter.prefill(ids[:-1])
    seen = []

    def stop(pos, probs, tok):
        assert probs.shape == (qwen.config.vocab_size,)
        assert int(probs.argmax()) == tok  # greedy: the token is the argmax of the (softmax) distribution
        torch.testing.assert_close(probs.sum(), torch.tensor(1.0))
        seen.append(pos)
        return pos == 2

    draft = drafter.propose(ids, 6, GREEDY, stop=stop)
    assert len(draft) == 3 and seen == [0, 1, 2]
