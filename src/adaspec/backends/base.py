"""The Backend interface: one model, a KV cache per sequence.

A backend appends tokens to a sequence's cache and returns logits for (some of) the new positions, and can truncate
that cache back to a prefix. That is all the engine needs for linear speculation. ``forward``/``truncate`` work on
sequence 0; a backend built for ``max_sequences`` > 1 also runs several sequences in one forward
(:meth:`Backend.forward_batch`, used by :class:`~adaspec.batch.BatchEngine`) and hands out a single-sequence
view of each (:meth:`Backend.sequence`, for per-row draft models).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from adaspec.errors import ContextLengthError


@dataclass(frozen=True)
class CacheSnapshot:
    """A copy of sequence 0's KV cache, taken by :meth:`Backend.snapshot` and put back by :meth:`Backend.restore`
    on the backend that took it.

    Attributes:
        length: positions it holds.
        nbytes: host memory it occupies, in bytes.
        data: the backend's own representation (opaque to callers).
    """

    length: int
    nbytes: int
    data: object


@dataclass(frozen=True)
class BatchRow:
    """One sequence's part of a batched forward (:meth:`Backend.forward_batch`).

    Attributes:
        seq: sequence id, ``0 <= seq < max_sequences``.
        input_ids: N >= 1 new token ids appended after that sequence's cache.
        num_logits: logits wanted for the last ``num_logits`` of them (1 <= num_logits <= N).
    """

    seq: int
    input_ids: Sequence[int]
    num_logits: int = 1


class Backend(ABC):
    """A causal LM with a KV cache over a single sequence.

    Invariant: ``seq_len`` equals the number of tokens whose keys/values are in the cache; ``forward`` appends to
    it and ``truncate`` shrinks it. Logits are returned as float tensors on the CPU or the model's device.

    Attributes:
        name: display name of the model (for stats and errors).
        vocab_size: width V of the logits (may be padded beyond the tokenizer's length).
        max_context: maximum number of positions the model supports (prompt + generated tokens).
        batch_invariant: strict mode: every forward after the first of a sequence computes each position's logits
            with the same kernels whatever the number of positions (K + 1) in the forward, so greedy speculative
            decoding reproduces plain greedy decoding bit for bit and a request's output does not depend on the
            controller's choices. Settable between requests where ``supports_batch_invariance`` is True (the
            engine sets it per request from ``GenerationConfig.strict``).
        max_sequences: sequences this backend holds caches for (1 unless built for batching); each has its own
            ``max_context`` positions.
        rows_independent: a row of :meth:`forward_batch` gets the same logits whatever the other rows are (in
            strict mode); False where the runtime's kernels mix rows (ik_llama.cpp's unified cache), so strict mode
            holds only at batch size 1 there.
        supports_trees: :meth:`forward_tree` and :meth:`keep_tree_path` work (token-tree verification,
            :mod:`adaspec.tree`); the engine verifies chains where this is False and says so in its statistics.
        supports_tree_growth: :meth:`grow_tree` works (a draft model expands a tree level by level, one forward
            per level, as EAGLE-2 does); a draft model on a backend without it drafts one-level trees.
        shares_prefix: :meth:`share_prefix` works (a batched row takes another row's cached prompt prefix instead
            of prefilling it again).
        supports_snapshots: :meth:`snapshot` and :meth:`restore` work (a prefix cache keeps copies of earlier
            sequences in host memory and puts one back instead of prefilling it again).
        reused_tokens: leading tokens of the last sequence's first forward after :meth:`reset` whose keys and values
            came from the cache instead of being computed (a prefix cache,
            :class:`~adaspec.backends.prefix_cache.PrefixCacheBackend`; 0 elsewhere).
    """

    name: str
    vocab_size: int
    max_context: int
    batch_invariant: bool = False
    supports_batch_invariance: bool = False
    max_sequences: int = 1
    rows_independent: bool = True
    supports_trees: bool = False
    supports_tree_growth: bool = False
    shares_prefix: bool = False
    supports_snapshots: bool = False
    reused_tokens: int = 0

    @property
    def max_tree_nodes(self) -> int:
        """Most nodes one :meth:`forward_tree` takes (the engine caps a tree's budget to it)."""
        from adaspec.tree import MAX_TREE_NODES

        return MAX_TREE_NODES

    @property
    @abstractmethod
    def seq_len(self) -> int:
        """Number of tokens currently held in the KV cache."""

    @abstractmethod
    def forward(self, input_ids: Sequence[int], num_logits: int = 1) -> torch.Tensor:
        """Run the model over ``input_ids`` appended after the cached prefix, and extend the cache.

        Args:
            input_ids: N >= 1 new token ids (positions ``seq_len .. seq_len + N - 1``).
            num_logits: how many trailing positions need logits (1 for decoding and prefill, K + 1 for
                verification); 1 <= num_logits <= N.

        Returns:
            ``[num_logits, V]`` logits (bf16 or fp32) for the last ``num_logits`` new positions; row j predicts
            the token after new position ``N - num_logits + j``.

        Raises:
            ContextLengthError: if the cache would exceed ``max_context``.
        """

    @abstractmethod
    def truncate(self, length: int) -> None:
        """Drop cached positions ``length ..`` (keep the first ``length``); 0 <= length <= seq_len."""

    # Token trees (sequence 0) ------------------------------------------------------------------------------------
    def forward_tree(self, input_ids: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Score a token tree after the cached prefix: ``input_ids`` = ``[pending] + nodes`` with ``parents`` the
        nodes' parent indices (:mod:`adaspec.tree`); each node attends to the prefix, the pending token and its
        ancestors, at the position of its depth. Extends the cache by ``len(input_ids)`` entries (all nodes).

        Returns:
            ``[len(input_ids), V]`` logits; row 0 follows the pending token, row i + 1 follows node i.

        Raises:
            NotImplementedError: the backend cannot verify trees (``supports_trees`` is False).
        """
        raise NotImplementedError(f"{self.name}: this backend cannot verify token trees")

    def keep_tree_path(self, base: int, path: Sequence[int]) -> None:
        """After :meth:`forward_tree`: keep the first ``base`` cached entries (prefix + pending token) and the
        entries of the nodes in ``path`` (in that order, compacted), drop the rest. After :meth:`grow_tree`:
        ``base`` is the cache length before the tree's first nodes and ``path`` indexes the grown nodes."""
        raise NotImplementedError(f"{self.name}: this backend cannot verify token trees")

    def grow_tree(self, input_ids: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Add nodes to a token tree growing after the cached prefix, one forward for all of them: a draft model
        expands its best nodes level by level this way (EAGLE-2, Li et al. 2024, §4.1).

        The first call starts a tree after the ``seq_len`` cached entries: a node with parent -1 follows the last
        cached token. ``parents[i]`` indexes all the nodes grown since (earlier calls' first, then this call's), and
        each node attends to the prefix and its own ancestors, at the position of its depth. The tree ends with
        :meth:`keep_tree_path` (``base`` = the cache length before it started) or :meth:`truncate`.

        Args:
            input_ids: m >= 1 new node ids.
            parents: their ``m`` parents (-1 or an index below the node's own: parents come first).

        Returns:
            ``[m, V]`` logits; row i follows node i of this call.

        Raises:
            NotImplementedError: the backend cannot grow trees (``supports_tree_growth`` is False).
            ValueError: a parent out of range.
            ContextLengthError: the prefix plus every grown node exceeds ``max_context``.
        """
        raise NotImplementedError(f"{self.name}: this backend cannot grow token trees")

    # Several sequences ------------------------------------------------------------------------------------------
    def forward_batch(self, rows: Sequence[BatchRow]) -> list[torch.Tensor]:
        """Run every row's new tokens after its own sequence's cache, as one batch where the runtime can.

        Rows must name distinct sequences. Returns one ``[num_logits, V]`` tensor per row, in order; each row's
        logits are those :meth:`forward` on that sequence alone would return, up to the kernel differences a
        backend documents (strict mode removes them). The default runs the rows one after another (sequence 0 only).

        Raises:
            ValueError: a sequence id out of range or repeated, or ``num_logits`` out of range.
            ContextLengthError: a row would exceed ``max_context``; no cache is changed.
        """
        self.check_rows(rows)
        return [self.forward(r.input_ids, r.num_logits) for r in rows]

    def seq_len_of(self, seq: int) -> int:
        """Tokens held in sequence ``seq``'s cache."""
        self._check_seq(seq)
        return self.seq_len

    def truncate_seq(self, seq: int, length: int) -> None:
        """:meth:`truncate` for sequence ``seq``."""
        self._check_seq(seq)
        self.truncate(length)

    def share_prefix(self, src: int, dst: int, start: int, end: int) -> None:
        """Give sequence ``dst``, which holds exactly ``start`` positions, the cached positions ``start..end`` of
        sequence ``src``; the caller guarantees both sequences hold the same tokens up to ``end``. Afterwards
        ``dst`` holds ``end`` positions, as if it had been fed those tokens itself (same keys and values).

        Raises:
            NotImplementedError: the backend cannot (``shares_prefix`` is False).
            ValueError: a sequence out of range, ``dst`` not at ``start``, or ``src`` shorter than ``end``.
        """
        raise NotImplementedError(f"{self.name}: this backend cannot share cached prefixes between sequences")

    def check_share(self, src: int, dst: int, start: int, end: int) -> None:
        """Validate a :meth:`share_prefix` before touching any cache (raises as it documents)."""
        self._check_seq(src)
        self._check_seq(dst)
        if src == dst:
            raise ValueError(f"{self.name}: cannot share sequence {src}'s prefix with itself")
        if self.seq_len_of(dst) != start:
            raise ValueError(f"{self.name}: sequence {dst} holds {self.seq_len_of(dst)} positions, not {start}")
        if not start <= end <= self.seq_len_of(src):
            raise ValueError(f"{self.name}: cannot share positions {start}..{end} of sequence {src}, which holds "
                             f"{self.seq_len_of(src)}")

    def snapshot(self) -> CacheSnapshot:
        """A copy of sequence 0's cache (keys and values of its ``seq_len`` positions) in host memory; the cache
        itself is unchanged.

        Raises:
            NotImplementedError: the backend cannot (``supports_snapshots`` is False).
            ValueError: a token tree is pending, on a backend that tracks one (the GGUF runtimes; a PyTorch cache
                holds a verified tree's nodes as positions until :meth:`keep_tree_path`, so copy only without one).
            RuntimeError: the runtime failed to copy it.
        """
        raise NotImplementedError(f"{self.name}: this backend cannot copy its cache out")

    def restore(self, snap: CacheSnapshot) -> None:
        """Put a :meth:`snapshot` of this backend back as sequence 0's cache, which must be empty: afterwards
        ``seq_len == snap.length``, with the keys and values as they were copied.

        Raises:
            NotImplementedError: the backend cannot (``supports_snapshots`` is False).
            ValueError: sequence 0's cache is not empty.
            RuntimeError: the runtime refused the copy (sequence 0 is left empty).
        """
        raise NotImplementedError(f"{self.name}: this backend cannot restore a cache copy")

    def sequence(self, seq: int) -> Backend:
        """A single-sequence :class:`Backend` over sequence ``seq`` of this one (shared weights, own cache): what a
        batched row's draft model runs on. Sequence 0 is the backend itself."""
        self._check_seq(seq)
        return self if seq == 0 else SequenceView(self, seq)

    def _check_seq(self, seq: int) -> None:
        if not 0 <= seq < self.max_sequences:
            raise ValueError(f"{self.name}: sequence {seq} out of range (this backend holds {self.max_sequences})")

    def check_rows(self, rows: Sequence[BatchRow]) -> None:
        """Validate a :meth:`forward_batch` before touching any cache (raises as it documents)."""
        seen = set()
        for r in rows:
            self._check_seq(r.seq)
            if r.seq in seen:
                raise ValueError(f"{self.name}: sequence {r.seq} appears twice in one batch")
            seen.add(r.seq)
            n = len(r.input_ids)
            if not 1 <= r.num_logits <= n:
                raise ValueError(f"num_logits must be in [1, {n}], got {r.num_logits}")
            if self.seq_len_of(r.seq) + n > self.max_context:
                where = f" (sequence {r.seq})" if r.seq else ""
                raise ContextLengthError(f"{self.name}: {self.seq_len_of(r.seq) + n} tokens exceed the context "
                                         f"window of {self.max_context}{where}")

    def check_forward(self, n: int, num_logits: int) -> None:
        """Validate a ``forward`` of ``n`` new tokens before touching the cache.

        Raises:
            ValueError: ``num_logits`` outside ``[1, n]``.
            ContextLengthError: ``seq_len + n`` exceeds ``max_context``.
        """
        if not 1 <= num_logits <= n:
            raise ValueError(f"num_logits must be in [1, {n}], got {num_logits}")
        if self.seq_len + n > self.max_context:
            raise ContextLengthError(
                f"{self.name}: {self.seq_len + n} tokens exceed the context window of {self.max_context}")

    def reset(self) -> None:
        """Empty the cache (start a new sequence)."""
        self.truncate(0)

    def synchronize(self) -> None:
        """Block until queued device work is done (for honest timing on asynchronous devices)."""

    def set_threads(self, threads: int) -> None:
        """Use ``threads`` CPU threads for later forwards. Backends on PyTorch share its process-wide pool, which
        :func:`adaspec.api.set_threads` sets, so the default does nothing; llama.cpp sets its context's count."""

    def weight_bytes(self) -> int:
        """Bytes of the model's weights as held in memory (shared tensors counted once).

        Raises:
            NotImplementedError: the backend cannot tell.
        """
        raise NotImplementedError(f"{type(self).__name__} does not report its weight bytes")

    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache one token of context costs (keys and values of every layer).

        Raises:
            NotImplementedError: the backend cannot tell.
        """
        raise NotImplementedError(f"{type(self).__name__} does not report its KV-cache bytes")


class SequenceView(Backend):
    """Sequence ``seq`` of a multi-sequence backend seen as a single-sequence :class:`Backend` (see
    :meth:`Backend.sequence`): ``forward``/``truncate`` act on that sequence's cache only."""

    def __init__(self, parent: Backend, seq: int) -> None:
        self.parent, self.seq = parent, seq
        self.name, self.vocab_size, self.max_context = parent.name, parent.vocab_size, parent.max_context
        self.supports_batch_invariance = parent.supports_batch_invariance

    @property
    def batch_invariant(self) -> bool:  # type: ignore[override]
        return self.parent.batch_invariant

    @batch_invariant.setter
    def batch_invariant(self, on: bool) -> None:
        self.parent.batch_invariant = on

    @property
    def seq_len(self) -> int:
        return self.parent.seq_len_of(self.seq)

    def forward(self, input_ids: Sequence[int], num_logits: int = 1) -> torch.Tensor:
        return self.parent.forward_batch([BatchRow(self.seq, input_ids, num_logits)])[0]

    def truncate(self, length: int) -> None:
        self.parent.truncate_seq(self.seq, length)

    def synchronize(self) -> None:
        self.parent.synchronize()

    def set_threads(self, threads: int) -> None:
        self.parent.set_threads(threads)

    def weight_bytes(self) -> int:
        return self.parent.weight_bytes()

    def kv_bytes_per_token(self) -> int:
        return self.parent.kv_bytes_per_token()
