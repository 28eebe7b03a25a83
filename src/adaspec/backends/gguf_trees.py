"""Token trees on a GGUF runtime with one unified cache (ik_llama.cpp; ``tree_sequences`` > 0):
:class:`~adaspec.backends.gguf.GgufBackend`'s tree methods, as functions of the backend (they read and write its
sequences and its pending tree).

The branches of a tree are sequences that share cells, as llama.cpp's own tree-speculation example does: each leaf
gets a sequence id after the rows' own (``max_sequences`` + j), the prefix's cells are added to every leaf's
sequence (``llama_kv_cache_seq_cp``, no copy of data in a unified cache), and each node is decoded once, tagged with
the sequences of every leaf below it. The runtime masks attention by a token's first sequence id and position
(``cells[i].has_seq_id(seq_id[j][0]) && cells[i].pos <= pos[j]``), so a node whose first id is a leaf below it sees
the prefix, the pending token and its ancestors only, at the position of its depth: SpecInfer's tree attention, from
the runtime's own masks. :func:`keep_tree_path` adds the accepted path's cells to sequence 0 and removes the leaves'
sequences, which frees the rejected branches' cells.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from adaspec.tree import check_parents, depth_first_order, depths


class PendingTree(NamedTuple):
    """A tree decoded by :meth:`GgufBackend.forward_tree` whose path is not kept yet."""

    prefix: int  # sequence 0's length before the tree (the pending token sits at this position)
    ids: list[int]  # [pending] + nodes
    parents: list[int]
    leaf_seqs: list[int]  # the leaves' sequence ids
    node_seq: list[int]  # each node's first sequence id: a leaf below it, whose cells are exactly its ancestors
    order: list[int]  # the nodes in batch (and so cell) order


@dataclass
class GrowingTree:
    """A tree grown by :meth:`GgufBackend.grow_tree` whose path is not kept yet."""

    prefix: int  # sequence 0's length before the tree (its nodes of depth 1 sit at this position)
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    seq: list[int] = field(default_factory=list)  # each node's sequence: the prefix, its ancestors and itself
    claimed: set[int] = field(default_factory=set)  # nodes whose sequence a child took over
    seqs: list[int] = field(default_factory=list)  # the tree's sequence ids


def forward_tree(backend, input_ids: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
    """See :meth:`Backend.forward_tree`; the branches are sequences sharing cells (module docstring). Sequence 0
    holds the prefix. Until :meth:`keep_tree_path` (or a truncation to the prefix and pending token) the backend
    refuses other forwards.

    Raises:
        NotImplementedError: this runtime holds no tree sequences.
        ValueError: ``parents`` is not a topologically ordered forest over ``len(input_ids) - 1`` nodes, the tree
            has more leaves than ``tree_sequences``, or a tree is already pending.
        ContextLengthError: the prefix plus every node exceeds ``max_context``.
    """
    if not backend.tree_sequences:
        raise NotImplementedError(f"{backend.name}: {backend.runtime} here cannot verify token trees")
    ids = [int(t) for t in input_ids]
    n = len(ids)
    if len(parents) != n - 1:
        raise ValueError(f"a tree over {n - 1} nodes needs {n - 1} parents, got {len(parents)}")
    parents = [int(p) for p in parents]
    check_parents(parents)
    check_no_tree(backend)
    backend._check_open()
    backend.check_forward(n, n)
    has_child = set(parents)
    leaves = [i for i in range(n - 1) if i not in has_child]
    if len(leaves) > backend.tree_sequences:
        raise ValueError(f"{backend.name}: a tree with {len(leaves)} leaves; this backend holds "
                         f"{backend.tree_sequences} tree sequences")
    first = backend.max_sequences
    node_seqs: list[list[int]] = [[] for _ in range(n - 1)]
    for j, leaf in enumerate(leaves):  # each node's sequences: the leaves below it, the first leaf's first
        node = leaf
        while node >= 0:
            node_seqs[node].append(first + j)
            node = parents[node]
    prefix = len(backend._seqs[0])
    tree_seqs = list(range(first, first + len(leaves)))
    for s in tree_seqs:  # the prefix's cells join every branch (a unified cache shares them, no data moves)
        backend._lib.llama_kv_cache_seq_cp(backend._ctx, 0, s, 0, -1)
    depth = depths(parents)
    order = depth_first_order(parents)  # the batch (and so the cells) with the main path first
    items = [((0, *tree_seqs), prefix, ids[0], True)]
    items += [(tuple(node_seqs[i]), prefix + depth[i], ids[i + 1], True) for i in order]

    def undo() -> None:
        for s in tree_seqs:
            backend._seq_rm(0, s)
        backend._seq_rm(prefix, 0)

    out = backend._decode_items(items, n, undo, rows=[0] + [1 + i for i in order])  # logits in node order
    backend._tree = PendingTree(prefix, ids, parents, tree_seqs, [seqs[0] for seqs in node_seqs], order)
    backend._seqs[0].extend(ids)  # as :meth:`Backend.forward_tree` says: every node counted until a path is kept
    return torch.from_numpy(out)


def grow_tree(backend, input_ids: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
    """See :meth:`Backend.grow_tree`, with the branches as sequences sharing cells (module docstring): a node's
    first child takes over its parent's sequence, every other child gets a new sequence holding the cells of the
    prefix, its ancestors and its parent (``llama_kv_cache_seq_cp`` over those positions, no data moves), and
    the call's nodes are decoded in one batch, each tagged with its own sequence. The tree holds at most
    ``tree_sequences`` sequences (``max_tree_nodes`` nodes always fit).

    Raises:
        NotImplementedError: this runtime holds no tree sequences.
        ValueError: a parent out of range or among this call's nodes (this backend grows one level per call),
            the tree's sequences are used up, or a :meth:`forward_tree` tree is pending.
        ContextLengthError: the prefix plus every grown node exceeds ``max_context``.
    """
    if not backend.tree_sequences:
        raise NotImplementedError(f"{backend.name}: {backend.runtime} here cannot grow token trees")
    if backend._tree is not None:
        raise ValueError(f"{backend.name}: a token tree is pending; keep a path first")
    backend._check_open()
    ids, parents = [int(t) for t in input_ids], [int(p) for p in parents]
    m = len(ids)
    if m < 1 or len(parents) != m:
        raise ValueError(f"grow_tree needs m >= 1 nodes and as many parents, got {m} and {len(parents)}")
    g = backend._grown or GrowingTree(len(backend._seqs[0]))
    n = len(g.tokens)
    check_parents(g.parents + parents)
    if any(p >= n for p in parents):
        raise ValueError(f"{backend.name}: grow_tree adds one level per call: a parent must be a node of an earlier "
                         f"call (< {n}), got {parents}")
    backend.check_forward(m, m)
    depth = depths(g.parents + parents)
    free = [s for s in range(backend.max_sequences, backend.max_sequences + backend.tree_sequences) if s not in g.seqs]
    copies, seqs, claimed = [], [], set()  # (from, to, first position, end position)
    for p in parents:
        if p >= 0 and p not in g.claimed and p not in claimed:
            claimed.add(p)
            seqs.append(g.seq[p])
            continue
        if not free:
            raise ValueError(f"{backend.name}: a grown tree needs more than its {backend.tree_sequences} sequences")
        s = free.pop(0)
        # the prefix (all of sequence 0), or the parent's sequence up to the parent's position
        copies.append((0, s, 0, -1) if p < 0 else (g.seq[p], s, 0, g.prefix + depth[p]))
        seqs.append(s)
    new = [c[1] for c in copies]
    for src, dst, p0, p1 in copies:
        backend._lib.llama_kv_cache_seq_cp(backend._ctx, src, dst, p0, p1)
    items = [((s,), g.prefix + d - 1, t, True) for s, d, t in zip(seqs, depth[n:], ids)]

    def undo() -> None:
        for s in new:
            backend._seq_rm(0, s)
        for p in claimed:  # the cells added after the parent's position
            backend._seq_rm(g.prefix + depth[p], g.seq[p])

    out = backend._decode_items(items, m, undo)
    g.tokens += ids
    g.parents += parents
    g.seq += seqs
    g.claimed |= claimed
    g.seqs += new
    backend._grown = g
    backend._seqs[0].extend(ids)  # every node counted until a path is kept, as forward_tree does
    return torch.from_numpy(out)


def _keep_grown_path(backend, base: int, path: Sequence[int]) -> None:
    g = backend._grown
    if base != g.prefix:
        raise ValueError(f"{backend.name}: the grown tree starts after {g.prefix} cached entries, not {base}")
    _check_root_path(path, g.parents)
    if path:  # the last node's sequence holds the prefix and exactly its ancestors up to its own position
        backend._lib.llama_kv_cache_seq_cp(backend._ctx, g.seq[path[-1]], 0, base, base + len(path))
    drop_tree(backend)
    backend._seqs[0][base:] = [g.tokens[p] for p in path]
    if path:
        backend._compact()  # the path's cells lie between rejected ones (see keep_tree_path)


def _check_root_path(path: Sequence[int], parents: Sequence[int]) -> None:
    """Raises ValueError unless ``path`` starts at a root and each node is the child of the one before."""
    prev = -1
    for p in path:
        if not 0 <= p < len(parents) or parents[p] != prev:
            raise ValueError(f"tree path {list(path)} does not follow the tree from its root")
        prev = p


def keep_tree_path(backend, base: int, path: Sequence[int]) -> None:
    """See :meth:`Backend.forward_tree`: ``base`` must be the prefix plus the pending token (after
    :meth:`grow_tree`: the prefix), and ``path`` a path from the root (each node the child of the one before;
    ``[]`` keeps none).

    Raises:
        ValueError: no tree is pending, ``base`` is not where it starts, or ``path`` is not a root path.
    """
    if backend._grown is not None:
        _keep_grown_path(backend, base, path)
        return
    if backend._tree is None:
        raise ValueError(f"{backend.name}: keep_tree_path without a tree forward before it")
    prefix, ids, parents, _, node_seq, order = backend._tree
    if base != prefix + 1:
        raise ValueError(f"{backend.name}: the pending tree starts after {prefix + 1} cached entries, not {base}")
    _check_root_path(path, parents)
    if path:  # the path's cells join sequence 0: the last node's leaf sequence holds exactly its ancestors
        backend._lib.llama_kv_cache_seq_cp(backend._ctx, node_seq[path[-1]], 0, base, base + len(path))
    drop_tree(backend)
    backend._seqs[0][base:] = [ids[1 + p] for p in path]
    if list(path) != order[:len(path)]:
        # a side branch was kept: rejected nodes left holes between the kept cells. ik_llama.cpp's attention
        # depends on the cells' layout (with holes left in, SmolLM2-135M's logits drifted 4-9 logits from a
        # chain fed the same tokens within 7-24 steps; tests/backends/test_tree_gguf.py), so the cache is compacted at
        # once (about 1 ms). The first path's nodes come first in the batch, so keeping a prefix of it leaves no
        # hole, as a chain's rejection does.
        backend._compact()


def drop_tree(backend) -> None:
    """Remove the tree's sequences (cells only they hold are freed)."""
    if backend._tree is not None:
        for s in backend._tree.leaf_seqs:
            backend._seq_rm(0, s)
        backend._tree = None
    if backend._grown is not None:
        for s in backend._grown.seqs:
            backend._seq_rm(0, s)
        backend._grown = None


def pending_root(backend) -> int | None:
    """Cached entries of sequence 0 below a pending tree's nodes (the prefix and pending token of a
    :func:`forward_tree`, the prefix of a :func:`grow_tree`); None when no tree is pending."""
    if backend._tree is not None:
        return backend._tree.prefix + 1
    return backend._grown.prefix if backend._grown is not None else None


def check_no_tree(backend) -> None:
    if backend._tree is not None or backend._grown is not None:
        raise ValueError(f"{backend.name}: a token tree is pending; keep a path (keep_tree_path) or truncate to the "
                         "prefix and pending token first")
