"""Sampling controls under speculation (issue 13): repetition/presence/frequency penalties, logit bias, min-p and
logprobs stay lossless: each verified row is processed with its own position's history."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import MarkovBackend, markov_table, tiny_model
from test_engine import chi2_pvalue, markov_reference

from adaspec.backends.torch_backend import TorchBackend
from adaspec.batch import BatchEngine
from adaspec.controllers import FixedController, make_controller
from adaspec.drafters.model import ModelDrafter
from adaspec.drafters.ngram import NgramDrafter
from adaspec.engine import GenerationConfig, SpeculativeEngine
from adaspec.errors import ConfigError
from adaspec.processors import LogitsControls
from adaspec.sampling import SamplingParams, logits_to_probs

CONTROLS = dict(repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.6, logit_bias={3: 2.5, 7: -100})


def test_each_verified_row_is_processed_with_its_own_history():
    torch.manual_seed(0)
    c = LogitsControls(**CONTROLS)
    logits = torch.randn(4, 16) * 3
    ids, prompt_len, drafts = [1, 2, 3, 3, 5, 9, 9], 3, torch.tensor([9, 4, 3])
    rows = c.apply(logits, ids, prompt_len, drafts)
    for i in range(4):
        alone = c.apply(logits[i:i + 1], ids + drafts[:i].tolist(), prompt_len)
        assert torch.equal(rows[i], alone[0])
    # by hand, row 2 (history: output 3, 5, 9, 9 then drafts 9, 4): token 9 seen 3 times in the output
    raw = logits[2, 9].item()
    rep = raw / 1.3 if raw > 0 else raw * 1.3
    assert rows[2, 9].item() == pytest.approx(rep - 0.4 - 0.6 * 3, abs=1e-5)
    raw = logits[2, 1].item()  # in the prompt only: repetition penalty, no presence/frequency
    assert rows[2, 1].item() == pytest.approx(raw / 1.3 if raw > 0 else raw * 1.3, abs=1e-5)
    raw = logits[0, 7].item()  # banned by the bias, never seen
    assert rows[0, 7].item() == pytest.approx(raw - 100, abs=1e-4)
    assert torch.equal(LogitsControls().apply(logits, ids, prompt_len, drafts), logits)


def test_a_penalty_near_zero_keeps_the_logits_finite():
    # Found by the server's fuzz: repetition_penalty 5e-324 divided a positive logit past the float range, the
    # softmax turned it into NaN and the logprobs could not be written as JSON (a 500).
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    out = LogitsControls(repetition_penalty=5e-324).apply(logits, [0, 1, 3], 1)
    big = torch.finfo(torch.float32).max
    assert out.tolist() == [[big, 0.0, 0.5, big]]  # a seen positive logit ends at the range, never inf
    assert torch.isfinite(torch.log_softmax(out, -1)).all()
    probs = logits_to_probs(out, SamplingParams(0.5))  # a temperature below 1 must not carry them to inf
    assert probs.tolist() == [[0.5, 0.0, 0.0, 0.5]]


@pytest.mark.parametrize("bad, needle", [({"presence_penalty": 2.5}, "presence_penalty"),
                                         ({"frequency_penalty": -3}, "frequency_penalty"),
                                         ({"repetition_penalty": 0}, "repetition_penalty"),
                                         ({"logit_bias": {5: 101}}, "logit_bias"),
                                         ({"min_p": 1.5}, "min_p"), ({"logprobs": 21}, "logprobs")])
def test_out_of_range_controls_name_the_parameter(bad, needle):
    with pytest.raises(ConfigError, match=needle):
        GenerationConfig(**bad)


def test_unknown_token_in_logit_bias_is_refused():
    engine = SpeculativeEngine(TorchBackend(tiny_model("qwen", seed=0, layers=1)))
    with pytest.raises(ConfigError, match="token id 64 is out of range"):
        engine.generate([1, 2, 3], GenerationConfig(logit_bias={64: 1.0}))


def test_min_p_keeps_tokens_above_a_fraction_of_the_top_one():
    probs = logits_to_probs(torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])), SamplingParams(1.0, min_p=0.25))
    assert probs.tolist() == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0])  # 0.05 < 0.25 x 0.5


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_greedy_speculation_with_controls_equals_plain_with_controls_and_logprobs_match(drafter):
    torch.set_num_threads(2)
    model, dmodel = tiny_model("qwen", seed=0), tiny_model("qwen", seed=0, layers=2)
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6] * 2
    cfg = GenerationConfig(max_new_tokens=30, ignore_eos=True, logprobs=3, prompt_logprobs=2, **CONTROLS)
    plain = SpeculativeEngine(TorchBackend(model)).generate(prompt, cfg)
    d = NgramDrafter() if drafter == "ngram" else ModelDrafter(TorchBackend(dmodel))
    spec = SpeculativeEngine(TorchBackend(model), d, FixedController(4)).generate(prompt, cfg)
    assert spec.token_ids == plain.token_ids and spec.stats.draft_tokens > 0
    if drafter == "model":  # (the penalties make the n-gram's repeats unlikely: its drafts are mostly rejected)
        assert spec.stats.accepted_tokens > 0
    uncontrolled = SpeculativeEngine(TorchBackend(model)).generate(prompt, GenerationConfig(max_new_tokens=30,
                                                                                            ignore_eos=True))
    assert uncontrolled.token_ids != plain.token_ids  # the controls changed the output
    assert 7 not in plain.token_ids  # banned by the bias
    assert [t.token_id for t in spec.logprobs] == spec.token_ids
    for a, b in zip(spec.logprobs, plain.logprobs):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
        assert [t for t, _ in a.top] == [t for t, _ in b.top] and len(a.top) == 3
        assert a.top[0][0] == a.token_id  # greedy: the chosen token is the most likely after the controls
    assert plain.prompt_logprobs[0] is None and len(plain.prompt_logprobs) == len(prompt)
    assert [p.token_id for p in plain.prompt_logprobs[1:]] == prompt[1:]
    assert all(p.logprob <= 0 and len(p.top) == 2 for p in plain.prompt_logprobs[1:])
    # the batched engine gives the same tokens and logprobs
    target = TorchBackend(model, max_sequences=2)
    engine = BatchEngine(target, (lambda seq: NgramDrafter()) if drafter == "ngram" else
                         (lambda seq: ModelDrafter(TorchBackend(dmodel, max_sequences=2).sequence(seq))),
                         lambda: make_controller("fixed", 4))
    batched = engine.generate([prompt, prompt[:7]], cfg)[0]
    assert batched.token_ids == plain.token_ids
    assert [x.logprob for x in batched.logprobs] == pytest.approx([x.logprob for x in plain.logprobs], abs=1e-4)


MV = 5


@pytest.mark.parametrize("variant", ["penalties", "bias_min_p"])
def test_sampling_with_controls_equals_the_target_law(variant):
    """Speculative sampling with the controls on: the joint law of the first 3 sampled tokens equals the exactly
    computed law of plain sampling with the same controls (chi-square)."""
    table = markov_table(MV, seed=0, scale=1.5)
    draft_table = table + torch.randn(table.shape, generator=torch.Generator().manual_seed(1))
    target = MarkovBackend(table, "target")
    prompt = [1, 2, 1, 2, 1]
    if variant == "penalties":
        kw = dict(temperature=1.0, repetition_penalty=1.5, presence_penalty=0.8, frequency_penalty=0.5)
    else:
        kw = dict(temperature=0.9, logit_bias={0: 1.5, 4: -2.0}, min_p=0.15, frequency_penalty=0.3)
    engine = SpeculativeEngine(target, ModelDrafter(MarkovBackend(draft_table, "draft")), FixedController(2))
    n = 3_000
    counts = np.zeros([MV] * 3, dtype=np.int64)
    drafted = accepted = 0
    for seed in range(n):
        r = engine.generate(prompt, GenerationConfig(max_new_tokens=3, seed=seed, ignore_eos=True, **kw))
        counts[tuple(r.token_ids)] += 1
        drafted += r.stats.draft_tokens
        accepted += r.stats.accepted_tokens
    assert 0 < accepted < drafted
    cfg = GenerationConfig(**kw)
    controls, params = cfg.controls, cfg.sampling

    def transform(ctx):
        prev2 = ctx[-2] if len(ctx) >= 2 else 0
        logits = controls.apply(target.table[prev2, ctx[-1]][None], ctx, len(prompt))[0]
        return logits_to_probs(logits, params)

    joint = markov_reference(target, prompt, 3, 1.0, transform)
    assert chi2_pvalue(counts, joint) > 1e-3
    # and the controls matter: the law without them is far from it (total variation), so the test has power
    plain_law = markov_reference(target, prompt, 3, 1.0,
                                 lambda ctx: logits_to_probs(target.table[ctx[-2], ctx[-1]], SamplingParams(1.0)))
    assert 0.5 * np.abs(joint - plain_law).sum() > 0.1


def test_draft_ids_outside_the_target_vocabulary_count_for_nothing():
    c = LogitsControls(frequency_penalty=1.0)
    logits = torch.zeros(3, 8)
    rows = c.apply(logits, [1, 2], 1, torch.tensor([12, 3]))  # 12: from a wider draft vocabulary
    assert rows[1].tolist() == [0.0, 0.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # only the output token 2 counts
    assert rows[2, 3].item() == -1.0 and rows[2, 2].item() == -1.0


@pytest.mark.parametrize("batched", [False, True])
def test_a_draft_model_following_the_controls_proposes_what_the_controlled_target_accepts(batched):
    """A draft equal to the target: with the controls it proposes exactly the controlled target's greedy tokens
    (every draft accepted); from raw logits it proposes the uncontrolled ones and is rejected where the controls
    change the argmax. The output is plain decoding's either way."""
    table = markov_table(MV, seed=2, scale=2.0)
    prompt = [1, 2, 1, 2, 1]
    cfg = GenerationConfig(max_new_tokens=40, ignore_eos=True, repetition_penalty=1.4, frequency_penalty=0.7,
                           logit_bias={3: -1.0})
    plain = SpeculativeEngine(MarkovBackend(table, "target")).generate(prompt, cfg)
    rates = {}
    for follow in (True, False):
        if batched:
            draft = MarkovBackend(table, "draft")
            engine = BatchEngine(MarkovBackend(table, "target"),
                                 lambda seq: ModelDrafter(draft, follow_controls=follow),
                                 lambda: make_controller("fixed", 4))
            out = engine.generate([prompt], cfg)[0]
        else:
            drafter = ModelDrafter(MarkovBackend(table, "draft"), follow_controls=follow)
            out = SpeculativeEngine(MarkovBackend(table, "target"), drafter, FixedController(4)).generate(prompt, cfg)
        assert out.token_ids == plain.token_ids
        rates[follow] = out.stats.accepted_tokens / out.stats.draft_tokens
    assert rates[True] == 1.0
    assert rates[False] < 0.8


def dense_reference(c: LogitsControls, logits: torch.Tensor, ids: list[int], prompt_len: int,
                    drafts: list[int]) -> torch.Tensor:
    """The controls computed the obvious way: row by row over the whole vocabulary (semantics in the module
    docstring of adaspec.processors)."""
    n, vocab = logits.shape
    out = logits.float().clone()
    for token, bias in c.logit_bias.items():
        if token < vocab:
            out[:, token] += bias
    for i in range(n):
        history = [t for t in ids[prompt_len:] + drafts[:i] if t < vocab]
        counts = torch.bincount(torch.tensor(history, dtype=torch.long), minlength=vocab).float()[:vocab] \
            if history else torch.zeros(vocab)
        row = out[i]
        if c.repetition_penalty != 1.0:
            seen = counts > 0
            for t in ids[:prompt_len]:
                if t < vocab:
                    seen[t] = True
            row = torch.where(seen, torch.where(row > 0, row / c.repetition_penalty, row * c.repetition_penalty),
                              row)
        if c.presence_penalty:
            row = row - c.presence_penalty * (counts > 0).float()
        if c.frequency_penalty:
            row = row - c.frequency_penalty * counts
        out[i] = row
    return out


@pytest.mark.parametrize("seed", range(40))
def test_sparse_controls_equal_the_full_vocabulary_computation(seed):
    """apply() works on the columns of tokens that occur; it equals the dense, row-by-row reference to the bit, with
    random controls, histories (repeats, ids beyond the vocabulary, an empty output) and drafts."""
    rng = np.random.default_rng(seed)
    vocab = 50
    c = LogitsControls(repetition_penalty=float(rng.choice([1.0, 0.8, 1.3])),
                       presence_penalty=float(rng.choice([0.0, -0.7, 1.1])),
                       frequency_penalty=float(rng.choice([0.0, 0.4, -1.5])),
                       logit_bias={int(t): float(rng.uniform(-100, 100)) for t in rng.integers(0, 60, 2)})
    prompt_len = int(rng.integers(0, 8))
    ids = rng.integers(0, 60, prompt_len + int(rng.integers(0, 12))).tolist()  # ids >= 50: a wider draft vocab
    drafts = rng.integers(0, 60, int(rng.integers(0, 6))).tolist()
    n = int(rng.integers(1, len(drafts) + 2))
    logits = torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * 3
    got = c.apply(logits, ids, prompt_len, torch.tensor(drafts, dtype=torch.long))
    assert torch.equal(got, dense_reference(c, logits, ids, prompt_len, drafts))


def test_the_prompt_cache_follows_the_prompt():
    """apply() keeps the last prompt's distinct tokens: a controls object used for other prompts in turn (batch rows
    sharing settings, n choices) still penalises each call's own prompt."""
    c = LogitsControls(repetition_penalty=1.5, frequency_penalty=0.5)
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(7))
    drafts = torch.tensor([5, 6])
    calls = [([1, 2, 3, 9], 3), ([4, 5, 6, 9], 3), ([1, 2, 3, 9], 3), ([1, 2, 3, 9, 11], 4), ([7, 7], 0)]
    for ids, prompt_len in calls:
        got = c.apply(logits, ids, prompt_len, drafts)
        assert torch.equal(got, dense_reference(c, logits, ids, prompt_len, drafts.tolist()))
    with pytest.raises(ValueError, match="only 2 drafts"):
        c.apply(torch.zeros(4, 40), [1, 2], 1, drafts)


def test_a_multi_drafter_passes_the_controls_to_its_draft_model():
    """The hybrid drafter (n-gram + draft model) is the default: its draft model must get the request's controls
    too (MultiDrafter.set_controls), else it proposes from raw logits."""
    from adaspec.drafters.multi import MultiDrafter

    table = markov_table(MV, seed=2, scale=2.0)
    prompt = [1, 2, 1, 2, 1]
    cfg = GenerationConfig(max_new_tokens=40, ignore_eos=True, repetition_penalty=1.4, frequency_penalty=0.7)
    plain = SpeculativeEngine(MarkovBackend(table, "target")).generate(prompt, cfg)
    multi = MultiDrafter({"draft": ModelDrafter(MarkovBackend(table, "draft"))})
    out = SpeculativeEngine(MarkovBackend(table, "target"), multi, FixedController(4)).generate(prompt, cfg)
    assert out.token_ids == plain.token_ids
    assert out.stats.draft_tokens > 0 and out.stats.accepted_tokens == out.stats.draft_tokens
