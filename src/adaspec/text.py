"""Incremental detokenisation with stop strings, for streaming.

Stop strings follow the OpenAI / vLLM convention: generation ends at the first occurrence of any stop string, the
stop string itself is not part of the returned text, and no token after the one that completed it is emitted. A
stop string may span tokens from different speculation steps.
"""

from __future__ import annotations

from collections.abc import Sequence


class TextStream:
    """Turns a growing list of generated token ids into text deltas, holding back text that is not final.

    Held back: a trailing U+FFFD (an incomplete UTF-8 sequence) and any suffix that could be the start of a stop
    string. Decoding uses ``skip_special_tokens=True``.

    Detokenisation is incremental, as vLLM's and Hugging Face's streaming detokenisers do: the text of the tokens
    up to ``_read`` is kept (``_stable``), and each push decodes only a window from ``_prefix`` (the tokens of the
    last committed piece, kept as context so leading-space and merge rules decode as in the whole sequence) to the
    end; the new text is the window's text minus the context's. A piece is committed once it does not end in an
    incomplete character. So a push costs the window's length, not the whole output's (which made streaming
    quadratic in the output length). Where a tokenizer's window text does not extend its context's text, the push
    falls back to decoding everything.

    Args:
        tokenizer: a Hugging Face tokenizer (``decode``).
        stop: stop strings (empty strings are ignored).
    """

    def __init__(self, tokenizer, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.ids: list[int] = []
        self.text = ""  # decoded text of self.ids (up to a stop string, once one was found)
        self.emitted = 0  # characters of self.text already returned as deltas
        self.stopped = False
        self._prefix = 0  # window start: the context tokens of the last committed piece
        self._read = 0  # tokens whose text is committed in _stable
        self._stable = ""

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _text_upto(self, end: int, context: str) -> str | None:
        """The text of ``self.ids[:end]`` (``end >= _read``) from the window; None when the window's text does not
        extend ``context`` (the text of the window's context tokens)."""
        window = self._decode(self.ids[self._prefix:end])
        if not window.startswith(context):
            return None
        return self._stable + window[len(context):]

    def _commit(self) -> None:
        """Commit the text so far when it ends on a whole character: the next window starts at the new tokens."""
        if self.text.endswith("\ufffd"):
            return
        self._stable = self.text
        self._prefix, self._read = self._read, len(self.ids)

    def push(self, new_ids: Sequence[int]) -> int:
        """Append tokens; return how many of them to keep (fewer than ``len(new_ids)`` iff a stop string ended)."""
        if self.stopped:
            return 0
        searched = max(0, len(self.text) - max((len(s) for s in self.stop), default=0) + 1)
        first_new = len(self.ids)
        self.ids.extend(new_ids)
        context = self._decode(self.ids[self._prefix:self._read]) if self._read > self._prefix else ""
        text = self._text_upto(len(self.ids), context)
        if text is None:  # the window does not decode as part of the whole: decode everything from now on
            context, self._prefix, self._read, self._stable = "", 0, 0, ""
            text = self._decode(self.ids)
        self.text = text
        if not self.stop or self._find_stop(self.text, searched) < 0:
            self._commit()
            return len(new_ids)
        # Keep the fewest tokens whose text already contains the stop string.
        for keep in range(1, len(new_ids) + 1):
            text = self._text_upto(first_new + keep, context)
            if text is None:
                text = self._decode(self.ids[:first_new + keep])
            at = self._find_stop(text, searched)
            if at >= 0:
                del self.ids[first_new + keep:]
                self.text = text[:at]
                self.stopped = True
                return keep
        raise AssertionError("unreachable: the stop string was found in the full text")

    def _find_stop(self, text: str, start: int) -> int:
        hits = [i for i in (text.find(s, start) for s in self.stop) if i >= 0]
        return min(hits) if hits else -1

    def delta(self, final: bool = False) -> str:
        """Text that became final since the last call (everything left when ``final``)."""
        end = len(self.text)
        if not final and not self.stopped:
            if self.text.endswith("\ufffd"):
                end -= 1
            for s in self.stop:  # hold back a suffix that may grow into a stop string
                for n in range(min(len(s) - 1, end), 0, -1):
                    if self.text[end - n:end] == s[:n]:
                        end -= n
                        break
        end = max(end, self.emitted)
        out = self.text[self.emitted:end]
        self.emitted = end
        return out
