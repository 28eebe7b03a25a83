"""NgramDrafter (prompt lookup) semantics, ModelDrafter proposals against the model's own greedy path, and the draft
cache kept across requests that share a prefix."""

from __future__ import annotations

import random

import pytest
import torch

from adaspec.backends import Backend, TorchBackend, truncated_layers
from adaspec.controllers import FixedController
from adaspec.drafters import ModelDrafter, NgramDrafter
from adaspec.engine import GenerationConfig, SpeculativeEngine
from adaspec.errors import ConfigError
from adaspec.sampling import SamplingParams

from conftest import MarkovBackend, markov_table

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
    seen.clear()  # a draft of K tokens asks about its last token too (the controller learns from every q) ...
    draft = drafter.propose(ids, 1, GREEDY, stop=stop)
    assert len(draft) == 1 and seen == [0]
    seen.clear()
    draft = drafter.propose(ids, 2, GREEDY, stop=lambda pos, probs, tok: seen.append(pos) or True)
    assert len(draft) == 1 and seen == [0]  # ... and a stop at any position ends the draft there


# The draft cache across requests -------------------------------------------------------------------------------
class Spy(Backend):
    """Delegates to ``inner`` and logs how many tokens each forward feeds (``fed``)."""

    def __init__(self, inner: Backend) -> None:
        self.inner, self.fed = inner, []
        self.name, self.vocab_size, self.max_context = inner.name, inner.vocab_size, inner.max_context

    @property
    def seq_len(self) -> int:
        return self.inner.seq_len

    def forward(self, input_ids, num_logits=1):
        self.fed.append(len(input_ids))
        return self.inner.forward(input_ids, num_logits)

    def truncate(self, length):
        self.inner.truncate(length)


def test_model_drafter_keeps_its_cache_across_requests_and_proposes_as_a_fresh_one(qwen):
    model = truncated_layers(qwen, 2)
    spy = Spy(TorchBackend(model, "d"))
    kept = ModelDrafter(spy)
    first = [3, 17, 42, 5, 9, 11]
    kept.prefill(first[:-1])
    kept.propose(first, 4, GREEDY)
    # The next request extends the sequence; then one that diverges at position 3; then an unrelated one.
    for ids, held in ([3, 17, 42, 5, 9, 11, 20, 21, 22], 6), ([3, 17, 42, 7, 7, 8], 3), ([50, 1, 2], 0):
        assert kept.cached_prefix(ids) == held
        spy.fed.clear()
        kept.prefill(ids[:-1])
        got = kept.propose(ids, 4, GREEDY)
        assert spy.fed[0] == len(ids) - held  # only the tokens the cache lacks
        fresh = ModelDrafter(TorchBackend(model, "fresh"))
        fresh.prefill(ids[:-1])
        assert got.tokens.tolist() == fresh.propose(ids, 4, GREEDY).tokens.tolist()


def test_model_drafter_starts_over_when_its_backend_was_reset_behind_its_back_and_feed(qwen):
    model = truncated_layers(qwen, 2)
    spy = Spy(TorchBackend(model, "d"))
    drafter = ModelDrafter(spy)
    ids = [3, 17, 42, 5, 9, 11]
    drafter.prefill(ids[:-1])
    expected = drafter.propose(ids, 3, GREEDY).tokens.tolist()
    spy.inner.reset()  # e.g. a benchmark emptied the draft model's cache
    assert drafter.cached_prefix(ids) == 0
    drafter.prefill(ids[:-1])
    assert drafter.propose(ids, 3, GREEDY).tokens.tolist() == expected
    spy.inner.reset()
    drafter.feed(ids)  # a prefill outside a timed run: all but the last token
    assert spy.seq_len == len(ids) - 1 and drafter.cached_prefix(ids) == len(ids) - 1
    spy.fed.clear()
    drafter.prefill(ids[:-1])
    assert drafter.propose(ids, 3, GREEDY).tokens.tolist() == expected
    assert spy.fed[0] == 1
    other = [3, 17, 8, 8, 1, 2, 40]  # feed a different sequence (no prefill): checked from its first token
    drafter.feed(other)
    assert drafter.cached_prefix(other) == len(other) - 1 and spy.seq_len == len(other) - 1
    fresh = ModelDrafter(TorchBackend(model, "fresh"))
    assert drafter.propose(other, 3, GREEDY).tokens.tolist() == fresh.propose(other, 3, GREEDY).tokens.tolist()


def test_engine_feeds_the_draft_model_only_what_a_new_request_adds():
    table = markov_table(16, seed=3, scale=3.0)
    draft_table = table + 0.7 * torch.randn(table.shape, generator=torch.Generator().manual_seed(4))
    spy = Spy(MarkovBackend(draft_table, "draft"))
    engine = SpeculativeEngine(MarkovBackend(table, "target"), ModelDrafter(spy), FixedController(3))
    plain = SpeculativeEngine(MarkovBackend(table, "target"))
    cfg = GenerationConfig(max_new_tokens=20, ignore_eos=True)

    def run(prompt: list[int]) -> tuple[int, list[int], list[int]]:
        held = engine.drafter.cached_prefix(prompt)
        spy.fed.clear()
        out = engine.generate(prompt, cfg).token_ids
        assert out == plain.generate(prompt, cfg).token_ids  # lossless (greedy)
        return held, out, list(spy.fed)

    rng = random.Random(5)
    p1 = [rng.randrange(16) for _ in range(40)]
    held, out1, fed = run(p1)
    assert held == 0 and fed[0] == len(p1) + 1  # cold: the prompt and the first token
    p2 = p1 + out1 + [5, 9, 2]  # the next turn: the conversation so far and a new message
    held, _, fed = run(p2)
    assert held >= len(p1) + len(out1) - 4  # all but (at most) the last step's K + 1 tokens
    assert fed[0] == len(p2) + 1 - held <= 3 + 1 + 4  # the new message, the first token and that tail
    p3 = [(t + 1) % 16 for t in p1]  # a different prompt: nothing shared
    held, _, fed = run(p3)
    assert held == 0 and fed[0] == len(p3) + 1
    p4 = p3[:6] + [(t + 2) % 16 for t in p3[6:]]  # shares 6 tokens with the sequence before
    held, _, fed = run(p4)
    assert held == 6 and fed[0] == len(p4) + 1 - 6


# A bounded catch-up (ModelDrafter(catch_up=N)) --------------------------------------------------------------------
# MarkovBackend's next token depends on the last two tokens only, so a draft model that sees a window of at least two
# tokens proposes exactly what one that sees the whole sequence proposes: what changes is only what it feeds.
def test_a_bounded_catch_up_feeds_only_the_last_tokens_and_keeps_its_window_in_step():
    table = markov_table(16, seed=8, scale=3.0)
    spy = Spy(MarkovBackend(table, "draft"))
    bounded = ModelDrafter(spy, catch_up=8)
    rng = random.Random(9)

    def propose(ids, k=4):
        spy.fed.clear()
        got = bounded.propose(ids, k, GREEDY).tokens.tolist()
        assert got == ModelDrafter(MarkovBackend(table, "full")).propose(ids, k, GREEDY).tokens.tolist()
        return got, spy.fed[0]

    ids = [rng.randrange(16) for _ in range(40)]
    bounded.prefill(ids[:-1])
    draft, fed = propose(ids)
    assert fed == 8 and spy.seq_len == 8 + 3  # the last 8 tokens, then the drafts but the last
    assert bounded.cached_prefix(ids) == 40  # nothing of ids left to feed: its first 32 are never fed
    ids += draft[:2] + [(draft[2] + 1) % 16]  # two accepted, a correction
    assert propose(ids)[1] == 1  # steady: only the correction (the accepted drafts are cached)
    ids += [rng.randrange(16) for _ in range(20)]  # a long plain run: more than 8 to catch up
    _, fed = propose(ids)
    assert fed == 8 and bounded.cached_prefix(ids) == len(ids)
    turn = ids + [1, 2, 3]  # the next turn of a conversation: it shares the window
    bounded.prefill(turn[:-1])
    assert propose(turn)[1] == 3
    other = [5, 6, 7, 8, 9]  # a new, short sequence: fed from its first token
    bounded.prefill(other[:-1])
    assert bounded.cached_prefix(other) == 0
    assert propose(other)[1] == 5
    with pytest.raises(ConfigError, match="catch-up bound must be >= 2"):
        ModelDrafter(spy, catch_up=1)
    assert ModelDrafter(Spy(MarkovBackend(table, "small", max_context=20)), catch_up=64).catch_up == 10  # half


def test_a_bounded_catch_up_keeps_drafting_past_a_short_draft_window_and_stays_lossless():
    """A draft model whose own context window (24) is shorter than the sequence: unbounded, it drafts nothing past
    its window; with catch_up=8 it restarts from the last 8 tokens and drafts on. Output = plain decoding."""
    table = markov_table(16, seed=3, scale=3.0)
    draft_table = table + 0.5 * torch.randn(table.shape, generator=torch.Generator().manual_seed(4))
    plain = SpeculativeEngine(MarkovBackend(table, "target"))
    cfg = GenerationConfig(max_new_tokens=60, ignore_eos=True)
    prompt = [random.Random(2).randrange(16) for _ in range(10)]
    expected = plain.generate(prompt, cfg).token_ids
    for catch_up in (None, 8):
        spy = Spy(MarkovBackend(draft_table, "draft", max_context=24))
        engine = SpeculativeEngine(MarkovBackend(table, "target"), ModelDrafter(spy, catch_up=catch_up),
                                   FixedController(3))
        result = engine.generate(prompt, cfg)
        assert result.token_ids == expected
        late = [s.drafted for s in result.stats.steps if s.context_len > 30]
        drafting = sum(1 for d in late if d) / len(late)
        # unbounded: nothing past the window; bounded: a full window restarts at once (no stall until it lags)
        assert drafting == 0 if catch_up is None else drafting > 0.9
        assert max(spy.fed) <= (catch_up or 24)


def test_a_bounded_catch_up_spread_over_feeds_starts_at_its_window():
    """``feed(ids, limit)`` (the batch engine's draft prefill by chunks) restarts a lagging cache at the window's
    first token and feeds the window in order; ``lag`` counts what the next proposal would feed."""
    table = markov_table(16, seed=8, scale=3.0)
    spy = Spy(MarkovBackend(table, "draft"))
    drafter = ModelDrafter(spy, catch_up=8)
    ids = [random.Random(4).randrange(16) for _ in range(30)]
    assert drafter.lag(ids) == 8
    for fed, lag in ((3, 5), (3, 2), (1, 1)):
        spy.fed.clear()
        drafter.feed(ids, 3)
        assert spy.fed == [fed] and drafter.lag(ids) == lag
    assert spy.inner.ids == ids[22:29]  # the window but its last token, which the proposal feeds
    spy.fed.clear()
    drafter.propose(ids, 2, GREEDY)
    assert spy.fed[0] == 1
    unbounded = ModelDrafter(Spy(MarkovBackend(table, "d2")))
    unbounded.feed(ids, 10)
    assert unbounded.lag(ids) == 20 and unbounded.backend.inner.ids == ids[:10]
