"""A backend wrapper that keeps the KV cache of a shared prompt prefix across ``reset()``: the prefill of a prompt run
by several methods (``adaspec bench``, ``adaspec compare``, ``adaspec profile``) is paid once, and ``adaspec serve``
(one request at a time) prefills only what a request does not share with the sequence before it (automatic prefix
caching, as vLLM's and llama-server's)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from adaspec.backends.base import Backend, CacheSnapshot
from adaspec.chunking import common_prefix


@dataclass(frozen=True)
class _Stored:
    """A stored copy of an earlier sequence: whose it was, its token ids, the copy of its cache."""

    owner: str | None
    ids: list[int]
    snap: CacheSnapshot


class PrefixCacheBackend(Backend):
    """Wraps a backend so that a new sequence sharing a prefix with the cached one reuses its KV cache.

    ``reset()`` only marks the cache as reusable; the next ``forward`` keeps the longest common prefix (leaving at
    least the positions whose logits are asked for) and runs the rest. The KV values of a reused prefix are the
    ones computed before, so every run of a group sees the same prompt cache.

    With ``record_top2`` set to a list, each forward appends ``(top1, top2)`` of its last logits row (used to find
    the target's second choice along a plain greedy run).

    A reused prefix holds the keys and values as they were computed then (by a prefill, or by the decoding steps of
    the sequence before): bit-identical to a cold prefill only where the runtime's kernels do not depend on how
    many positions a forward holds. With ``strict_cold`` a sequence started in strict mode (``batch_invariant``
    set before its first forward) is prefilled cold, so its output never depends on what ran before (the server
    sets it; the comparisons share one cold prefill per prompt, so every method starts from the same cache).
    If the inner cache was changed behind the wrapper (its ``seq_len`` disagrees), or a forward fails, the next
    sequence starts cold. ``owner`` names whose sequence starts next (the server sets a request's API-key
    partition): a sequence reuses only a cache its own owner left, so a prompt's prefill time never tells a client
    what another key's prompts held.

    With ``store_bytes`` > 0 (and a backend that ``supports_snapshots``), a sequence about to be cut or replaced is
    first copied into a store of at most ``store_bytes`` bytes (least recently used copies evicted first), and a new
    sequence starts from whichever holds the longer prefix of its ids: the cached sequence or a stored copy of the
    same owner, put back with :meth:`~adaspec.backends.base.Backend.restore` (as llama-server's prompt cache in RAM,
    ``--cache-ram``). Interleaved sessions (agents, several system prompts) then each find their own prefix. A copy
    that cannot be taken is skipped; one that cannot be put back is dropped and the sequence prefills cold.

    Args:
        inner: the backend whose sequence-0 cache is kept.
        strict_cold: prefill strict sequences cold (above).
        store_bytes: bytes of stored copies at most (0: the cached sequence only).

    Raises:
        ValueError: ``store_bytes`` < 0.
    """

    def __init__(self, inner: Backend, strict_cold: bool = False, store_bytes: int = 0) -> None:
        if store_bytes < 0:
            raise ValueError(f"store_bytes must be >= 0, got {store_bytes}")
        self.inner = inner
        self.strict_cold = strict_cold
        self.store_bytes = store_bytes if inner.supports_snapshots else 0
        self.owner: str | None = None
        self._owner: str | None = None  # the owner of the cached sequence
        self.name = inner.name
        self.vocab_size = inner.vocab_size
        self.max_context = inner.max_context
        self._ids: list[int] = []
        self._fresh = False  # reset() was called: the next forward starts a new sequence
        self._tree_from: int | None = None  # cached ids before a pending tree (forward_tree, grow_tree)
        self._store: list[_Stored] = []  # copies of earlier sequences, least recently used first
        self.reused_tokens = 0
        self.restored = False  # the last sequence started from a stored copy
        self.record_top2: list[tuple[int, int]] | None = None

    @property
    def seq_len(self) -> int:
        return 0 if self._fresh else len(self._ids)

    @property
    def stored_bytes(self) -> int:
        """Host memory the stored copies hold, in bytes (at most ``store_bytes``)."""
        return sum(e.snap.nbytes for e in self._store)

    @property
    def stored_sequences(self) -> int:
        return len(self._store)

    @property
    def supports_batch_invariance(self) -> bool:
        return self.inner.supports_batch_invariance

    @property
    def batch_invariant(self) -> bool:
        return self.inner.batch_invariant

    @batch_invariant.setter
    def batch_invariant(self, on: bool) -> None:
        self.inner.batch_invariant = on

    def forward(self, input_ids: Sequence[int], num_logits: int = 1) -> torch.Tensor:
        ids = [int(t) for t in input_ids]
        if self._fresh:
            ids = self._start(ids, num_logits)
        with self._cold_on_failure():
            logits = self.inner.forward(ids, num_logits)
        self._ids.extend(ids)
        if self.record_top2 is not None:
            top = logits[-1].float().topk(2).indices.tolist()
            self.record_top2.append((top[0], top[1]))
        return logits

    def _start(self, ids: list[int], num_logits: int) -> list[int]:
        """The first forward of a sequence: keep the longest prefix of ``ids`` that the cached sequence or a stored
        copy of the same owner holds (never the positions whose logits are asked for); returns the ids to run."""
        self._fresh = False
        self.restored = False
        if self.inner.seq_len != len(self._ids):  # the cache was used behind this wrapper: what it holds is unknown
            self.inner.reset()
            self._ids = []
        cold = self.strict_cold and self.inner.batch_invariant
        limit = len(ids) - num_logits
        live = 0 if cold or self.owner != self._owner else common_prefix(self._ids, ids, limit)
        mine = [] if cold else [e for e in self._store if e.owner == self.owner]
        best, n = max(((e, common_prefix(e.ids, ids, limit)) for e in mine), key=lambda pair: pair[1],
                      default=(None, 0))
        if len(self._ids) > live:  # the cached sequence is about to be cut or replaced: keep a copy of it
            self._stash(keep=best if n > live else None)
        if n > live or cold or self.owner != self._owner:
            self.inner.reset()
            self._ids = []
        if n > live:
            self._store.remove(best)
            try:
                self.inner.restore(best.snap)
            except Exception:  # the copy cannot go back (no room?): dropped, and this sequence prefills cold
                self.inner.reset()
                n = 0
            else:
                self._store.append(best)  # most recently used
                self._ids = list(best.ids)
                self.restored = True
        else:
            n = live
        self._owner = self.owner
        try:
            self.inner.truncate(n)
        except Exception:  # a cache that cannot be cut there (a sliding window past its size): start cold
            n = 0
            self.inner.reset()
        del self._ids[n:]
        self.reused_tokens = n
        return ids[n:]

    def _stash(self, keep: _Stored | None = None) -> None:
        """Keep a copy of the cached sequence in the store (within ``store_bytes``, least recently used copies
        evicted first, never ``keep``: the copy about to be put back). A copy whose ids the sequence extends is
        replaced; a copy that already extends the sequence makes this one unnecessary. A copy that fails, or that
        cannot fit beside ``keep``, is skipped: the store is an optimisation."""
        if not self.store_bytes or not self._ids or self._tree_from is not None:
            return
        mine = [e for e in self._store if e.owner == self._owner]
        if any(e.ids[:len(self._ids)] == self._ids for e in mine):
            return
        room = self.store_bytes - (keep.snap.nbytes if keep is not None else 0)
        try:
            if len(self._ids) * self.inner.kv_bytes_per_token() > room:
                return  # cannot fit: not worth copying
        except NotImplementedError:
            pass
        try:
            snap = self.inner.snapshot()
        except Exception:
            return
        if snap.nbytes > room:
            return
        self._store = [e for e in self._store if e is keep or not (e.owner == self._owner
                                                                    and self._ids[:len(e.ids)] == e.ids)]
        self._store.append(_Stored(self._owner, list(self._ids), snap))
        while self.stored_bytes > self.store_bytes:
            self._store.remove(next(e for e in self._store if e is not keep))

    @property
    def supports_trees(self) -> bool:  # type: ignore[override]
        return self.inner.supports_trees

    @property
    def max_tree_nodes(self) -> int:
        return self.inner.max_tree_nodes

    def forward_tree(self, input_ids: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """The inner backend's :meth:`~adaspec.backends.base.Backend.forward_tree` (a tree always follows a prefill,
        never a reset), with the cached ids kept in step."""
        if self._fresh:
            raise ValueError("forward_tree after reset needs a prefill first")
        with self._cold_on_failure():
            logits = self.inner.forward_tree(input_ids, parents)
        if self._tree_from is None:  # the nodes are not a sequence: a reset before keep_tree_path drops them
            self._tree_from = len(self._ids)
        self._ids.extend(int(t) for t in input_ids)
        return logits

    @property
    def supports_tree_growth(self) -> bool:  # type: ignore[override]
        return self.inner.supports_tree_growth

    def grow_tree(self, input_ids: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """The inner backend's :meth:`~adaspec.backends.base.Backend.grow_tree`, with the cached ids kept in step (a
        grown tree's nodes follow the ids it was grown after, in order, as :meth:`keep_tree_path` expects)."""
        if self._fresh:
            raise ValueError("grow_tree after reset needs a prefill first")
        if self._tree_from is None:
            self._tree_from = len(self._ids)
        with self._cold_on_failure():
            logits = self.inner.grow_tree(input_ids, parents)
        self._ids.extend(int(t) for t in input_ids)
        return logits

    def keep_tree_path(self, base: int, path: Sequence[int]) -> None:
        with self._cold_on_failure():
            self.inner.keep_tree_path(base, path)
        self._tree_from = None
        nodes = self._ids[base:]
        self._ids[base:] = [nodes[p] for p in path]

    def truncate(self, length: int) -> None:
        if self._fresh:
            if length == 0:
                return
            raise ValueError("truncate after reset needs a forward first")
        with self._cold_on_failure():
            self.inner.truncate(length)
        self._tree_from = None
        del self._ids[length:]

    def reset(self) -> None:
        if self._tree_from is not None:  # a tree is pending (a forward failed before keep_tree_path): drop its nodes
            self.truncate(self._tree_from)
        self._fresh = True

    def drop(self) -> None:
        """Really empty the cached sequence (the next prefill does not reuse it; stored copies are kept)."""
        self.inner.reset()
        self._ids = []
        self._fresh = False

    @contextmanager
    def _cold_on_failure(self):
        """Around anything that changes the inner cache: if it fails, what reached the cache is unknown (a model
        may append some layers' keys and values and not its length), so the cache is emptied and the next
        sequence prefills cold."""
        try:
            yield
        except BaseException:
            try:
                self.drop()
            except Exception:  # the inner backend is broken too: the seq_len check of the next prefill starts cold
                self._ids, self._fresh = [], False
            self._tree_from = None
            raise

    def synchronize(self) -> None:
        self.inner.synchronize()

    def set_threads(self, threads: int) -> None:
        self.inner.set_threads(threads)

    def weight_bytes(self) -> int:
        return self.inner.weight_bytes()

    def kv_bytes_per_token(self) -> int:
        return self.inner.kv_bytes_per_token()
