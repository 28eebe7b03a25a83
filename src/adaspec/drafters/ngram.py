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
    lookup = True

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
                self._record(tuple(ids[end - n:end]), end)
        self._indexed = max(self._indexed, len(ids))

    def _record(self, key: tuple[int, ...], end: int) -> None:
        """Index one occurrence of n-gram ``key`` whose continuation starts at ``end`` (the latest one wins)."""
        self._index[key] = end

    def available(self, ids: list[int]) -> int:
        """The length of the continuation after the longest match of ``ids``' suffix (0: no match)."""
        n, start = self.match(ids)
        return len(ids) - start if n else 0

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


class NgramTreeDrafter(NgramDrafter):
    """Prompt lookup with branches: every earlier occurrence of the sequence's suffix proposes its continuation,
    and continuations that differ become branches of one token tree (:mod:`adaspec.tree`), verified in one target
    forward. Chains (:meth:`propose`) are the plain n-gram drafter's (latest occurrence).

    Occurrences are taken longest suffix first, most recent first, and merged into a trie until the node budget is
    spent; a partly inserted continuation keeps its prefix. Code edits and templated text repeat a prefix with
    several different continuations, which is where branches pay.

    Args:
        max_ngram, min_ngram: as :class:`NgramDrafter` (default 4 and 1).
        max_matches: occurrences considered per lookup (most recent first).
    """

    name = "ngram-tree"
    free_trees = True

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, max_matches: int = 16) -> None:
        super().__init__(max_ngram, min_ngram)
        self.max_matches = max_matches
        self._all: dict[tuple[int, ...], list[int]] = {}  # n-gram -> continuation positions, oldest first

    def for_sequence(self, seq: int) -> NgramTreeDrafter:
        return NgramTreeDrafter(self.max_ngram, self.min_ngram, self.max_matches)

    def prefill(self, prompt_ids: list[int]) -> None:
        super().prefill(prompt_ids)
        self._all.clear()

    def _record(self, key: tuple[int, ...], end: int) -> None:
        super()._record(key, end)
        self._all.setdefault(key, []).append(end)  # every occurrence, not only the latest

    def propose_tree(self, ids: list[int], depth: int, budget: int, sampling: SamplingParams,
                     generator: torch.Generator | None = None, expand: int | None = None) -> Draft:
        if depth <= 0 or budget <= 0:
            return empty_draft()
        self._extend_index(ids)
        starts: list[int] = []  # longest suffix first, most recent first
        for n in range(min(self.max_ngram, len(ids)), self.min_ngram - 1, -1):
            for start in reversed(self._all.get(tuple(ids[-n:]), ())):
                if len(starts) == self.max_matches:
                    break
                if start not in starts:
                    starts.append(start)
        tokens: list[int] = []
        parents: list[int] = []
        children: dict[int, dict[int, int]] = {}
        for start in starts:
            node = -1
            for t in ids[start:start + depth]:
                nxt = children.setdefault(node, {}).get(t)
                if nxt is None:
                    if len(tokens) == budget:
                        break
                    nxt = len(tokens)
                    tokens.append(t)
                    parents.append(node)
                    children[node][t] = nxt
                node = nxt
            if len(tokens) == budget:
                break
        if not tokens:
            return empty_draft()
        return Draft(torch.tensor(tokens, dtype=torch.long), parents=parents)
