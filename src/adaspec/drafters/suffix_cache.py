"""The global tree of SuffixDecoding: earlier finished responses, in partitions, within one token budget.

SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975) drafts from a suffix tree over earlier responses. Here that
tree is one :class:`~adaspec.drafters.suffix_tree.SuffixTrie` per **partition**: a server puts each API key's
responses in a partition of their own (:mod:`adaspec.server.suffix_partitions`), so a request never drafts from
text that another key's requests wrote; the Python API uses the partition ``""``.

* **Budget.** ``max_tokens`` counts the cached tokens of all partitions together; memory is about
  :meth:`SuffixCache.bytes_per_token` times that (at most ``max_depth`` trie nodes per token).
* **Eviction.** When a new response does not fit, whole responses are evicted: the oldest response of the least
  recently used partition first (LRU over partitions, FIFO within one, as ArcticInference evicts). A partition is
  used when a request of it starts (:meth:`SuffixCache.touch`) or writes (:meth:`SuffixCache.add`), so a key whose
  requests keep coming keeps its text while idle keys' text goes first. A partition left with no response is
  dropped. Eviction takes back exactly the counts insertion added (tested against a brute-force matcher).
* **Only whole responses.** :meth:`SuffixCache.add` takes a finished response at once; a cancelled request never
  calls it, so nothing half-written is ever cached.
* Not thread-safe: a server calls it from its generation thread only.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict, deque
from collections.abc import Sequence

from adaspec.drafters.suffix_tree import SuffixTrie
from adaspec.errors import ConfigError


class SuffixCache:
    """Earlier finished responses in a :class:`SuffixTrie` per partition, within one token budget (see the module
    docstring for the eviction order).

    Args:
        max_tokens: cached tokens at most, over all partitions (0 disables the cache: nothing is kept).
        max_depth: window length of the tries (see :class:`SuffixTrie`).

    Raises:
        ConfigError: ``max_tokens`` < 0 or ``max_depth`` out of range.
    """

    def __init__(self, max_tokens: int = 100_000, max_depth: int = 24) -> None:
        if max_tokens < 0:
            raise ConfigError(f"suffix cache max_tokens must be >= 0, got {max_tokens}")
        SuffixTrie(max_depth)  # validates max_depth
        self.max_tokens = max_tokens
        self.max_depth = max_depth
        self.tries: dict[str, SuffixTrie] = {}
        self._held: OrderedDict[str, deque[array]] = OrderedDict()  # partition -> its responses; LRU first
        self.tokens = 0  # tokens held, all partitions
        self.responses = 0  # responses held, all partitions
        self.evicted = 0  # responses evicted so far
        self.version = 0  # changes whenever the held text does

    def trie(self, partition: str = "") -> SuffixTrie | None:
        """The partition's trie, or None when it holds nothing."""
        return self.tries.get(partition)

    def touch(self, partition: str = "") -> None:
        """A request of ``partition`` starts: it becomes the most recently used (evicted last)."""
        if partition in self._held:
            self._held.move_to_end(partition)

    def add(self, tokens: Sequence[int], partition: str = "") -> None:
        """Cache a finished response (the whole of it at once; a response longer than the budget keeps its last
        ``max_tokens`` tokens), evicting responses (least recently used partition first) until it fits."""
        self.touch(partition)
        if not self.max_tokens or not len(tokens):
            return
        kept = array("q", [int(t) for t in tokens[-self.max_tokens:]])
        while self.tokens + len(kept) > self.max_tokens:
            self._evict()
        trie = self.tries.get(partition)
        if trie is None:
            trie = self.tries[partition] = SuffixTrie(self.max_depth)
            self._held[partition] = deque()
        trie.insert(kept)
        self._held[partition].append(kept)
        self.version += 1
        self.tokens += len(kept)
        self.responses += 1

    def _evict(self) -> None:
        """Evict the oldest response of the least recently used partition."""
        partition, held = next(iter(self._held.items()))
        tokens = held.popleft()
        trie = self.tries[partition]
        trie.remove(tokens)
        self.tokens -= len(tokens)
        self.responses -= 1
        self.evicted += 1
        self.version += 1
        if not held:
            del self._held[partition], self.tries[partition]

    def clear(self) -> None:
        self.version += 1
        self.tries.clear()
        self._held.clear()
        self.tokens = self.responses = 0

    @property
    def partitions(self) -> list[str]:
        """Partitions holding text, least recently used first."""
        return list(self._held)

    def partition_tokens(self, partition: str = "") -> int:
        """Tokens held by ``partition``."""
        return sum(len(a) for a in self._held.get(partition, ()))

    def memory_bytes(self) -> int:
        """Bytes held: every partition's trie (:meth:`SuffixTrie.memory_bytes`) plus the kept response tokens (8
        bytes each, needed to evict them exactly)."""
        return (sum(t.memory_bytes() for t in self.tries.values())
                + sum(a.buffer_info()[1] * a.itemsize for held in self._held.values() for a in held))

    def bytes_per_token(self) -> float:
        """:meth:`memory_bytes` per cached token (0.0 when empty)."""
        return self.memory_bytes() / self.tokens if self.tokens else 0.0
