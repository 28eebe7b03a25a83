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

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, new_ids: Sequence[int]) -> int:
        """Append tokens; return how many of them to keep (fewer than ``len(new_ids)`` iff a stop string ended)."""
        if self.stopped:
            return 0
        searched = max(0, len(self.text) - max((len(s) for s in self.stop), default=0) + 1)
        self.ids.extend(new_ids)
        self.text = self._decode(self.ids)
        if not self.stop or self._find_stop(self.text, searched) < 0:
            return len(new_ids)
        # Keep the fewest tokens whose text already contains the stop string.
        first_new = len(self.ids) - len(new_ids)
        for keep in range(1, len(new_ids) + 1):
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
