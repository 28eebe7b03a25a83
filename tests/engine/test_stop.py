"""Stop conditions through the engine (EOS inside an accepted draft, max_new_tokens, stop strings across steps)
and TextStream on its own."""

from __future__ import annotations

import pytest

from adaspec.engine import GenerationConfig, default_eos_ids
from adaspec.text import TextStream

from conftest import VOCAB, word

PROMPT = [3, 17, 42, 5, 9, 9, 12]


@pytest.fixture(scope="module")
def reference(make_engine):
    """The target's greedy continuation of PROMPT (40 tokens, EOS ignored)."""
    out = make_engine("qwen").generate(PROMPT, GenerationConfig(max_new_tokens=40, ignore_eos=True)).token_ids
    assert VOCAB - 1 not in out[:20]
    return out


def text_of(tokenizer, ids):
    return tokenizer.decode(ids, skip_special_tokens=True)


def run_stream(engine, prompt, cfg):
    """Stream a request; check every text delta only ever extends a prefix of the final text."""
    pieces, tokens = [], []
    result = None
    for chunk in engine.stream(prompt, cfg):
        pieces.append(chunk.text)
        tokens.extend(chunk.token_ids)
        result = chunk.result or result
    assert result is not None
    streamed = "".join(pieces)
    assert streamed == result.text
    for i in range(len(pieces)):
        assert result.text.startswith("".join(pieces[:i + 1]))
    assert tokens == result.token_ids
    return result


# EOS ---------------------------------------------------------------------------------------------------------
def test_eos_inside_an_accepted_draft(make_engine, tokenizer, reference):
    """A perfect drafter with K = 8 drafts past the EOS; everything after EOS is dropped though accepted."""
    j = next(i for i in range(2, 8) if reference[i] not in reference[:i])
    eos = reference[j]
    engine = make_engine("qwen", "self", 8, tokenizer=tokenizer)
    r = run_stream(engine, PROMPT, GenerationConfig(max_new_tokens=30, eos_token_ids=[eos]))
    assert r.token_ids == reference[:j + 1]
    assert r.token_ids[-1] == eos and eos not in r.token_ids[:-1]
    assert r.finish_reason == "stop"
    assert r.text == text_of(tokenizer, reference[:j + 1])
    step = r.stats.steps[-1]
    assert len(r.stats.steps) == 1
    assert (step.drafted, step.accepted) == (8, 8)  # the EOS landed mid-draft...
    assert step.emitted == j  # ...and the step was cut right after it
    assert r.stats.new_tokens == j + 1


def test_eos_as_first_token(make_engine, tokenizer, reference):
    engine = make_engine("qwen", "trunc", 4, tokenizer=tokenizer)
    r = engine.generate(PROMPT, GenerationConfig(max_new_tokens=30, eos_token_ids=[reference[0]]))
    assert r.token_ids == reference[:1] and r.finish_reason == "stop"
    assert r.stats.steps == []


def test_tokenizer_eos_is_the_default_and_is_skipped_in_text(make_engine, tokenizer):
    assert default_eos_ids(tokenizer) == (VOCAB - 1,)
    prompt = [10, 20, 30, 40, 50]  # the target emits <eos> (id 63) as its third token
    plain = make_engine("qwen").generate(prompt, GenerationConfig(max_new_tokens=10, ignore_eos=True)).token_ids
    stop_at = plain.index(VOCAB - 1)
    for drafter, k in (("self", 5), ("trunc", 3), (None, 0)):
        engine = make_engine("qwen", drafter, k, tokenizer=tokenizer)
        assert engine.eos_token_ids == (VOCAB - 1,)
        r = run_stream(engine, prompt, GenerationConfig(max_new_tokens=10))
        assert r.token_ids == plain[:stop_at + 1]
        assert r.finish_reason == "stop"
        assert r.text == " ".join(word(t) for t in plain[:stop_at])  # "<eos>" itself is not in the text
        r = engine.generate(prompt, GenerationConfig(max_new_tokens=10, ignore_eos=True))
        assert r.token_ids == plain and r.finish_reason == "length"


# max_new_tokens ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("max_new,k_trace", [(1, []), (2, [0]), (5, [3]), (6, [4]), (7, [4, 0]), (8, [4, 1]),
                                             (12, [4, 4, 0])])
def test_max_new_tokens_exact_with_clamped_k(make_engine, tokenizer, reference, max_new, k_trace):
    engine = make_engine("qwen", "self", 4, tokenizer=tokenizer)
    r = run_stream(engine, PROMPT, GenerationConfig(max_new_tokens=max_new, ignore_eos=True))
    assert r.token_ids == reference[:max_new]
    assert r.finish_reason == "length"
    assert r.stats.k_trace == k_trace
    assert r.text == text_of(tokenizer, reference[:max_new])


def test_max_new_tokens_with_eos_in_the_same_step_prefers_stop(make_engine, reference):
    j = next(i for i in range(2, 8) if reference[i] not in reference[:i])
    r = make_engine("qwen", "self", 8).generate(PROMPT, GenerationConfig(max_new_tokens=j + 1,
                                                                        eos_token_ids=[reference[j]]))
    assert r.token_ids == reference[:j + 1]
    assert r.finish_reason == "stop"


# Stop strings ------------------------------------------------------------------------------------------------
def _step_bounds(result) -> list[int]:
    """Token index where each step's tokens start (the first token is the prefill's)."""
    bounds, at = [], 1
    for step in result.stats.steps:
        bounds.append(at)
        at += step.emitted
    return bounds


def test_stop_string_spanning_two_steps(make_engine, tokenizer, reference):
    engine = make_engine("qwen", "self", 3, tokenizer=tokenizer)
    full = engine.generate(PROMPT, GenerationConfig(max_new_tokens=25, ignore_eos=True))
    assert full.token_ids == reference[:25]
    full_text = full.text
    # A stop string made of the tail of one step's last word, the space, and the head of the next step's first
    # word, whose first occurrence is at that step boundary.
    for b in _step_bounds(full)[1:]:
        before = text_of(tokenizer, reference[:b])
        stop = before[-2:] + " " + word(reference[b])[:2]
        if full_text.find(stop) == len(before) - 2:
            break
    else:
        pytest.fail("no usable step boundary in the reference output")
    r = run_stream(engine, PROMPT, GenerationConfig(max_new_tokens=25, stop=[stop], ignore_eos=True))
    assert r.finish_reason == "stop"
    assert r.text == full_text[:len(before) - 2]
    assert stop not in r.text
    assert r.token_ids == reference[:b + 1]  # the token that completed the stop string, nothing after it
    assert r.stats.steps[-1].emitted == 1
    assert _step_bounds(r)[-1] == b  # completed by the first token of a later step


def test_stop_string_inside_one_step_drops_accepted_tokens_after_it(make_engine, tokenizer, reference):
    engine = make_engine("qwen", "self", 6, tokenizer=tokenizer)
    i = next(i for i in range(3, 7) if reference[i] not in reference[:i])
    stop = " " + word(reference[i]) + " "  # completed when token i + 1 adds the following space
    r = run_stream(engine, PROMPT, GenerationConfig(max_new_tokens=30, stop=[stop, "never-there"],
                                                    ignore_eos=True))
    assert r.finish_reason == "stop"
    assert r.token_ids == reference[:i + 2]
    assert r.text == text_of(tokenizer, reference[:i])
    last = r.stats.steps[-1]
    assert last.accepted == 6 and last.emitted == i + 1  # 6 drafts accepted, only tokens up to i+1 emitted


def test_stop_string_earliest_of_several_wins(make_engine, tokenizer, reference):
    engine = make_engine("qwen", "trunc", 3, tokenizer=tokenizer)
    w1, w3 = word(reference[1]), word(reference[3])
    r = engine.generate(PROMPT, GenerationConfig(max_new_tokens=30, stop=[w3, w1], ignore_eos=True))
    full_text = text_of(tokenizer, reference[:30])
    at = min(full_text.find(w1), full_text.find(w3))
    assert r.text == full_text[:at]
    assert r.finish_reason == "stop"


def test_stop_string_never_matching_changes_nothing(make_engine, tokenizer, reference):
    r = run_stream(make_engine("qwen", "trunc", 3, tokenizer=tokenizer), PROMPT,
                   GenerationConfig(max_new_tokens=20, stop=["zz", ""], ignore_eos=True))
    assert r.token_ids == reference[:20] and r.finish_reason == "length"
    assert r.text == text_of(tokenizer, reference[:20])


# TextStream --------------------------------------------------------------------------------------------------
class ByteTok:
    """A fake tokenizer: ids < 100 are words "t{i}" (joined by spaces); ids 200 and 201 are the two halves of
    "é" (decoded alone, 200 gives U+FFFD as an incomplete UTF-8 sequence would); id 0 is special (skipped)."""

    def decode(self, ids, skip_special_tokens=True):
        out, i = [], 0
        ids = [t for t in ids if not (skip_special_tokens and t == 0)]
        while i < len(ids):
            t = ids[i]
            if t == 200:
                if i + 1 < len(ids) and ids[i + 1] == 201:
                    out.append("é")
                    i += 2
                    continue
                out.append("\ufffd")
            elif t == 201:
                out.append("\ufffd")
            else:
                out.append(f"t{t}")
            i += 1
        return " ".join(out)


def test_textstream_no_stop_strings():
    ts = TextStream(ByteTok())
    assert ts.push([1, 2]) == 2
    assert ts.delta() == "t1 t2"
    assert ts.push([0, 3]) == 2
    assert ts.delta() == " t3"
    assert ts.delta() == ""
    assert ts.delta(final=True) == ""
    assert ts.text == "t1 t2 t3" and not ts.stopped


def test_textstream_stop_split_across_pushes():
    ts = TextStream(ByteTok(), stop=["t3 t4"])
    assert ts.push([1, 2]) == 2
    assert ts.delta() == "t1 t2"
    assert ts.push([3]) == 1
    assert ts.delta() == " "  # "t3" may be the start of "t3 t4": held back
    assert ts.push([4, 5, 6]) == 1  # completed by the first of the new tokens; 5 and 6 are dropped
    assert ts.stopped
    assert ts.ids == [1, 2, 3, 4]
    assert ts.text == "t1 t2 "
    assert ts.delta() == ""
    assert ts.delta(final=True) == ""
    assert ts.push([7]) == 0  # nothing after a stop


def test_textstream_partial_stop_prefix_released_when_it_does_not_complete():
    ts = TextStream(ByteTok(), stop=["t3 t4"])
    ts.push([1, 3])
    assert ts.delta() == "t1 "
    ts.push([5])
    assert ts.delta() == "t3 t5"
    ts.push([3])
    held = ts.delta()
    assert held == " "
    assert ts.delta(final=True) == "t3"  # the final flush releases what was held back
    assert ts.text == "t1 t3 t5 t3"


def test_textstream_holds_back_every_possible_stop_prefix():
    ts = TextStream(ByteTok(), stop=["1 t9", "t1 t2 t7"])
    ts.push([5, 1])
    assert ts.delta() == "t5 "  # "t1" could start "t1 t2 t7" (and "1" could start "1 t9")
    ts.push([2])
    assert ts.delta() == ""  # "t1 t2" is still a prefix of "t1 t2 t7"
    ts.push([3])
    assert ts.delta() == "t1 t2 t3"
    assert not ts.stopped


def test_textstream_stop_inside_one_token_text():
    ts = TextStream(ByteTok(), stop=["12"])
    assert ts.push([5, 312, 7]) == 2  # "t312" contains "12"; 7 is dropped
    assert ts.text == "t5 t3"
    assert ts.delta() == "t5 t3"
    assert ts.stopped


def test_textstream_stop_at_the_very_start():
    ts = TextStream(ByteTok(), stop=["t8"])
    assert ts.push([8, 9]) == 1
    assert ts.text == "" and ts.delta() == "" and ts.delta(final=True) == ""


def test_textstream_holds_back_an_incomplete_utf8_sequence():
    ts = TextStream(ByteTok())
    ts.push([1, 200])
    assert ts.delta() == "t1 "  # the trailing U+FFFD is not final
    ts.push([201])
    assert ts.delta() == "é"
    assert ts.text == "t1 é"
    ts2 = TextStream(ByteTok())
    ts2.push([200])
    assert ts2.delta() == ""
    assert ts2.delta(final=True) == "\ufffd"


def test_textstream_earliest_stop_wins_and_empty_stops_are_ignored():
    ts = TextStream(ByteTok(), stop=["", "t4", "t2 t3"])
    assert ts.stop == ("t4", "t2 t3")
    assert ts.push([1, 2, 3, 4, 5]) == 3
    assert ts.text == "t1 "
    assert ts.ids == [1, 2, 3]


def test_textstream_stop_spanning_an_earlier_push_boundary():
    ts = TextStream(ByteTok(), stop=["5 t6 t7"])
    ts.push([4, 5])
    d1 = ts.delta()
    ts.push([6])
    d2 = ts.delta()
    assert ts.push([7, 8]) == 1
    assert ts.text == "t4 t"
    assert d1 + d2 + ts.delta(final=True) == "t4 t"


def test_a_single_stop_string_given_as_str_is_one_stop_string(make_engine, tokenizer, reference):
    """``stop="w41 w56"`` must mean the one string (as OpenAI's and HF's ``stop`` accept), not a set of
    single-character stops ("w", "4", ...) that end generation at the first "w"."""
    stop = word(reference[3]) + " " + word(reference[4])
    engine = make_engine("qwen", "trunc", 3, tokenizer=tokenizer)
    as_list = engine.generate(PROMPT, GenerationConfig(max_new_tokens=20, stop=[stop], ignore_eos=True))
    as_str = engine.generate(PROMPT, GenerationConfig(max_new_tokens=20, stop=stop, ignore_eos=True))
    assert as_list.text == text_of(tokenizer, reference[:20])[:text_of(tokenizer, reference[:20]).find(stop)]
    assert as_str.text == as_list.text
    assert as_str.token_ids == as_list.token_ids
