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
import weakref
from collections.abc import Sequence

_JSON_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*(?:"|\\?$)', re.MULTILINE)
"""A JSON string literal on one line (escapes allowed, never a raw newline), or an unterminated one to the end of its
line (a lone backslash there included): consuming the unterminated tail keeps the scan linear (each quote inside it
would otherwise start a new try that scans to the line's end)."""

MIN_UNESCAPED_CHARS = 16
"""Shorter JSON strings in a prompt are not re-spelt (a key, a short value: nothing worth copying)."""


class TextViews:
    """A tokenizer's re-spellings of prompts (see the module docstring).

    Args:
        tokenizer: a Hugging Face tokenizer, or anything with ``encode(text, add_special_tokens=False)`` and
            ``decode(ids, skip_special_tokens=True)``.
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._texts = _texts_of(tokenizer)  # token id -> its text alone (decoded once per tokenizer)

    def token_text(self, token: int) -> str:
        """The text of one token (a byte-fallback or partial UTF-8 token decodes to its replacement character; an id
        the tokenizer cannot decode, e.g. a padded vocabulary's, to "")."""
        text = self._texts.get(token)
        if text is None:
            try:
                text = self.tokenizer.decode([token], skip_special_tokens=True)
            except (IndexError, KeyError, ValueError, TypeError, OverflowError):
                text = ""
            self._texts[token] = text
        return text

    def has_escape(self, ids: Sequence[int]) -> bool:
        """Whether any of ``ids`` is a token with a backslash in its text."""
        return any("\\" in self.token_text(t) for t in ids)

    def spelling(self, ids: Sequence[int], current: str = "") -> str:
        """The spelling ``ids`` end in: ``"escaped"`` where their last backslash comes after their last raw newline,
        ``"raw"`` where the newline comes last, else (neither) ``current``."""
        for t in reversed(ids):
            text = self.token_text(t)
            slash, newline = text.rfind("\\"), text.rfind("\n")
            if slash > newline:
                return "escaped"
            if newline > slash:
                return "raw"
        return current

    def text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def escaped(self, ids: Sequence[int]) -> list[int]:
        """Token ids of the text of ``ids`` as the body of a JSON string (``json.dumps``: ``\\n``, ``\\"``, ``\\\\``,
        ``\\t`` and the other control characters escaped, the rest as it is); [] when escaping changes nothing."""
        text = self.text(ids)
        body = json.dumps(text, ensure_ascii=False)[1:-1]
        return [] if body == text else list(self.tokenizer.encode(body, add_special_tokens=False))

    def unescaped(self, ids: Sequence[int]) -> list[list[int]]:
        """Token ids of each JSON string literal in the text of ``ids`` that holds an escape, decoded (at least
        :data:`MIN_UNESCAPED_CHARS` characters of text); unterminated or invalid literals are skipped."""
        out = []
        for m in _JSON_STRING.finditer(self.text(ids)):
            literal = m.group(0)
            if "\\" not in literal or len(literal) < 2 or not literal.endswith('"'):
                continue
            try:
                value = json.loads(literal)
            except ValueError:
                continue
            if len(value) >= MIN_UNESCAPED_CHARS:
                out.append(list(self.tokenizer.encode(value, add_special_tokens=False)))
        return out


_TEXTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _texts_of(tokenizer) -> dict[int, str]:
    """The per-token texts decoded so far for ``tokenizer``, shared by its :class:`TextViews` while it lives (held
    weakly: the cache keeps no tokenizer alive); a new dict for a tokenizer that cannot be weakly referenced."""
    try:
        texts = _TEXTS.get(tokenizer)
        if texts is None:
            texts = _TEXTS[tokenizer] = {}
    except TypeError:
        texts = {}
    return texts


def text_views_for(tokenizer) -> TextViews | None:
    """:class:`TextViews` of ``tokenizer`` (each tokenizer's per-token texts are decoded once and shared); None for
    None or a tokenizer without ``encode``/``decode``."""
    if tokenizer is None or not all(hasattr(tokenizer, a) for a in ("encode", "decode")):
        return None
    return TextViews(tokenizer)
