"""The prompt's other spellings: JSON-escaped text and the text of escaped JSON strings, matched by suffix decoding."""

from __future__ import annotations

import gc
import json
import weakref

import pytest

from adaspec.drafters.suffix import SuffixDrafter, suffix_from_spec, with_own_cache
from adaspec.drafters.text_views import TextViews, text_views_for
from adaspec.sampling import SamplingParams

GREEDY = SamplingParams()


class CharTokenizer:
    """One token per character (ids = code points): enough to see where spellings agree and differ."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens: bool = True, **kw) -> str:
        return "".join(chr(i) for i in ids)


TOK = CharTokenizer()
CODE = 'def add(a, b):\n    """Sum of "a" and b."""\n    return a + b\n'
PROMPT = TOK.encode("Write this file:\n" + CODE + "Reply with a JSON tool call.\n")


def text(ids) -> str:
    return TOK.decode(ids)


def test_escaped_is_the_json_string_body_and_empty_when_nothing_changes():
    views = TextViews(TOK)
    assert text(views.escaped(TOK.encode(CODE))) == json.dumps(CODE)[1:-1]
    assert text(views.escaped(TOK.encode(CODE))).startswith('def add(a, b):\\n    \\"\\"\\"Sum of \\"a\\"')
    assert views.escaped(TOK.encode("plain words only")) == []


def test_unescaped_decodes_escaped_json_strings_of_sixteen_characters_or_more():
    views = TextViews(TOK)
    result = '{"tool": "read_file", "content": ' + json.dumps(CODE) + ', "note": "a\\nb", "bad": "x\\q and more text"}'
    assert [text(v) for v in views.unescaped(TOK.encode(result))] == [CODE]  # short and invalid ones skipped
    assert views.unescaped(TOK.encode('{"content": "no escapes in this long string"}')) == []


def test_escapes_and_the_spelling_an_answer_ends_in():
    views = TextViews(TOK)
    assert views.has_escape(TOK.encode("a\\n")) and not views.has_escape(TOK.encode("a\nb"))
    assert views.spelling(TOK.encode('"x": "a\\nb')) == "escaped"
    assert views.spelling(TOK.encode('a\\nb\nc')) == "raw"  # the raw newline came last
    assert views.spelling(TOK.encode("no line end"), "escaped") == "escaped"  # neither: as it was


class TwoTokens(CharTokenizer):
    """Token 0 is a backslash then a newline (a line continuation), token 1 a newline then a backslash."""

    def decode(self, ids, skip_special_tokens: bool = True, **kw) -> str:
        return "".join({0: "\\\n", 1: "\n\\"}[i] for i in ids)


def test_a_token_with_both_is_read_by_which_comes_last():
    views = TextViews(TwoTokens())
    assert views.spelling([0]) == "raw" and views.spelling([1]) == "escaped"


def test_an_unterminated_string_is_skipped_and_the_next_line_still_read():
    views = TextViews(TOK)
    cut = '{"content": "' + 'x\\" ' * 2000 + "\n"  # a truncated one-line tool result: 2,000 escaped quotes, no end
    assert [text(v) for v in views.unescaped(TOK.encode(cut + json.dumps(CODE)))] == [CODE]
    odd = '{"content": "' + 'x\\" ' * 2000 + "y\\\n"  # cut after an escape's backslash
    assert [text(v) for v in views.unescaped(TOK.encode(odd + json.dumps(CODE)))] == [CODE]


def test_token_texts_are_shared_per_tokenizer_and_do_not_keep_it_alive():
    first, second = text_views_for(TOK), text_views_for(TOK)
    first.token_text(ord("q"))
    assert second._texts is first._texts and second._texts[ord("q")] == "q"  # decoded once, for both
    assert text_views_for(None) is None and text_views_for(object()) is None  # no encode/decode
    tok = CharTokenizer()
    gone = weakref.ref(tok)
    text_views_for(tok).token_text(1)
    del tok
    gc.collect()
    assert gone() is None


def propose(drafter: SuffixDrafter, ids: list[int], k: int = 8) -> str:
    return text(drafter.propose(ids, k, GREEDY).tokens.tolist())


def test_a_json_string_argument_copies_the_prompts_code():
    """Inside a JSON string the answer spells a quote ``\\"`` and a newline ``\\n``: the escaped prompt continues
    it; without the other spelling the lookup finds only the raw prompt's quote (a 2-token match, a 2-token draft)."""
    seq = PROMPT + TOK.encode('{"tool": "write_file", "content": "def add(a, b):\\n    \\"\\"\\"Sum of \\"a')
    with_views, without = suffix_from_spec("suffix", tokenizer=TOK), suffix_from_spec("suffix:views=0", tokenizer=TOK)
    for d in (with_views, without):
        d.prefill(PROMPT)
    assert propose(with_views, seq) == '\\" and b'
    assert propose(without, seq) == '" '


def test_at_a_line_end_the_spelling_that_matches_further_back_wins():
    """Both spellings match ``    return a + b`` and offer 12-token chains (a tie); the answer writes escaped text (and
    the escaped prompt matches it 23 tokens back, the deepest a trie of depth 24 holds; the raw one 16), so the
    answer's own spelling, ``\\n``, is drafted."""
    d = suffix_from_spec("suffix", tokenizer=TOK)
    d.prefill(PROMPT)
    written = '{"content": "def add(a, b):\\n    \\"\\"\\"Sum of \\"a\\" and b.\\"\\"\\"\\n    return a + b'
    assert propose(d, PROMPT + TOK.encode(written), 4) == "\\nRe"


def test_the_raw_spelling_wins_where_the_answer_is_raw():
    """A code edit copies the prompt raw. Once its answer holds an escape the escaped prompt is indexed, and a raw
    answer still drafts the raw text: its match runs further back, so its draft is longer."""
    prompt = TOK.encode('Fix: print("a\\n")\n' + CODE)
    d = suffix_from_spec("suffix", tokenizer=TOK)
    d.prefill(prompt)
    seq = prompt + TOK.encode('print("a\\n")\n' + 'def add(a, b):\n    """Sum of "a" and b."""\n    return a')
    assert propose(d, seq) == " + b\npri"  # the raw prompt, then the answer's own start
    assert d._views is not None  # the escaped spelling was there to compete


TIE_PROMPT = TOK.encode('Fix: print("a\\n")\n' + CODE + "Thanks!\n")


@pytest.mark.parametrize("answer, expected", [
    ('{"content": "def add(a, b):\\n    \\"\\"\\"Sum of \\"a\\" and b.\\"\\"\\"\\n    return a + b', "\\nTh"),
    ('print("a\\n")\ndef add(a, b):\n    """Sum of "a" and b."""\n    return a + b', "\nTha"),
])
def test_a_tie_beyond_the_tries_depth_goes_to_the_spelling_the_answer_writes(answer, expected):
    """Depth 8: both spellings match the answer's last 7 tokens (the deepest match a trie of depth 8 holds) and
    offer 4-token chains, a tie on score and on match length. An answer writing escaped text (its last escape after its
    last raw newline) drafts the escaped spelling; one writing raw text (the code edit, after its escaped ``\\n``)
    drafts the raw one."""
    d = suffix_from_spec("suffix:depth=8", tokenizer=TOK)
    d.prefill(TIE_PROMPT)
    assert propose(d, TIE_PROMPT + TOK.encode(answer)) == expected
    assert d._views is not None


def test_a_tie_goes_to_the_raw_spelling_where_it_matches_further_back():
    """Raw code with a backslash in a string (``"\\t"``): the answer's last backslash came after its last newline,
    but the raw prompt matches its end 7 tokens back (depth 8's deepest) and the escaped one 6 (it has ``\\"``
    where the answer has ``"``); both offer 4-token chains, and the raw continuation is drafted."""
    prompt = TOK.encode('Fix:\nx = "abcde"\ny = 2\n')
    d = suffix_from_spec("suffix:depth=8", tokenizer=TOK)
    d.prefill(prompt)
    assert propose(d, prompt + TOK.encode('q = "\\t"; x = "abcde')) == '"\ny '
    assert d._views is not None and d._spelling == "escaped"


def test_a_raw_answer_copies_an_escaped_tool_result():
    prompt = TOK.encode("Tool result: " + json.dumps({"content": CODE}) + "\nNow write the function again.\n")
    seq = prompt + TOK.encode('def add(a, b):\n    """Sum of "a"')
    with_views, without = suffix_from_spec("suffix", tokenizer=TOK), suffix_from_spec("suffix:views=0", tokenizer=TOK)
    for d in (with_views, without):
        d.prefill(prompt)
    assert propose(with_views, seq) == ' and b."'
    assert len(propose(without, seq)) <= 1  # only a one-token match in the escaped prompt


def test_views_are_per_request_and_kept_by_copies():
    d = suffix_from_spec("suffix", tokenizer=TOK)
    d.prefill(PROMPT)
    propose(d, PROMPT + TOK.encode('{"content": "def add(a, b):\\n'))
    assert d._views is not None
    d.prefill(TOK.encode("another prompt\n"))
    assert d._views is None
    for copy in (d.for_sequence(1), d.with_partition("k"), with_own_cache(d)):
        assert copy.tokenizer is TOK and copy.views and copy._respell._texts is d._respell._texts
    assert not suffix_from_spec("suffix:views=0", tokenizer=TOK).for_sequence(0).views


@pytest.mark.parametrize("answer", ['{"content": "x\\n', "no escape here"])
def test_no_views_without_a_tokenizer(answer):
    d = SuffixDrafter()
    d.prefill(PROMPT)
    propose(d, PROMPT + TOK.encode(answer))
    assert d._views is None
