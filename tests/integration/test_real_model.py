"""Integration tests on a real model: smollm2-135m-instruct from the zoo (fetched and converted once, ~100 MB).

Greedy speculative decoding in fp32 must reproduce plain greedy decoding token for token, with an n-gram drafter
and with a layer-truncated copy of the target as the draft model.
"""

from __future__ import annotations

import json

import pytest
import torch

from adaspec.api import load, make_drafter
from adaspec.cli import main
from adaspec.controllers import make_controller
from adaspec.engine import GenerationConfig, SpeculativeEngine
from adaspec.errors import ContextLengthError

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
PROMPTS = [
    "Write a Python function that returns the factorial of n.",
    "List three prime numbers and explain why they are prime.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
]


@pytest.fixture(scope="module")
def lm():
    torch.set_num_threads(2)
    return load(MODEL, draft="ngram", dtype="float32", threads=2, progress=False)


CFG = GenerationConfig(max_new_tokens=32)


@pytest.fixture(scope="module")
def plain_outputs(lm):
    return {p: lm.plain().generate(lm.encode(p), CFG) for p in PROMPTS}


@pytest.mark.parametrize("drafter_spec,controller,k", [
    ("ngram", "fixed", 4), ("ngram", "adaptive", None), ("layerskip:20", "fixed", 3),
    ("layerskip:20", "heuristic", None)])
def test_greedy_speculative_equals_plain_fp32(lm, plain_outputs, drafter_spec, controller, k):
    drafter = make_drafter(drafter_spec, lm.target, dtype="float32", progress=False)
    engine = SpeculativeEngine(lm.target.backend, drafter, make_controller(controller, k), tokenizer=lm.tokenizer)
    drafted = 0
    for prompt, plain in plain_outputs.items():
        spec = engine.generate(lm.encode(prompt), CFG)
        assert spec.token_ids == plain.token_ids, prompt
        assert spec.text == plain.text
        drafted += spec.stats.draft_tokens
    assert drafted > 0  # speculation actually happened


def test_layerskip_draft_is_accepted_sometimes(lm):
    drafter = make_drafter("layerskip:24", lm.target, dtype="float32", progress=False)
    engine = SpeculativeEngine(lm.target.backend, drafter, make_controller("fixed", 3), tokenizer=lm.tokenizer)
    r = engine.generate(lm.encode(PROMPTS[0]), CFG)
    assert r.stats.draft_tokens > 0
    assert 0.0 < r.stats.acceptance_rate <= 1.0


def test_chat_template_is_applied(lm):
    ids = lm.encode("hello")
    text = lm.tokenizer.decode(ids)
    assert "hello" in text and text != "hello"  # wrapped in the chat template's roles


def test_prompt_longer_than_context_is_a_clear_error(lm):
    too_long = [1] * lm.target.backend.max_context
    with pytest.raises(ContextLengthError, match="context window"):
        lm.engine.generate(too_long, GenerationConfig(max_new_tokens=4))


def test_cli_generate_json_compare(capsys):
    code = main(["generate", "Say hi.", "--target", MODEL, "--draft", "ngram", "--dtype", "float32",
                 "--threads", "2", "--max-new-tokens", "16", "--compare", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stats"]["new_tokens"] == 16 if out["finish_reason"] == "length" else 1 <= out["stats"]["new_tokens"] < 16
    assert len(out["stats"]["k_trace"]) == out["stats"]["steps"]
    assert out["compare"]["identical"] is True
    assert out["compare"]["plain_new_tokens"] == out["stats"]["new_tokens"]
    assert out["finish_reason"] in ("stop", "length")


def test_cli_errors_are_one_line(capsys):
    assert main(["generate", "hi", "--target", "no-such-model", "--draft", "none"]) == 2
    err = capsys.readouterr().err
    assert "no-such-model" in err and "Traceback" not in err
    assert main(["generate", "hi", "--target", MODEL, "--draft", "none", "--k", "-1"]) == 2
    assert "K must be >= 0" in capsys.readouterr().err


def test_suffix_drafter_greedy_equals_plain_and_learns_across_requests(lm, plain_outputs):
    from adaspec.drafters.suffix import SuffixDrafter

    engine = SpeculativeEngine(lm.target.backend, SuffixDrafter(), make_controller("fixed", 4),
                               tokenizer=lm.tokenizer)
    accepted = []
    for _ in range(2):  # the second round drafts from the first round's answers
        accepted.append(0)
        for prompt, plain in plain_outputs.items():
            spec = engine.generate(lm.encode(prompt), CFG)
            assert spec.token_ids == plain.token_ids, prompt
            accepted[-1] += spec.stats.accepted_tokens
    assert accepted[1] > accepted[0]
