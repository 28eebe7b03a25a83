"""A backend wrapper that keeps the KV cache of a shared prompt prefix across ``reset()``: the prefill of a prompt run
by several methods (``adaspec bench``, ``adaspec compare``, ``adaspec profile``) is paid once, and ``adaspec serve``
(one request at a time) prefills only what a request does not share with the sequence before it (automatic prefix
caching, as vLLM's and llama-server's)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager

import torch

from adaspec.backends.base import Backend


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
    """

    def __init__(self, inner: Backend, strict_cold: bool = False) -> None:
        self.inner = inner
        self.strict_cold = strict_cold
        self.owner: str | None = None
        self._owner: str | None = None  # the owner of the cached sequence
        self.name = inner.name
        self.vocab_size = inner.vocab_size
        self.max_context = inner.max_context
        self._ids: list[int] = []
        self._fresh = False  # reset() was called: the next forward starts a new sequence
        self._grown_from: int | None = None  # cached ids before a pending grown tree (grow_tree)
        self.reused_tokens = 0
        self.record_top2: list[tuple[int, int]] | None = None

    @property
    def seq_len(self) -> int:
        return 0 if self._fresh else len(self._ids)

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
            self._fresh = False
            if (self.inner.seq_len != len(self._ids) or self.owner != self._owner
                    or (self.strict_cold and self.inner.batch_invariant)):
                self.inner.reset()  # used behind this wrapper, another owner's, or a strict sequence: start cold
                self._ids = []
            self._owner = self.owner
            limit = min(len(self._ids), len(ids) - num_logits)
            n = 0
            while n < limit and self._ids[n] == ids[n]:
                n += 1
            try:
                self.inner.truncate(n)
            except Exception:  # a cache that cannot be cut there (a sliding window past its size): start cold
                n = 0
                self.inner.reset()
            del self._ids[n:]
            self.reused_tokens = n
            ids = ids[n:]
        with self._cold_on_failure():
            logits = self.inner.forward(ids, num_logits)
        self._ids.extend(ids)
        if self.record_top2 is not None:
            top = logits[-1].float().topk(2).indices.tolist()
            self.record_top2.append((top[0], top[1]))
        return logits

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
        if self._grown_from is None:
            self._grown_from = len(self._ids)
        with self._cold_on_failure():
            logits = self.inner.grow_tree(input_ids, parents)
        self._ids.extend(int(t) for t in input_ids)
        return logits

    def keep_tree_path(self, base: int, path: Sequence[int]) -> None:
        with self._cold_on_failure():
            self.inner.keep_tree_path(base, path)
        self._grown_from = None
        nodes = self._ids[base:]
        self._ids[base:] = [nodes[p] for p in path]

    def truncate(self, length: int) -> None:
        if self._fresh:
            if length == 0:
                return
            raise ValueError("truncate after reset needs a forward first")
        with self._cold_on_failure():
            self.inner.truncate(length)
        self._grown_from = None
        del self._ids[length:]

    def reset(self) -> None:
        if self._grown_from is not None:  # a grown tree is pending (a draft forward failed): drop its nodes
            self.truncate(self._grown_from)
        self._fresh = True

    def drop(self) -> None:
        """Really empty the cache (the next prefill is cold)."""
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
            self._grown_from = None
            raise

    def synchronize(self) -> None:
        self.inner.synchronize()

    def set_threads(self, threads: int) -> None:
        self.inner.set_threads(threads)

    def weight_bytes(self) -> int:
        return self.inner.weight_bytes()

    def kv_bytes_per_token(self) -> int:
        return self.inner.kv_bytes_per_token()
