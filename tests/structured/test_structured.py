"""Structured output under speculation (adaspec.structured, adaspec.constrained, adaspec.drafters.forced).

A 64-token character-level vocabulary (JSON punctuation, letters, digits, a few multi-character tokens, id 63 =
EOS) stands in for a tokenizer, so the tiny in-process models of conftest can be constrained: greedy speculative
output must equal constrained plain decoding token for token, sampled output must follow the masked target
distribution (chi-square, on the model-free Markov target with a drafter whose q is not masked), and forced drafts
must be accepted with α = 1.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from adaspec.backends import TorchBackend, truncated_layers
from adaspec.controllers import FixedController
from adaspec.drafters import ModelDrafter, NgramDrafter
from adaspec.drafters.base import Draft, Drafter
from adaspec.drafters.forced import ForcedDrafter
from adaspec.drafters.multi import MultiDrafter
from adaspec.engine import GenerationConfig, SpeculativeEngine
from adaspec.errors import ConfigError
from adaspec.structured import JSON_OPTIONS, Constraint, GrammarVocab

from conftest import MarkovBackend, markov_table
from test_verify import assert_matches

CHARS = list('{}[]":, ') + list("abcdefghijklmnopqrstuvwxyz") + list("0123456789")
MULTI = ['"name"', '"age"', "true", "false", "null", "-", ".", "ab", "cd", "er", "on", "in", "an", "th", "es",
         "re", "at", "en", '"a', '"b']
TOKENS = [t.encode() for t in CHARS + MULTI][:63] + [b"<eos>"]
EOS = 63
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "ok"],
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "ok": {"type": "boolean"}}}


def text_of(ids: list[int]) -> str:
    return b"".join(TOKENS[t] for t in ids if t != EOS).decode()


@pytest.fixture(scope="module")
def vocab() -> GrammarVocab:
    return GrammarVocab.from_tokens(TOKENS, [EOS])


def engine(target, drafter=None, k: int = 0, vocab=None) -> SpeculativeEngine:
    e = SpeculativeEngine(target, drafter, FixedController(k) if drafter is not None else None, eos_token_ids=[EOS])
    e.grammar_vocab = vocab
    return e


# The grammar state -------------------------------------------------------------------------------------------------
def test_masks_follow_the_drafts_and_roll_back(vocab):
    state = vocab.compile(Constraint.json_schema(SCHEMA)).start()
    start = state.allowed()
    assert start.tolist() == [i == TOKENS.index(b"{") for i in range(64)]  # only "{" opens an object
    forced = state.forced()
    assert text_of(forced) == '{"name": '  # compact JSON: the first key is forced
    rows = state.masks(forced)
    assert rows.shape == (len(forced) + 1, 64)
    assert torch.equal(rows[0], start) and torch.equal(state.allowed(), start)  # masks() leaves the state
    state.advance(forced)
    assert torch.equal(state.allowed(), rows[-1])
    assert rows[-1][TOKENS.index(b'"')] and not rows[-1][TOKENS.index(b"{")] and not rows[-1][EOS]
    state.rollback(len(forced))
    assert torch.equal(state.allowed(), start)
    assert state.valid_prefix(forced + [TOKENS.index(b"{")]) == len(forced)


def test_eos_only_where_the_grammar_accepts(vocab):
    state = vocab.compile(Constraint.regex("[0-9]{1,3}")).start()
    assert not state.allowed()[EOS] and not state.accepting
    state.advance([TOKENS.index(b"7")])
    assert state.allowed()[EOS] and state.accepting and not state.done
    state.advance([TOKENS.index(b"1"), TOKENS.index(b"2")])
    assert state.done and state.allowed().nonzero().flatten().tolist() == [EOS]


def test_masks_over_a_drafted_end_of_sequence(vocab):
    # A draft that ends the output (EOS where the grammar accepts, or anything once it has stopped): the rows after
    # it are never read; masks() must not fail there and must leave the state as it was.
    state = vocab.compile(Constraint.regex("[0-9]{1,3}")).start()
    state.advance([TOKENS.index(b"7")])
    before = state.allowed()
    rows = state.masks([EOS, TOKENS.index(b"5")])
    assert rows.shape == (3, 64) and torch.equal(rows[0], before) and torch.equal(state.allowed(), before)
    state.advance([TOKENS.index(b"1"), TOKENS.index(b"2")])  # done: only EOS
    rows = state.masks([EOS, EOS])
    assert rows.shape == (3, 64) and rows[0].nonzero().flatten().tolist() == [EOS] and state.done


@pytest.mark.parametrize("constraint, problem", [
    (Constraint.json_schema({"type": "objectx"}), "objectx"),
    (Constraint.regex("[a-"), "regex"),
    (Constraint.lark("start: foo"), "foo"),
])
def test_invalid_constraint_is_a_clear_error(vocab, constraint, problem):
    with pytest.raises(ConfigError, match=problem):
        vocab.compile(constraint)


def test_bad_options_are_config_errors():
    with pytest.raises(ConfigError, match="not valid JSON"):
        GenerationConfig(json_schema="{nope")
    with pytest.raises(ConfigError, match="at most one"):
        GenerationConfig(json_schema=SCHEMA, regex="a+")
    with pytest.raises(ConfigError, match="response_format"):
        GenerationConfig(response_format="yaml")
    with pytest.raises(ConfigError, match="tokenizer"):
        SpeculativeEngine(MarkovBackend(markov_table(64, 0))).generate([1, 2], GenerationConfig(regex="a+"))


# Greedy: speculative == constrained plain decoding -----------------------------------------------------------------
@pytest.mark.parametrize("kind", ["ngram", "trunc", "forced"])
@pytest.mark.parametrize("constraint", [dict(json_schema=SCHEMA), dict(response_format="json_object"),
                                        dict(regex=r"(ab|cd|[0-9])+x"), dict(grammar='start: "[" NUM (", " NUM)+ "]"\n'
                                                                                    'NUM: /[0-9]{2}/')])
def test_greedy_speculative_equals_constrained_plain(models, vocab, kind, constraint):
    model = models["qwen"]
    drafters = {"ngram": lambda: NgramDrafter(), "forced": lambda: ForcedDrafter(None),
                "trunc": lambda: ModelDrafter(TorchBackend(truncated_layers(model, 2), "trunc"))}
    cfg = GenerationConfig(max_new_tokens=48, **constraint)
    drafted = 0
    for prompt in ([1, 2, 3, 4, 5], [10, 20, 30, 10, 20, 30], [40, 41, 42]):
        plain = engine(TorchBackend(model, "qwen"), vocab=vocab).generate(prompt, cfg)
        spec = engine(TorchBackend(model, "qwen"), drafters[kind](), 4, vocab).generate(prompt, cfg)
        assert spec.token_ids == plain.token_ids, (kind, prompt)
        assert spec.finish_reason == plain.finish_reason
        drafted += spec.stats.draft_tokens
        state = vocab.compile(cfg.constraint).start()
        state.advance(plain.token_ids)  # every token is allowed by the grammar
        if plain.finish_reason == "stop":
            assert state.accepting
            if "json_schema" in constraint:
                value = json.loads(text_of(plain.token_ids))
                assert set(value) == {"name", "age", "ok"} and 0 <= value["age"] <= 120
    assert drafted > 0


def test_forced_drafts_are_accepted_with_certainty(models, vocab):
    """Single-character tokens only: every forced token is the one token its mask allows, so α = 1 on them."""
    cfg = GenerationConfig(max_new_tokens=20, regex="xyz[0-9]{3}wvu")
    for params in (dict(), dict(temperature=1.0, seed=3)):
        r = engine(TorchBackend(models["qwen"], "qwen"), ForcedDrafter(None), 8, vocab).generate(
            [1, 2, 3], GenerationConfig(**{**cfg.__dict__, **params}))
        assert text_of(r.token_ids)[:3] == "xyz" and text_of(r.token_ids)[-3:] == "wvu"
        assert r.finish_reason == "stop"
        assert r.stats.draft_tokens == 5 and r.stats.accepted_tokens == 5  # "yz" and "wvu" forced


class RecordingRouter(FixedController):
    """Routes to the first sub-drafter at a fixed K and records what the engine tells it: ``told`` (each
    ``set_forced``) and ``seen`` (each step)."""

    def __init__(self, k: int) -> None:
        super().__init__(k)
        self.told, self.seen = [], []

    def set_forced(self, n):
        self.told.append(n)

    def choose_drafter(self, options):
        return next(iter(options))

    def update(self, step):
        self.seen.append(step)


class RecordingLookup(Drafter):
    """A lookup that never matches and records the text of each sequence it is asked about (``offered``)."""

    name, lookup = "lookup", True

    def __init__(self) -> None:
        self.offered = []

    def for_sequence(self, seq):
        return self

    def available(self, ids):
        self.offered.append(text_of(ids))
        return 0

    def propose(self, ids, k, sampling, generator=None, stop=None):
        return Draft(torch.zeros(0, dtype=torch.long))


def test_the_controller_plans_behind_the_forced_tokens_and_lookups_match_after_them(models, vocab):
    """Before each step the engine tells the controller how many tokens the grammar forces (it prices K behind
    them) and routes the wrapped drafters on the sequence with the forced tokens appended (where the wrapped
    drafter will continue); the step it is shown counts them in ``forced``, its drafts are the wrapped drafter's."""
    controller, lookup = RecordingRouter(4), RecordingLookup()
    e = SpeculativeEngine(TorchBackend(models["qwen"], "qwen"), MultiDrafter({"lookup": lookup}), controller,
                          eos_token_ids=[EOS])
    e.grammar_vocab = vocab
    r = e.generate([1, 2, 3], GenerationConfig(max_new_tokens=20, regex="xyz[0-9]{3}wvu"))
    out = text_of(r.token_ids)
    assert out[:3] == "xyz" and out[-3:] == "wvu" and r.finish_reason == "stop"
    assert controller.told[0] == 2 and 3 in controller.told  # "yz" after the first token, "wvu" after the digits
    seen = controller.seen
    assert [s.forced for s in seen if s.forced] == [2, 3] and all(s.drafted == 0 for s in seen)
    prompt = text_of([1, 2, 3])
    assert lookup.offered[0] == prompt + "xyz"  # the lookup was asked where it would continue: after "yz"
    assert lookup.offered[-1] == prompt + out  # and after "wvu"


def test_rejected_drafts_are_cut_before_verification(models, vocab):
    """A drafter proposing only "{" under a regex of digits: every draft is cut, none reaches the target."""

    class Braces(Drafter):
        name = "braces"

        def propose(self, ids, k, sampling, generator=None, stop=None):
            return Draft(torch.full((k,), TOKENS.index(b"{"), dtype=torch.long))

    cfg = GenerationConfig(max_new_tokens=12, regex="[0-9]+")
    plain = engine(TorchBackend(models["qwen"], "qwen"), vocab=vocab).generate([5, 6], cfg)
    spec = engine(TorchBackend(models["qwen"], "qwen"), Braces(), 4, vocab).generate([5, 6],
                                                                                     GenerationConfig(**{
                                                                                         **cfg.__dict__,
                                                                                         "forced_drafts": False}))
    assert spec.token_ids == plain.token_ids
    assert spec.stats.steps and all(s.drafted == 0 for s in spec.stats.steps)


def test_max_tokens_inside_json_is_length(models, vocab):
    r = engine(TorchBackend(models["qwen"], "qwen"), NgramDrafter(), 4, vocab).generate(
        [1, 2, 3], GenerationConfig(max_new_tokens=6, json_schema=SCHEMA))
    assert r.finish_reason == "length" and len(r.token_ids) == 6
    with pytest.raises(json.JSONDecodeError):
        json.loads(text_of(r.token_ids))


def test_trees_fall_back_to_chains_under_a_grammar(models, vocab):
    e = engine(TorchBackend(models["qwen"], "qwen"), NgramDrafter(), 3, vocab)
    r = e.generate([1, 2, 3], GenerationConfig(max_new_tokens=8, regex="[a-z]+", tree_budget=8))
    assert "grammar" in r.stats.tree_fallback and not any(s.tree for s in r.stats.steps)


# Sampling: the masked target distribution, exactly ----------------------------------------------------------------
class FixedQDrafter(Drafter):
    """Drafts k tokens i.i.d. from a fixed q that puts mass on tokens the grammar forbids (an unmasked draft)."""

    name = "fixed-q"

    def __init__(self, q: torch.Tensor) -> None:
        self.q = q

    def propose(self, ids, k, sampling, generator=None, stop=None):
        tokens = torch.multinomial(self.q, k, replacement=True, generator=generator)
        return Draft(tokens, self.q.expand(k, -1).clone())


def exact_joint(table: torch.Tensor, vocab: GrammarVocab, constraint: Constraint, prompt: list[int],
                depth: int) -> dict[tuple[int, ...], float]:
    """P(first ``depth`` tokens) under constrained plain sampling (temperature 1) of the Markov target."""
    state = vocab.compile(constraint).start()
    out: dict[tuple[int, ...], float] = {}

    def walk(seq: list[int], prefix: tuple[int, ...], prob: float) -> None:
        if len(prefix) == depth:
            out[prefix] = prob
            return
        allowed = state.allowed()
        logits = table[seq[-2] if len(seq) >= 2 else 0, seq[-1]].masked_fill(~allowed, float("-inf"))
        p = logits.softmax(-1)
        for t in allowed.nonzero().flatten().tolist():
            state.advance([t])
            walk(seq + [t], prefix + (t,), prob * float(p[t]))
            state.rollback(1)

    walk(list(prompt), (), 1.0)
    return out


@pytest.mark.parametrize("drafter", ["fixed-q", "ngram+forced"])
def test_constrained_speculative_sampling_matches_masked_target(vocab, drafter):
    table = markov_table(64, seed=5, scale=1.5)
    constraint = Constraint.regex("[a-d]{2}[a-z]?x[0-9]")
    prompt = [TOKENS.index(b"a"), TOKENS.index(b"b"), TOKENS.index(b"a"), TOKENS.index(b"b")]
    exact = exact_joint(table, vocab, constraint, prompt, 3)
    q = torch.zeros(64)
    q[[TOKENS.index(c.encode()) for c in "abcdefgx{"] + [TOKENS.index(b"ab"), TOKENS.index(b"cd")]] = 1.0
    q /= q.sum()
    dr = FixedQDrafter(q) if drafter == "fixed-q" else NgramDrafter()
    e = engine(MarkovBackend(table), dr, 3, vocab)
    n = 3000
    counts: dict[tuple[int, ...], int] = {}
    drafted = 0
    for seed in range(n):
        r = e.generate(prompt, GenerationConfig(max_new_tokens=3, temperature=1.0, seed=seed,
                                                json_schema=None, regex=constraint.source))
        key = tuple(r.token_ids[:3])
        counts[key] = counts.get(key, 0) + 1
        drafted += r.stats.draft_tokens
    assert drafted > 0
    keys = sorted(set(exact) | set(counts))
    assert_matches(np.array([counts.get(k, 0) for k in keys]), np.array([exact.get(k, 0.0) for k in keys]),
                   f"{drafter}: first three tokens")


# The real small model (slow) ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_smollm2_schema_valid_and_speculative_equals_constrained_plain():
    """smollm2-135m-instruct (fp32, its own tokenizer): every answer is valid JSON for the schema, and greedy
    speculative output (prompt lookup; a layer-truncated draft model; forced drafts alone) is constrained plain
    decoding token for token."""
    from adaspec.api import load, make_drafter
    from adaspec.controllers import make_controller
    from adaspec.structured_workload import schema_errors

    torch.set_num_threads(2)
    lm = load("smollm2-135m-instruct", draft="ngram", dtype="float32", threads=2, progress=False)
    schema = {"type": "object", "additionalProperties": False, "required": ["city", "country", "population"],
              "properties": {"city": {"type": "string"}, "country": {"type": "string"},
                             "population": {"type": "integer", "minimum": 0, "maximum": 99999999}}}
    cfg = GenerationConfig(max_new_tokens=48, json_schema=schema)
    prompts = ["Paris is the capital of France, home to about 2.1 million people. Give its facts as JSON.",
               "Berlin has 3.7 million inhabitants. Answer in JSON."]
    drafters = [lm.engine.drafter, make_drafter("layerskip:20", lm.target, dtype="float32", progress=False),
                ForcedDrafter(None)]
    plain_engine = lm.plain()
    for prompt in prompts:
        ids = lm.encode(prompt)
        plain = plain_engine.generate(ids, cfg)
        assert plain.finish_reason == "stop", plain.text
        assert schema_errors(json.loads(plain.text), schema) == []
        for drafter in drafters:
            engine = SpeculativeEngine(lm.target.backend, drafter, make_controller("fixed", 4), tokenizer=lm.tokenizer)
            engine.grammar_vocab = plain_engine.grammar_vocab
            spec = engine.generate(ids, cfg)
            assert spec.token_ids == plain.token_ids, (prompt, drafter.name)


# The structured workload -------------------------------------------------------------------------------------------
def test_structured_workload_tasks_and_scoring():
    from adaspec.structured_workload import CATEGORIES, load_tasks, schema_errors, score

    tasks = load_tasks(6)
    assert [t.category for t in tasks] == list(CATEGORIES) * 2
    sig, answer, tool = tasks[:3]
    assert sig.expected == {"function_name": "has_close_elements", "parameters": ["numbers", "threshold"],
                            "returns": "bool"}
    assert score(sig, json.dumps(sig.expected), "stop") == {"valid": True, "exact": 1.0, "fields": {
        "function_name": True, "parameters": True, "returns": True}}
    assert score(sig, json.dumps(sig.expected), "length")["valid"] is False  # cut by the budget: not complete
    wrong = score(answer, json.dumps({"reasoning": "r", "answer": answer.expected["answer"] + 1}), "stop")
    assert wrong["valid"] and wrong["exact"] == 0.0
    assert not score(answer, '{"reasoning": "r"}', "stop")["valid"]
    call = '<tool_call>\n' + json.dumps({"name": "translate", "arguments": tool.expected}) + '\n</tool_call>'
    assert score(tool, call, "stop")["exact"] == 1.0 and tool.constraint.kind == "lark"
    assert schema_errors({"a": 1.5}, {"type": "object", "properties": {"a": {"type": "integer"}}}) == [
        "$.a: expected integer, got float"]



# Lazy grammars (tool_choice "auto"): free until the trigger token -------------------------------------------------
TC = 62  # "<tc>", a special token standing in for Qwen2.5's <tool_call>
LAZY_TOKENS = [*TOKENS[:TC], b"<tc>", TOKENS[EOS]]
LAZY = Constraint.lark('start: "<tc>" body\nbody: %json ' + json.dumps({**SCHEMA, "x-guidance": JSON_OPTIONS}),
                      trigger="<tc>")


@pytest.fixture(scope="module")
def lazy_vocab() -> GrammarVocab:
    return GrammarVocab.from_tokens(LAZY_TOKENS, [EOS], special_ids=[TC])


def triggered_bias(model, vocab) -> dict[int, float]:
    """A logit bias on the trigger that makes the tiny model emit it after a few free tokens (found, not assumed)."""
    for bias in (2.0, 3.0, 4.0, 6.0, 8.0, 12.0):
        r = engine(TorchBackend(model, "qwen"), vocab=vocab).generate(
            [1, 2, 3], GenerationConfig(max_new_tokens=24, logit_bias={TC: bias}))
        if TC in r.token_ids[2:16]:
            return {TC: bias}
    raise AssertionError("no bias makes the tiny model emit the trigger after free text")


def test_lazy_grammar_is_free_until_its_trigger_then_constrains(models, lazy_vocab):
    from adaspec.structured import TriggerUnavailable

    assert lazy_vocab.compile(LAZY).trigger == TC
    with pytest.raises(TriggerUnavailable, match="special token"):
        lazy_vocab.compile(Constraint.lark('start: "ab" body\nbody: /[0-9]+/', trigger="ab"))
    model = models["qwen"]
    never = GenerationConfig(max_new_tokens=24, logit_bias={TC: -100.0})
    free = engine(TorchBackend(model, "qwen"), vocab=lazy_vocab).generate([1, 2, 3], never)
    lazy = engine(TorchBackend(model, "qwen"), vocab=lazy_vocab).generate(
        [1, 2, 3], GenerationConfig(**{**never.__dict__, "response_format": LAZY}))
    assert lazy.token_ids == free.token_ids and lazy.stats.grammar_ms < 5  # no trigger: free text, unmasked

    class Triggers(Drafter):  # drafts the trigger first, every step: its position is free, the target declines it
        name = "triggers"

        def propose(self, ids, k, sampling, generator=None, stop=None):
            return Draft(torch.tensor([TC] + [TOKENS.index(b"{")] * (k - 1), dtype=torch.long))

    drafted = engine(TorchBackend(model, "qwen"), Triggers(), 3, lazy_vocab).generate(
        [1, 2, 3], GenerationConfig(**{**never.__dict__, "response_format": LAZY}))
    assert drafted.token_ids == free.token_ids and drafted.stats.draft_tokens > 0

    bias = triggered_bias(model, lazy_vocab)
    free = engine(TorchBackend(model, "qwen"), vocab=lazy_vocab).generate(
        [1, 2, 3], GenerationConfig(max_new_tokens=64, logit_bias=bias))
    cfg = GenerationConfig(max_new_tokens=64, logit_bias=bias, response_format=LAZY)
    plain = engine(TorchBackend(model, "qwen"), vocab=lazy_vocab).generate([1, 2, 3], cfg)
    at = plain.token_ids.index(TC)
    assert at >= 2 and plain.token_ids[:at + 1] == free.token_ids[:at + 1]  # free up to and with the trigger
    state = lazy_vocab.compile(LAZY).start()
    state.advance(plain.token_ids[at:])  # the grammar held from the trigger on (raises otherwise)
    assert plain.finish_reason == "stop" and state.done  # ends where the call's grammar is complete
    value = json.loads(b"".join(LAZY_TOKENS[t] for t in plain.token_ids[at + 1:]).decode())
    assert set(value) == {"name", "age", "ok"}
    drafters = {"ngram": NgramDrafter(), "forced": ForcedDrafter(None),
                "trunc": ModelDrafter(TorchBackend(truncated_layers(model, 2), "trunc"))}
    for name, drafter in drafters.items():
        spec = engine(TorchBackend(model, "qwen"), drafter, 4, lazy_vocab).generate([1, 2, 3], cfg)
        assert spec.token_ids == plain.token_ids, name
        if name == "forced":  # forced drafts only after the trigger: the keys, all accepted
            assert spec.stats.draft_tokens > 0 and spec.stats.accepted_tokens == spec.stats.draft_tokens
