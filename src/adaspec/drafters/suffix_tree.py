"""Bounded-depth suffix trie with occurrence counts (the global cache of earlier responses built on it is
:mod:`adaspec.drafters.suffix_cache`).

The data structure of SuffixDecoding (Oliaro et al. 2024, "SuffixDecoding: Extreme Speculative Decoding for
Emerging AI Applications", arXiv 2411.04975; ArcticInference's ``SuffixTree``): every window
``t[i : i + max_depth]`` of every inserted sequence is a path from the root, and each node counts the windows that
pass through it. So the node of a pattern P (``len(P) <= max_depth``) counts the occurrences of P in the inserted
text, and ``count(child) / count(node)`` is how often P was followed by the child's token: the frequency-based
probability SuffixDecoding speculates with.

* Appending one token to a sequence costs O(max_depth) (:class:`TrieCursor`: the nodes of the sequence's last
  ``max_depth - 1`` suffixes are kept); inserting or removing a sequence of n tokens costs O(n · max_depth).
* Removal decrements the same counts insertion added and frees nodes whose count reaches 0, so after any series of
  inserts and removals the trie is exactly the trie of the sequences still held (tested against a brute-force
  matcher in ``tests/drafters/test_suffix_tree.py``).
* Layout: nodes are indices into flat arrays (count, depth, first child's token and index); a node with more than
  one child keeps the others in a small dict. A node costs about 33 bytes plus ~100 per extra child
  (:meth:`SuffixTrie.memory_bytes`); text never seen before adds up to ``max_depth`` nodes per token, repeated
  text adds none.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Sequence

from adaspec.errors import ConfigError

MAX_DEPTH_LIMIT = 64
"""The deepest trie accepted (ArcticInference's default depth): deeper tries cost memory for little gain."""


class SuffixTrie:
    """Windows of up to ``max_depth`` tokens of the inserted sequences, with counts (see the module docstring).

    Args:
        max_depth: window length, 1..:data:`MAX_DEPTH_LIMIT`; bounds the match length plus the speculation length.

    Raises:
        ConfigError: ``max_depth`` out of range.
    """

    ROOT = 0

    def __init__(self, max_depth: int = 24) -> None:
        if not 1 <= max_depth <= MAX_DEPTH_LIMIT:
            raise ConfigError(f"suffix tree max_depth must be in 1..{MAX_DEPTH_LIMIT}, got {max_depth}")
        self.max_depth = max_depth
        self.count = array("q", [0])  # windows through the node (root: all windows)
        self.depth = array("b", [0])
        self.tok1 = array("q", [-1])  # first child's token (-1: no child)
        self.kid1 = array("q", [-1])  # first child's node
        self.more: dict[int, dict[int, int]] = {}  # node -> {token: child} for children after the first
        self._free: list[int] = []

    # Nodes ------------------------------------------------------------------------------------------------------
    def child(self, node: int, token: int) -> int:
        """The child of ``node`` for ``token``, or -1."""
        if self.tok1[node] == token:
            return self.kid1[node]
        extra = self.more.get(node)
        return extra.get(token, -1) if extra else -1

    def children(self, node: int) -> list[tuple[int, int]]:
        """``[(token, child), ...]`` of ``node``, most frequent first (ties: smaller token id first)."""
        if self.tok1[node] < 0:
            return []
        out = [(self.tok1[node], self.kid1[node])]
        extra = self.more.get(node)
        if extra:
            out += extra.items()
            count = self.count
            out.sort(key=lambda tc: (-count[tc[1]], tc[0]))
        return out

    def _new(self, parent: int, token: int) -> int:
        depth = self.depth[parent] + 1
        if self._free:
            node = self._free.pop()
            self.count[node], self.depth[node], self.tok1[node], self.kid1[node] = 0, depth, -1, -1
        else:
            node = len(self.count)
            self.count.append(0)
            self.depth.append(depth)
            self.tok1.append(-1)
            self.kid1.append(-1)
        if self.tok1[parent] < 0:
            self.tok1[parent], self.kid1[parent] = token, node
        else:
            self.more.setdefault(parent, {})[token] = node
        return node

    def _unlink(self, parent: int, token: int) -> None:
        if self.tok1[parent] == token:
            extra = self.more.get(parent)
            if extra:  # promote another child to the first slot
                t, c = extra.popitem()
                self.tok1[parent], self.kid1[parent] = t, c
                if not extra:
                    del self.more[parent]
            else:
                self.tok1[parent], self.kid1[parent] = -1, -1
        else:
            extra = self.more[parent]
            del extra[token]
            if not extra:
                del self.more[parent]

    def _release(self, node: int) -> None:
        self.tok1[node], self.kid1[node] = -1, -1
        self.more.pop(node, None)
        self._free.append(node)

    # Sequences --------------------------------------------------------------------------------------------------
    def step(self, active: list[int], token: int) -> list[int]:
        """Append ``token`` to a sequence whose open windows end at the nodes ``active`` (the sequence's last
        suffixes shorter than ``max_depth``, root excluded); returns the new ``active``. O(max_depth)."""
        count, depth, limit = self.count, self.depth, self.max_depth
        count[self.ROOT] += 1  # a new window starts here
        nxt = []
        for node in (self.ROOT, *active):
            c = self.child(node, token)
            if c < 0:
                c = self._new(node, token)
            count[c] += 1
            if depth[c] < limit:
                nxt.append(c)
        return nxt

    def insert(self, tokens: Iterable[int]) -> None:
        """Insert every window of ``tokens``. O(len · max_depth)."""
        active: list[int] = []
        for t in tokens:
            active = self.step(active, int(t))

    def remove(self, tokens: Sequence[int]) -> None:
        """Remove a sequence inserted before with :meth:`insert` (the same tokens): every count it added is taken
        back and nodes left with no window are freed.

        Raises:
            ValueError: ``tokens`` were not inserted (a window's path is missing); the trie is then unchanged up
                to the windows already removed, so callers must only remove what they inserted.
        """
        count, n, d = self.count, len(tokens), self.max_depth
        for i in range(n):
            node, path = self.ROOT, []
            for t in tokens[i:i + d]:
                node = self.child(node, int(t))
                if node < 0:
                    raise ValueError("removing a sequence that is not in the suffix tree")
                path.append((node, int(t)))
            count[self.ROOT] -= 1
            parent = self.ROOT
            for j, (node, t) in enumerate(path):
                count[node] -= 1
                if count[node] == 0:  # every node below on the path reaches 0 too (child count <= parent count)
                    self._unlink(parent, t)
                    for dead, _ in path[j:]:
                        if dead != node:
                            count[dead] -= 1
                        self._release(dead)
                    break
                parent = node

    def find(self, pattern: Sequence[int]) -> int:
        """The node of ``pattern`` (its occurrences), or -1 when it does not occur; the root for an empty one."""
        node = self.ROOT
        for t in pattern:
            node = self.child(node, t)
            if node < 0:
                return -1
        return node

    def matches(self, context: Sequence[int], max_len: int | None = None) -> list[tuple[int, int]]:
        """``[(m, node), ...]`` for every m >= 1 such that the last m tokens of ``context`` occur, shortest first
        (the lengths that match are 1..longest: every suffix of an occurring pattern occurs). O(max_depth²)."""
        out = []
        limit = min(len(context), self.max_depth - 1 if max_len is None else max_len)
        for m in range(1, limit + 1):
            node = self.find(context[len(context) - m:])
            if node < 0:
                break
            out.append((m, node))
        return out

    # Accounting ---------------------------------------------------------------------------------------------------
    @property
    def nodes(self) -> int:
        """Live nodes, root included."""
        return len(self.count) - len(self._free)

    @property
    def windows(self) -> int:
        """Windows held (one per inserted token)."""
        return self.count[self.ROOT]

    def memory_bytes(self) -> int:
        """Bytes held by the trie: its arrays (allocated slots, freed ones included), the extra-children dicts and
        the free list (dict and list sizes by ``sys.getsizeof``, plus 32 bytes per int object they hold)."""
        arrays = sum(a.buffer_info()[1] * a.itemsize for a in (self.count, self.depth, self.tok1, self.kid1))
        extra = sys.getsizeof(self.more) + sum(sys.getsizeof(d) + 64 * len(d) + 32 for d in self.more.values())
        return arrays + extra + sys.getsizeof(self._free)


class TrieCursor:
    """A sequence being appended to a :class:`SuffixTrie` one token at a time (a request's prompt and output)."""

    def __init__(self, trie: SuffixTrie) -> None:
        self.trie = trie
        self.active: list[int] = []
        self.length = 0

    def extend(self, tokens: Iterable[int]) -> None:
        trie = self.trie
        active = self.active
        for t in tokens:
            active = trie.step(active, int(t))
            self.length += 1
        self.active = active
