"""Other spellings of a prompt for lookup drafting: its text as it reads inside a JSON string, and the JSON strings
in it as the text they hold.

An agent writes a file through a tool call (``{"content": "def f(x):\\n    return x"}``) whose code is in its prompt
with real newlines and quotes; a tool result comes back JSON-escaped and the answer repeats its text raw. The two
spellings share no tokens at a newline or a quote, so a lookup over the prompt (prompt lookup, suffix decoding)
stops at the first one. :class:`TextViews` re-spells the prompt, and a lookup drafter
(:class:`~adaspec.drafters.suffix.SuffixDrafter`) matches those token sequences too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

_JSON_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
"""A JSON string literal on one line (the text between its quotes may hold escapes, never a raw newline)."""

MIN_UNESCAPED_CHARS = 16
"""Shorter JSON strings in a prompt are not re-spelt (a key, a short value: nothing worth copying)."""


class TextViews:
    """A tokenizer's re-spellings of prompts (see the module docstring).

    Args:
        tokenizer: a Hugging Face tokenizer (``decode``, ``encode``, ``get_vocab``) or anything with those methods.
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        #: ids of the tokens whose text holds a backslash: an answer holding one is writing escaped text
        self.escape_ids = frozenset(i for token, i in tokenizer.get_vocab().items() if "\\" in token)

    def has_escape(self, ids: Sequence[int]) -> bool:
        """Whether any of ``ids`` is a token with a backslash in its text."""
        return any(t in self.escape_ids for t in ids)

    def text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def escaped(self, ids: Sequence[int]) -> list[int]:
        """Token ids of the text of ``ids`` as the body of a JSON string (``\\n``, ``\\"``, ``\\\\``, ``\\t``; other
        characters as they are); [] when escaping changes nothing."""
        text = self.text(ids)
        body = json.dumps(text, ensure_ascii=False)[1:-1]
        return [] if body == text else list(self.tokenizer.encode(body, add_special_tokens=False))

    def unescaped(self, ids: Sequence[int]) -> list[list[int]]:
        """Token ids of each JSON string literal in the text of ``ids`` that holds an escape, decoded (at least
        :data:`MIN_UNESCAPED_CHARS` characters of text); literals that are not valid JSON are skipped."""
        out = []
        for m in _JSON_STRING.finditer(self.text(ids)):
            literal = m.group(0)
            if "\\" not in literal:
                continue
            try:
                value = json.loads(literal)
            except ValueError:
                continue
            if len(value) >= MIN_UNESCAPED_CHARS:
                out.append(list(self.tokenizer.encode(value, add_special_tokens=False)))
        return out


_BY_TOKENIZER: dict[int, tuple[object, TextViews]] = {}


def text_views_for(tokenizer) -> TextViews | None:
    """The :class:`TextViews` of ``tokenizer`` (built once per tokenizer: the vocabulary scan takes tens of
    milliseconds); None for None or a tokenizer without ``get_vocab``/``encode``/``decode``."""
    if tokenizer is None or not all(hasattr(tokenizer, a) for a in ("get_vocab", "encode", "decode")):
        return None
    held = _BY_TOKENIZER.get(id(tokenizer))
    if held is None or held[0] is not tokenizer:
        held = _BY_TOKENIZER[id(tokenizer)] = (tokenizer, TextViews(tokenizer))
    return held[1]
