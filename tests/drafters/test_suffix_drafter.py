"""The suffix drafter: lossless, learns across requests, commits only finished responses, keeps partitions apart."""

from __future__ import annotations

import pytest
import torch

from adaspec.backends import TorchBackend
from adaspec.batch import BatchEngine
from adaspec.controllers import make_controller
from adaspec.drafters import ModelDrafter, MultiDrafter
from adaspec.drafters.suffix import SuffixDrafter, suffix_from_spec, with_own_cache
from adaspec.engine import GenerationConfig, SpeculativeEngine
from adaspec.errors import ConfigError
from adaspec.sampling import SamplingParams

GREEDY = SamplingParams()
PROMPTS = [[3, 9, 4, 17, 5, 22, 9, 4, 30], [8, 8, 41, 2, 7, 19, 33, 2, 7, 12, 40], [5, 6, 7, 5, 6, 7, 5, 6]]


def cfg(n: int = 40, **kw) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=n, ignore_eos=True, **kw)


@pytest.fixture(scope="module")
def plain_out(qwen):
    engine = SpeculativeEngine(TorchBackend(qwen, "t"))
    return [engine.generate(p, cfg()).token_ids for p in PROMPTS]


def engine_with(qwen, drafter, k: int | str = 4) -> SpeculativeEngine:
    ctrl = make_controller("fixed", k) if isinstance(k, int) else make_controller(k)
    return SpeculativeEngine(TorchBackend(qwen, "t"), drafter, ctrl)


@pytest.mark.parametrize("controller", [4, "goodput"])
def test_greedy_output_is_plain_with_an_empty_and_a_warm_cache(qwen, plain_out, controller):
    engine = engine_with(qwen, SuffixDrafter(), controller)
    for _ in range(2):  # the second round drafts from the first round's answers
        assert [engine.generate(p, cfg()).token_ids for p in PROMPTS] == plain_out
    assert engine.drafter.cache.responses == 2 * len(PROMPTS)


def test_greedy_token_trees_are_plain(qwen, plain_out):
    engine = engine_with(qwen, SuffixDrafter())
    outs = [[engine.generate(p, cfg(tree_budget=8, tree_choice="always")) for p in PROMPTS] for _ in range(2)]
    assert [r.token_ids for r in outs[1]] == plain_out
    assert any(s.tree for r in outs[1] for s in r.stats.steps)  # trees were verified, not only chains


def test_sampled_requests_are_cached_too(qwen):
    """Sampling verifies a lookup's proposal with the exact rule and a one-hot q (``Draft.probs`` is None)."""
    engine = engine_with(qwen, SuffixDrafter())
    r = engine.generate(PROMPTS[0], cfg(temperature=1.0, seed=3))
    assert len(r.token_ids) == 40 and engine.drafter.cache.tokens == 40 + engine.drafter.context_tokens
    engine.drafter.prefill(PROMPTS[0])
    assert engine.drafter.propose(PROMPTS[0] + r.token_ids[:3], 4, SamplingParams(temperature=1.0)).probs is None


def test_a_repeated_request_drafts_what_the_first_one_wrote(qwen):
    cold = engine_with(qwen, SuffixDrafter()).generate(PROMPTS[1], cfg())
    warm_engine = engine_with(qwen, SuffixDrafter())
    first = warm_engine.generate(PROMPTS[1], cfg())
    second = warm_engine.generate(PROMPTS[1], cfg())
    assert first.token_ids == second.token_ids == cold.token_ids
    a_cold = cold.stats.accepted_tokens / max(cold.stats.draft_tokens, 1)
    a_warm = second.stats.accepted_tokens / second.stats.draft_tokens
    assert a_warm >= 0.9 > a_cold  # measured here: every draft of the repeat is the first answer's text
    assert second.stats.new_tokens / len([s for s in second.stats.steps]) > 3  # several tokens per forward


def test_the_proposal_comes_from_the_cached_response():
    d = SuffixDrafter(context_tokens=2)
    d.prefill([1, 2, 3])
    d.finish([1, 2, 3, 10, 11, 12, 13, 14, 15])
    d.prefill([7, 8, 9])
    draft = d.propose([7, 8, 9, 10, 11, 12], 8, GREEDY)  # matches "10 11 12" (3 tokens): up to 3 drafted
    assert draft.tokens.tolist() == [13, 14, 15] and d.last_match == 3
    assert d.propose([7, 8, 9, 10], 8, GREEDY).tokens.tolist() == [11]  # a 1-token match drafts 1 (factor 1)
    assert d.available([7, 8, 9, 10, 11, 12]) == 3
    d.prefill([7, 2, 3])  # the prompt's last tokens were cached in front of the response: the match is 3 long
    assert d.propose([7, 2, 3, 10], 8, GREEDY).tokens.tolist() == [11, 12, 13]


def test_frequencies_pick_the_common_continuation_and_min_prob_cuts():
    d = SuffixDrafter(min_token_prob=0.5, context_tokens=0)
    for tail in ([5, 6], [5, 6], [5, 7]):  # after "4" came 5 three times; then 6 twice, 7 once
        d.prefill([0])
        d.finish([0, 1, 4, *tail])
    d.prefill([9])
    assert d.propose([9, 1, 4], 4, GREEDY).tokens.tolist() == [5, 6]  # p(5)=1, p(5,6)=2/3
    strict = d.with_partition("")
    strict.min_token_prob = 0.9
    strict.prefill([9])
    assert strict.propose([9, 1, 4], 4, GREEDY).tokens.tolist() == [5]  # 2/3 < 0.9: the path stops


def test_a_cancelled_request_leaves_nothing_in_the_cache(qwen):
    engine = engine_with(qwen, SuffixDrafter())
    chunks = engine.stream(PROMPTS[0], cfg())
    next(chunks), next(chunks), next(chunks)
    chunks.close()  # the client left
    assert engine.drafter.cache.tokens == 0
    engine.generate(PROMPTS[2], cfg(8))
    assert engine.drafter.cache.tokens == 8 + engine.drafter.context_tokens  # only the finished one
    engine.warmup(list(range(20)), steps=6)  # a warm-up's text is no response
    assert engine.drafter.cache.responses == 1


def test_partitions_never_draft_from_each_other():
    alice = SuffixDrafter(context_tokens=0)
    bob = alice.with_partition("bob")
    alice.prefill([1])
    alice.finish([1, 20, 21, 22, 23, 24])
    for d, expected in ((bob, []), (alice.with_partition(""), [23, 24])):
        d.prefill([2])
        assert d.propose([2, 20, 21, 22], 4, GREEDY).tokens.tolist() == expected
    assert alice.cache is bob.cache  # one cache, one budget


def test_batched_rows_share_one_cache_and_stay_plain(qwen, plain_out):
    suffix = SuffixDrafter()
    batch = BatchEngine(TorchBackend(qwen, "t", max_sequences=2), suffix.for_sequence,
                        lambda: make_controller("fixed", 3), max_batch=2)
    for _ in range(2):
        assert [r.token_ids for r in batch.generate(PROMPTS, cfg())] == plain_out
    assert suffix.cache.responses == 2 * len(PROMPTS)


def test_inside_a_multi_drafter_it_learns_and_stays_plain(qwen, plain_out):
    from adaspec.backends import truncated_layers

    suffix = SuffixDrafter()
    multi = MultiDrafter({"suffix": suffix, "draft": ModelDrafter(TorchBackend(truncated_layers(qwen, 2), "d"))})
    engine = engine_with(qwen, multi, "goodput")
    for _ in range(2):
        assert [engine.generate(p, cfg()).token_ids for p in PROMPTS] == plain_out
    assert suffix.cache.responses == 2 * len(PROMPTS)
    assert multi.options(PROMPTS[0] + plain_out[0][:5])["suffix"] > 0


def test_with_own_cache_separates_methods():
    a = SuffixDrafter(max_tokens=50)
    b = with_own_cache(a)
    assert b.cache is not a.cache and b.cache.max_tokens == 50
    m = MultiDrafter({"suffix": a})
    assert with_own_cache(m).drafters["suffix"].cache is not a.cache


def test_memory_per_cached_token_is_reported_and_bounded(qwen):
    engine = engine_with(qwen, SuffixDrafter(max_tokens=100, max_depth=16))
    for p in PROMPTS * 2:
        engine.generate(p, cfg())
    cache = engine.drafter.cache
    assert cache.tokens <= 100 and cache.evicted > 0
    assert 0 < cache.bytes_per_token() < 16 * 300  # <= max_depth nodes per token


def test_spec_parsing():
    d = suffix_from_spec("suffix:depth=32,tokens=500;factor=2,prob=0.2;match=2,context=0")
    assert (d.max_depth, d.cache.max_tokens, d.max_spec_factor, d.min_token_prob, d.min_match,
            d.context_tokens) == (32, 500, 2.0, 0.2, 2, 0)
    for bad, field in (("suffix:size=3", "KEY=VALUE"), ("suffix:depth=x", "depth must be int"),
                       ("suffix:depth=99", "max_depth"), ("suffix:prob=2", "min_token_prob")):
        with pytest.raises(ConfigError, match=field):
            suffix_from_spec(bad)


def test_consult_stop_lets_the_controller_price_each_token_by_its_frequency():
    d = suffix_from_spec("suffix:factor=8,prob=0,context=0,stop=1")
    for tail in ([5, 6, 8], [5, 6, 8], [5, 7, 8]):  # after "1 4": 5 always, then 6 two times in three, then 8
        d.prefill([0])
        d.finish([0, 1, 4, *tail])
    asked = []

    def stop(position, probs, token):
        asked.append((position, round(float(probs[token]), 3)))
        return float(probs[token]) < 0.9  # the draft ends after the first token below 0.9

    d.prefill([9])
    assert d.propose([9, 1, 4], 8, GREEDY, stop=stop).tokens.tolist() == [5, 6]
    assert asked == [(0, 1.0), (1, 0.667)]  # each token's frequency given the ones before
    assert d.propose([9, 1, 4], 8, GREEDY).tokens.tolist() == [5, 6, 8]  # no stop rule: the whole chain
    rule = d.with_partition("")
    rule.consult_stop = False  # the paper's rule alone never asks
    rule.prefill([9])
    assert rule.propose([9, 1, 4], 8, GREEDY, stop=stop).tokens.tolist() == [5, 6, 8] and len(asked) == 2
    with pytest.raises(ConfigError, match="stop must be 0 or 1"):
        suffix_from_spec("suffix:stop=maybe")


def test_priced_by_the_goodput_controller_it_stays_plain(qwen, plain_out):
    engine = engine_with(qwen, suffix_from_spec("suffix:factor=16,prob=0,stop=1"), "goodput")
    for _ in range(2):
        assert [engine.generate(p, cfg()).token_ids for p in PROMPTS] == plain_out
    assert engine.controller.stoppable  # the controller's stop rule priced the suffix drafter's tokens


def test_make_drafter_knows_suffix():
    from adaspec.api import make_drafter
    from adaspec.spec_setting import builtin_drafter

    assert builtin_drafter("suffix") and builtin_drafter("suffix:tokens=10")
    assert isinstance(make_drafter("suffix", None), SuffixDrafter)
    torch.manual_seed(0)


def test_a_new_request_never_reuses_the_last_requests_answer():
    """``available`` and ``propose`` of one step share one lookup; a request of the same length ending in the same
    token (or a cache that changed) must not get the old one."""
    d = SuffixDrafter(context_tokens=0)
    d.prefill([1, 2])
    assert d.propose([1, 2, 3, 4, 1, 2, 3], 4, GREEDY).tokens.tolist() == [4, 1, 2]  # "1 2 3" matched: 3 tokens
    assert d.available([1, 2, 3, 4, 1, 2, 3]) == 3
    assert d.propose([1, 2, 3, 4, 1, 2, 3], 2, GREEDY).tokens.tolist() == [4, 1]  # K caps it
    d.prefill([5, 6])
    assert d.propose([5, 6, 7, 8, 9, 9, 3], 4, GREEDY).tokens.tolist() == []  # nothing of it occurred before
    d.finish([5, 6, 7, 8, 9, 9, 3, 30, 31])
    d.prefill([5, 6])
    assert d.propose([5, 6, 7, 8, 9, 9, 3], 4, GREEDY).tokens.tolist() == [30, 31]


def test_a_long_copy_uses_the_match_length_that_allows_the_longest_proposal():
    """Every match length of a copied span has the same occurrences; the trie holds max_depth tokens from a match's
    start, so the longest match (20 here) would leave 4 tokens, while m = 12 allows 12 (factor 1, depth 24)."""
    d = SuffixDrafter(context_tokens=0)
    d.prefill([1])
    d.finish([1, *range(100, 140)])
    d.prefill([2])
    draft = d.propose([2, *range(100, 120)], 16, GREEDY)
    assert draft.tokens.tolist() == list(range(120, 132)) and d.last_match == 12
