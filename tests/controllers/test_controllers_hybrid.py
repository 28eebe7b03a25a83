"""Per-step drafter choice (MultiDrafter + route) and the new controllers inside the engine: greedy output equals
plain decoding, sampled output keeps the target's distribution, and records name the sub-drafter used."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from adaspec.backends import TorchBackend, truncated_layers
from adaspec.controllers import (BanditController, EntropyController, FixedController, GoodputController,
                                 make_controller)
from adaspec.drafters import Draft, Drafter, ModelDrafter, MultiDrafter, NgramDrafter
from adaspec.drafters.base import empty_draft
from adaspec.drafters.multi import cached_prefixes, route
from adaspec.engine import GenerationConfig, SpeculativeEngine
from adaspec.errors import ConfigError
from adaspec.sampling import SamplingParams

from conftest import MarkovBackend, markov_table
from test_engine import chi2_pvalue, markov_reference

GREEDY = SamplingParams()


class Scripted(Drafter):
    """Proposes ``[token] * k`` (nothing when ``token`` is None); counts prefill calls."""

    def __init__(self, name: str, token: int | None) -> None:
        self.name, self.token, self.prefills = name, token, 0

    def prefill(self, prompt_ids):
        self.prefills += 1

    def propose(self, ids, k, sampling, generator=None, stop=None):
        return empty_draft() if self.token is None else Draft(torch.full((k,), self.token, dtype=torch.long))


# MultiDrafter ------------------------------------------------------------------------------------------------
def test_fallback_order_uses_the_first_drafter_with_a_proposal():
    multi = MultiDrafter({"ngram": NgramDrafter(min_ngram=2), "model": Scripted("model", 7)})
    multi.prefill([1, 2, 3])
    no_match = multi.propose([1, 2, 3, 4], 3, GREEDY)
    assert no_match.tokens.tolist() == [7, 7, 7] and no_match.source == "model"
    match = multi.propose([1, 2, 3, 4, 1, 2], 3, GREEDY)
    assert match.tokens.tolist() == [3, 4, 1] and match.source == "ngram"
    assert multi.name == "ngram+model"


def test_options_select_and_route():
    multi = MultiDrafter({"ngram": NgramDrafter(min_ngram=2), "model": Scripted("model", 7)})
    multi.prefill([5, 6])
    assert multi.options([5, 6, 8, 5, 6]) == {"ngram": 3, "model": None}  # match (5, 6) → continuation [8, 5, 6]
    assert multi.options([5, 6, 9]) == {"ngram": 0, "model": None}
    multi.select("model")
    assert multi.propose([5, 6, 8, 5, 6], 2, GREEDY).source == "model"  # routed: no fallback order
    assert multi.propose([5, 6, 8, 5, 6], 2, GREEDY).source == "ngram"  # the selection lasts one proposal
    multi.select(None)
    assert len(multi.propose([5, 6, 8, 5, 6], 2, GREEDY)) == 0
    with pytest.raises(ConfigError):
        multi.select("bogus")

    class Chooser(FixedController):  # a controller that routes: it overrides choose_drafter
        def __init__(self):
            super().__init__(2)
            self.seen = None

        def choose_drafter(self, options):
            self.seen = dict(options)
            return "ngram"

    chooser = Chooser()
    route(multi, chooser, [5, 6, 8, 5, 6])
    assert chooser.seen == {"ngram": 3, "model": None}
    assert multi.propose([5, 6, 8, 5, 6], 4, GREEDY).source == "ngram"
    route(multi, FixedController(3), [1])  # no choose_drafter: nothing happens
    route(NgramDrafter(), chooser, [1])  # not a MultiDrafter: nothing happens
    with pytest.raises(ConfigError):
        MultiDrafter({})


def test_lazy_prefill_only_for_drafters_that_are_used():
    a, b = Scripted("a", None), Scripted("b", 3)
    multi = MultiDrafter({"a": a, "b": b})
    multi.prefill([1, 2])
    assert a.prefills == b.prefills == 0
    multi.select("a")
    multi.propose([1, 2], 2, GREEDY)
    assert (a.prefills, b.prefills) == (1, 0)
    multi.propose([1, 2, 3], 2, GREEDY)  # fallback: a proposes nothing, b is prefilled and used
    multi.propose([1, 2, 3, 4], 2, GREEDY)
    assert (a.prefills, b.prefills) == (1, 1)
    multi.prefill([1])  # a new request
    assert (a.prefills, b.prefills) == (1, 1)
    eager = MultiDrafter({"a": a, "b": b}, lazy_prefill=False)
    eager.prefill([1])
    assert (a.prefills, b.prefills) == (2, 2)


def test_cached_prefixes_per_sub_drafter():
    model = ModelDrafter(MarkovBackend(markov_table(8, seed=0), "draft"))
    multi = MultiDrafter({"ngram": NgramDrafter(), "draft": model, "s": Scripted("s", 1)})
    ids = [1, 2, 3, 4, 5]
    assert cached_prefixes(multi, ids) == {"ngram": 5, "draft": 0, "s": 0}  # lookup needs no feeding; cold cache
    multi.prefill(ids)
    multi.select("draft")
    multi.propose(ids, 3, GREEDY)  # feeds ids and two of its three drafts
    assert cached_prefixes(multi, [1, 2, 3, 9]) == {"ngram": 4, "draft": 3, "s": 0}
    held = model.cached_prefix(ids + [0])  # ids, and the first draft if it was 0
    assert held >= 5 and cached_prefixes(model, ids + [0]) == {"draft": held}  # a single drafter, by its name
    assert cached_prefixes(NgramDrafter(), ids) == {"ngram": 5}


# In the engine -----------------------------------------------------------------------------------------------
def hybrid(model) -> MultiDrafter:
    trunc = ModelDrafter(TorchBackend(truncated_layers(model, 2), "trunc"))
    return MultiDrafter({"ngram": NgramDrafter(max_ngram=4, min_ngram=2), "trunc": trunc})


NEW_CONTROLLERS = ["goodput", "bandit", "confidence", "entropy"]


@pytest.fixture(scope="module")
def plain_qwen(qwen):
    prompt = [3, 17, 42, 5, 9, 9, 12, 3, 17, 42, 5]
    engine = SpeculativeEngine(TorchBackend(qwen, "qwen"), None, None)
    return prompt, engine.generate(prompt, GenerationConfig(max_new_tokens=48, ignore_eos=True)).token_ids


@pytest.mark.parametrize("controller,drafter", list(itertools.product(NEW_CONTROLLERS + ["fixed", "adaptive"],
                                                                      ["hybrid", "trunc"])))
def test_greedy_output_equals_plain(qwen, plain_qwen, controller, drafter):
    prompt, plain = plain_qwen
    d = hybrid(qwen) if drafter == "hybrid" else ModelDrafter(TorchBackend(truncated_layers(qwen, 2), "trunc"))
    engine = SpeculativeEngine(TorchBackend(qwen, "qwen"), d, make_controller(controller, 3 if controller ==
                                                                                "fixed" else None))
    engine.warmup()
    for _ in range(2):  # twice: controller state carried across requests
        r = engine.generate(prompt, GenerationConfig(max_new_tokens=48, ignore_eos=True))
        assert r.token_ids == plain
    names = {s.drafter for s in r.stats.steps if s.drafted}
    assert names <= ({"ngram", "trunc"} if drafter == "hybrid" else {"trunc"})
    assert all(s.drafter == "" for s in r.stats.steps if not s.drafted)


def test_goodput_with_a_perfect_lookup_prefers_it(qwen, plain_qwen):
    """Output that repeats the prompt verbatim: n-gram matches are always right and free."""
    prompt, plain = plain_qwen
    looped = prompt + plain + prompt  # the continuation of ``looped`` is ``plain`` again (after the prompt)
    engine = SpeculativeEngine(TorchBackend(qwen, "qwen"), hybrid(qwen), GoodputController())
    engine.warmup()
    r = engine.generate(looped, GenerationConfig(max_new_tokens=40, ignore_eos=True))
    plain_r = SpeculativeEngine(TorchBackend(qwen, "qwen")).generate(looped, GenerationConfig(max_new_tokens=40,
                                                                                                ignore_eos=True))
    assert r.token_ids == plain_r.token_ids
    used = [s.drafter for s in r.stats.steps if s.drafted]
    assert used.count("ngram") >= 1


@pytest.mark.parametrize("variant", ["hybrid_entropy", "goodput", "bandit"])
def test_sampling_output_distribution_equals_target(variant):
    """As in test_engine: the joint law of sampled tokens equals the target's exact law (chi-square)."""
    mv = 5
    table = markov_table(mv, seed=0, scale=1.5)
    draft_table = table + torch.randn(table.shape, generator=torch.Generator().manual_seed(1))
    target = MarkovBackend(table, "target")
    model = ModelDrafter(MarkovBackend(draft_table, "draft"))
    prompt = [1, 2, 1, 2, 1]
    if variant == "hybrid_entropy":
        drafter, controller = MultiDrafter({"ngram": NgramDrafter(), "draft": model}), EntropyController(k_max=3)
    elif variant == "goodput":
        drafter, controller = MultiDrafter({"ngram": NgramDrafter(), "draft": model}), GoodputController(k_max=3)
    else:
        drafter, controller = model, BanditController(ks=(1, 3))
    engine = SpeculativeEngine(target, drafter, controller)
    counts = np.zeros([mv] * 4, dtype=np.int64)
    sources = set()
    n = 2000
    for seed in range(n):
        r = engine.generate(prompt, GenerationConfig(max_new_tokens=4, seed=seed, ignore_eos=True, temperature=1.0))
        counts[tuple(r.token_ids)] += 1
        sources |= {s.drafter for s in r.stats.steps if s.drafted}
    if variant != "bandit":
        assert sources == {"ngram", "draft"}
    ref = markov_reference(MarkovBackend(table), prompt, 3, 1.0)
    assert chi2_pvalue(counts.sum(axis=3), ref) > 1e-3
