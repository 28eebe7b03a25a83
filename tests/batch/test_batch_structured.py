"""Structured output in the batch engine (adaspec.batch with adaspec.constrained): each constrained row of a batch
equals constrained plain decoding of its request alone, token for token (greedy, fp32), beside free rows and rows
whose grammar finishes first; sampled rows follow the masked target distribution exactly (chi-square on a
multi-sequence Markov target). The 64-token character vocabulary is test_structured's."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from adaspec.backends import TorchBackend, truncated_layers
from adaspec.backends.base import BatchRow
from adaspec.batch import BatchEngine
from adaspec.controllers import FixedController
from adaspec.drafters import ModelDrafter, NgramDrafter
from adaspec.drafters.forced import ForcedDrafter
from adaspec.drafters.multi import MultiDrafter
from adaspec.engine import GenerationConfig, SpeculativeEngine
from adaspec.errors import ConfigError
from adaspec.structured import Constraint, GrammarVocab

from conftest import MarkovBackend, markov_table
from test_structured import (EOS, SCHEMA, TOKENS, FixedQDrafter, RecordingLookup, RecordingRouter, exact_joint,
                             text_of)
from test_verify import assert_matches

CONSTRAINTS = [dict(json_schema=SCHEMA), dict(regex=r"[0-9]{2}x"), dict(response_format="json_object"), {},
               dict(grammar='start: "[" NUM (", " NUM)+ "]"\nNUM: /[0-9]{2}/')]
PROMPTS = [[1, 2, 3, 4, 5], [10, 20, 30, 10, 20, 30], [40, 41, 42], [7, 8, 9, 7, 8, 9, 7], [50, 51, 52, 53]]


@pytest.fixture(scope="module")
def vocab() -> GrammarVocab:
    return GrammarVocab.from_tokens(TOKENS, [EOS])


def _batch(target, drafter_for, k: int, vocab, max_batch: int) -> BatchEngine:
    engine = BatchEngine(target, drafter_for, (lambda: FixedController(k)) if drafter_for is not None else None,
                         eos_token_ids=[EOS], max_batch=max_batch)
    engine.grammar_vocab = vocab
    return engine


def _plain(model, vocab, prompt, cfg):
    engine = SpeculativeEngine(TorchBackend(model, "qwen"), eos_token_ids=[EOS])
    engine.grammar_vocab = vocab
    return engine.generate(prompt, cfg)


@pytest.mark.parametrize("kind", ["ngram", "trunc", "forced"])
def test_batched_constrained_rows_equal_constrained_plain(models, vocab, kind):
    """Five requests through three rows (two join as others leave): four under different grammars, one free; the
    regex row's grammar ends after three tokens while the others go on. Every row is constrained plain decoding of
    its request alone, token for token."""
    model = models["qwen"]
    target = TorchBackend(model, "qwen", max_sequences=3)
    if kind == "trunc":
        draft = TorchBackend(truncated_layers(model, 2), "trunc", max_sequences=3)
        drafter_for = ModelDrafter(draft).for_sequence
    else:
        drafter_for = {"ngram": NgramDrafter().for_sequence, "forced": ForcedDrafter(None).for_sequence}[kind]
    engine = _batch(target, drafter_for, 4, vocab, 3)
    configs = [GenerationConfig(max_new_tokens=32, **c) for c in CONSTRAINTS]
    results = engine.generate(PROMPTS, configs)
    for prompt, cfg, got in zip(PROMPTS, configs, results):
        want = _plain(model, vocab, prompt, cfg)
        assert got.token_ids == want.token_ids, (kind, cfg.constraint)
        assert got.finish_reason == want.finish_reason
        if cfg.constraint is not None:
            state = vocab.compile(cfg.constraint).start()
            state.advance(got.token_ids)  # every token is allowed by the grammar
            assert got.finish_reason == "length" or state.accepting
            assert got.stats.grammar_ms > 0
    regex = results[1]
    assert regex.finish_reason == "stop" and text_of(regex.token_ids)[-1] == "x" and len(regex.token_ids) == 3
    assert max(s.batch for r in results for s in r.stats.steps) == 3  # the rows did share forwards
    assert sum(r.stats.draft_tokens for r in results) > 0
    if kind == "forced":  # forced drafts only: on the constrained rows, drafted and all accepted; none on the free
        assert results[3].stats.draft_tokens == 0
        assert all(r.stats.accepted_tokens > 0 for r in (results[0], results[4]))


def test_forced_drafts_in_a_batch_are_certain_and_uncounted_by_the_controller(models, vocab):
    """Single-character forced runs under a regex: accepted with α = 1 in a batch as alone; the row's controller
    sees plain steps (its wrapped drafter drafted nothing)."""
    seen = []

    class Recording(FixedController):
        def update(self, step):
            seen.append(step)
            super().update(step)

    target = TorchBackend(models["qwen"], "qwen", max_sequences=2)
    engine = BatchEngine(target, ForcedDrafter(None).for_sequence, lambda: Recording(8), eos_token_ids=[EOS])
    engine.grammar_vocab = vocab
    cfg = GenerationConfig(max_new_tokens=20, regex="xyz[0-9]{3}wvu")
    free = GenerationConfig(max_new_tokens=12, ignore_eos=True)
    constrained, other = engine.generate([[1, 2, 3], [4, 5, 6]], [cfg, free])
    assert text_of(constrained.token_ids)[:3] == "xyz" and text_of(constrained.token_ids)[-3:] == "wvu"
    assert constrained.finish_reason == "stop" and len(other.token_ids) == 12
    assert constrained.stats.draft_tokens == 5 and constrained.stats.accepted_tokens == 5
    assert seen and all(s.drafted == 0 for s in seen)


def test_a_batch_row_plans_behind_its_forced_tokens_and_its_lookups_match_after_them(models, vocab):
    """As the engine alone: each row's controller is told the row's forced tokens before it chooses K, its lookups
    are asked on the row's sequence with them appended, and the steps it sees count them in ``forced``."""
    controllers, lookup = [], RecordingLookup()

    def controller():
        controllers.append(RecordingRouter(4))
        return controllers[-1]

    target = TorchBackend(models["qwen"], "qwen", max_sequences=2)
    engine = BatchEngine(target, MultiDrafter({"lookup": lookup}).for_sequence, controller, eos_token_ids=[EOS])
    engine.grammar_vocab = vocab
    constrained, other = engine.generate([[1, 2, 3], [4, 5, 6]], [
        GenerationConfig(max_new_tokens=20, regex="xyz[0-9]{3}wvu"), GenerationConfig(max_new_tokens=8, ignore_eos=True)])
    out = text_of(constrained.token_ids)
    assert out[:3] == "xyz" and out[-3:] == "wvu" and constrained.finish_reason == "stop"
    told = [n for c in controllers for n in c.told]
    seen = [s for c in controllers for s in c.seen]
    assert 2 in told and 3 in told and set(told) <= {0, 2, 3}
    assert sorted(s.forced for s in seen if s.forced) == [2, 3] and all(s.drafted == 0 for s in seen)
    assert text_of([1, 2, 3]) + "xyz" in lookup.offered and text_of([1, 2, 3]) + out in lookup.offered


def test_a_bad_grammar_is_refused_before_the_batch_and_max_tokens_is_length(models, vocab):
    engine = _batch(TorchBackend(models["qwen"], "qwen", max_sequences=2), NgramDrafter().for_sequence, 3, vocab, 2)
    with pytest.raises(ConfigError, match="objectx"):
        engine.add([1, 2, 3], GenerationConfig(json_schema={"type": "objectx"}))
    assert not engine  # nothing was queued
    no_tokenizer = BatchEngine(TorchBackend(models["qwen"], "qwen", max_sequences=2))
    with pytest.raises(ConfigError, match="tokenizer"):
        no_tokenizer.add([1, 2], GenerationConfig(regex="a+"))
    cut, = engine.generate([[1, 2, 3]], GenerationConfig(max_new_tokens=6, json_schema=SCHEMA))
    assert cut.finish_reason == "length" and len(cut.token_ids) == 6


# Sampling: the masked target distribution, exactly, in a batch ----------------------------------------------------
class MultiMarkov(MarkovBackend):
    """:class:`MarkovBackend` holding several sequences (one ``ids`` list each) for :class:`BatchEngine`."""

    def __init__(self, table: torch.Tensor, sequences: int) -> None:
        super().__init__(table)
        self.max_sequences = sequences
        self.seqs: list[list[int]] = [[] for _ in range(sequences)]

    def forward_batch(self, rows: Sequence[BatchRow]) -> list[torch.Tensor]:
        self.check_rows(rows)
        out = []
        for r in rows:
            self.ids = self.seqs[r.seq]
            out.append(self.forward(r.input_ids, r.num_logits))
        return out

    def seq_len_of(self, seq: int) -> int:
        return len(self.seqs[seq])

    def truncate_seq(self, seq: int, length: int) -> None:
        del self.seqs[seq][length:]


def test_batched_constrained_sampling_matches_masked_target(vocab):
    """Four sampled rows at a time, each with a drafter whose q puts mass on tokens the grammar forbids (cut, with
    the residual drawn at the cut): the first three tokens follow constrained plain sampling exactly."""
    table = markov_table(64, seed=5, scale=1.5)
    constraint = Constraint.regex("[a-d]{2}[a-z]?x[0-9]")
    prompt = [TOKENS.index(b"a"), TOKENS.index(b"b"), TOKENS.index(b"a"), TOKENS.index(b"b")]
    exact = exact_joint(table, vocab, constraint, prompt, 3)
    q = torch.zeros(64)
    q[[TOKENS.index(c.encode()) for c in "abcdefgx{"] + [TOKENS.index(b"ab"), TOKENS.index(b"cd")]] = 1.0
    q /= q.sum()
    engine = _batch(MultiMarkov(table, 4), lambda seq: FixedQDrafter(q), 3, vocab, 4)
    n = 2000
    results = engine.generate([prompt] * n, [GenerationConfig(max_new_tokens=3, temperature=1.0, seed=seed,
                                                              regex=constraint.source) for seed in range(n)])
    assert sum(r.stats.draft_tokens for r in results) > 0
    assert max(s.batch for r in results for s in r.stats.steps) == 4
    counts: dict[tuple[int, ...], int] = {}
    for r in results:
        key = tuple(r.token_ids[:3])
        counts[key] = counts.get(key, 0) + 1
    keys = sorted(set(exact) | set(counts))
    assert_matches(np.array([counts.get(k, 0) for k in keys]), np.array([exact.get(k, 0.0) for k in keys]),
                   "batched constrained sampling: first three tokens")


# The real small model (slow) ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_smollm2_batched_structured_rows_equal_constrained_plain():
    """smollm2-135m-instruct (fp32, its tokenizer): a JSON-schema row, a regex row and a free row decoding together
    with prompt lookup and forced drafts each equal constrained plain decoding alone."""
    from adaspec.api import SpeculativeLM, load_model

    torch.set_num_threads(2)
    batched = load_model("smollm2-135m-instruct", backend="torch", dtype="float32", progress=False, max_sequences=3)
    alone = load_model("smollm2-135m-instruct", backend="torch", dtype="float32", progress=False)
    tok = alone.tokenizer
    schema = {"type": "object", "additionalProperties": False, "required": ["city", "population"],
              "properties": {"city": {"type": "string"}, "population": {"type": "integer"}}}
    lm = SpeculativeLM(alone, None, FixedController(0))
    prompts = [lm.encode(p) for p in ("Paris has 2.1 million inhabitants. Give its facts as JSON.",
                                      "Write today's date.", "Tell me about Berlin.")]
    configs = [GenerationConfig(max_new_tokens=40, json_schema=schema),
               GenerationConfig(max_new_tokens=16, regex=r"\d{4}-\d{2}-\d{2}"), GenerationConfig(max_new_tokens=30)]
    batch = BatchEngine(batched.backend, NgramDrafter().for_sequence, lambda: FixedController(4),
                        tokenizer=batched.tokenizer, max_batch=3)
    plain = SpeculativeEngine(alone.backend, tokenizer=tok)
    got = batch.generate(prompts, configs)
    for prompt, cfg, result in zip(prompts, configs, got):
        assert result.token_ids == plain.generate(prompt, cfg).token_ids, cfg.constraint
    if got[0].finish_reason == "stop":
        assert set(json.loads(got[0].text)) == {"city", "population"}


def test_lazy_rows_in_a_batch_equal_lazy_plain(models):
    """A lazy grammar (free until its trigger) in a batch, beside a free row: each row is its request alone."""
    from test_structured import LAZY, LAZY_TOKENS, TC, triggered_bias

    vocab = GrammarVocab.from_tokens(LAZY_TOKENS, [EOS], special_ids=[TC])
    model = models["qwen"]
    bias = triggered_bias(model, vocab)
    configs = [GenerationConfig(max_new_tokens=64, logit_bias=bias, response_format=LAZY),
               GenerationConfig(max_new_tokens=30, ignore_eos=True)]
    prompts = [[1, 2, 3], [5, 6, 7, 5, 6, 7]]
    engine = _batch(TorchBackend(model, "qwen", max_sequences=2), NgramDrafter().for_sequence, 4, vocab, 2)
    got = engine.generate(prompts, configs)
    for prompt, cfg, result in zip(prompts, configs, got):
        assert result.token_ids == _plain(model, vocab, prompt, cfg).token_ids
    assert TC in got[0].token_ids and got[0].finish_reason == "stop"
