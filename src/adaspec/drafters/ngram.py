"""N-gram prompt-lookup drafter: no model, proposes what followed the last n tokens earlier in the sequence.

Prompt lookup decoding (Saxena 2023, "Prompt Lookup Decoding"; transformers ``prompt_lookup_num_tokens``): find
the most recent earlier occurrence of the sequence's last n tokens in prompt + output, longest n first, and
propose the tokens that followed it. An incremental hash index makes each lookup O(max_ngram) instead of a scan.
"""

from __future__ import annotations

import torch

from adaspec.drafters.base import Draft, Drafter, DraftStop, empty_draft
from adaspec.errors import ConfigError
from adaspec.sampling import SamplingParams


class NgramDrafter(Drafter):
    """Prompt lookup over prompt + output.

    Args:
        max_ngram: longest suffix length tried first (default 3).
        min_ngram: shortest suffix length accepted as a match (default 1).

    Proposals are deterministic given the sequence, so :class:`Draft` carries no probabilities (the verifier
    treats q as one-hot).
    """

    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ConfigError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._index: dict[tuple[int, ...], int] = {}  # n-gram -> position right after its latest occurrence
        self._indexed = 0  # continuation positions < _indexed are in the index

    def for_sequence(self, seq: int) -> NgramDrafter:
        return NgramDrafter(self.max_ngram, self.min_ngram)

    def prefill(self, prompt_ids: list[int]) -> None:
        self._index.clear()
        self._indexed = 0

    def _extend_index(self, ids: list[int]) -> None:
        # Index every n-gram that ends before the last token, so the sequence's own suffix never matches itself.
        for end in range(max(self._indexed, 1), len(ids)):
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                self._index[tuple(ids[end - n:end])] = end
        self._indexed = max(self._indexed, len(ids))

    def match(self, ids: list[int]) -> tuple[int, int]:
        """Return ``(n, start)``: the longest matching suffix length and where its continuation starts, or (0, -1)."""
        self._extend_index(ids)
        for n in range(min(self.max_ngram, len(ids)), self.min_ngram - 1, -1):
            start = self._index.get(tuple(ids[-n:]))
            if start is not None:
                return n, start
        return 0, -1

    def propose(self, ids: list[int], k: int, sampling: SamplingParams, generator: torch.Generator | None = None,
                stop: DraftStop | None = None) -> Draft:
        if k <= 0:
            return empty_draft()
        n, start = self.match(ids)
        if n == 0:
            return empty_draft()
        return Draft(torch.tensor(ids[start:start + k], dtype=torch.long))
