"""Token trees: several candidate continuations verified in one target forward.

A chain draft proposes one continuation; a tree proposes several that share prefixes (SpecInfer, Miao et al. 2024;
Medusa, Cai et al. 2024; EAGLE-2, Li et al. 2024). The target scores every node in one forward: each node attends
to the cached prefix, the pending token and its own ancestors only (a tree attention mask), at the position of its
depth. Greedy acceptance then walks from the root: at each node the target's argmax must be one of the node's
children; the walk's nodes are accepted and the argmax where it stops is the bonus token. The output is the
target's greedy output, as with a chain; only the number of tokens per forward changes. Under sampling a
deterministic tree (prompt lookup's) is accepted by multi-candidate rejection sampling
(:func:`verify_tree_sampling`), so the output is distributed as the target's samples.

Layout: nodes in topological order, ``parents[i] < i`` (``-1``: a child of the pending token, depth 1). The target
forward runs over ``[pending] + tokens``, so logits row 0 scores the position after the pending token and row
``i + 1`` the position after node ``i``. Afterwards the KV cache keeps the prefix, the pending token and the
accepted path's entries, compacted in order (:meth:`adaspec.backends.TorchBackend.keep_tree_path`).

This module holds what a tree is and how it is accepted; drafters build trees
(:meth:`adaspec.drafters.NgramTreeDrafter.propose_tree`), backends score them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from adaspec.errors import ConfigError
from adaspec.sampling import sample

MAX_TREE_NODES = 64
"""Largest tree budget (nodes per verification)."""


def check_parents(parents: Sequence[int]) -> None:
    """Raise ValueError unless ``parents`` is a topologically ordered forest over the pending token."""
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"tree node {i} has parent {p}: parents must come before their children (-1 = root)")


def check_budget(budget: int) -> None:
    """Raise ConfigError for a tree budget outside [0, MAX_TREE_NODES] (0 = chains)."""
    if not 0 <= budget <= MAX_TREE_NODES:
        raise ConfigError(f"tree_budget must be in [0, {MAX_TREE_NODES}] draft nodes per step (0 = chains), "
                          f"got {budget}")


def depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node (1 for the pending token's children)."""
    out: list[int] = []
    for p in parents:
        out.append(1 if p < 0 else out[p] + 1)
    return out


def tree_attention_mask(parents: Sequence[int], past: int, dtype: torch.dtype,
                        device: torch.device | str = "cpu") -> torch.Tensor:
    """The additive attention mask of a forward over ``[pending] + nodes`` after ``past`` cached tokens.

    Returns:
        ``[1, 1, n + 1, past + n + 1]`` in ``dtype``: 0 where a query may attend (the cached prefix, the pending
        token, the node's ancestors and itself), the dtype's most negative value elsewhere (not -inf, so no row
        is all -inf).
    """
    check_parents(parents)
    # the pending token is the root of a grown tree whose every node is new
    return grown_tree_mask([-1] + [p + 1 for p in parents], len(parents) + 1, past, dtype, device)


def grown_tree_mask(parents: Sequence[int], new: int, past: int, dtype: torch.dtype,
                    device: torch.device | str = "cpu") -> torch.Tensor:
    """The additive attention mask of a forward over the last ``new`` of a tree's nodes, the others and ``past``
    prefix entries already cached (:meth:`adaspec.backends.Backend.grow_tree`): a node sees the prefix, its
    ancestors and itself.

    Args:
        parents: all ``n`` nodes' parents (-1 = a child of the prefix's last token), topologically ordered.

    Returns:
        ``[1, 1, new, past + n]`` in ``dtype``: 0 where a query may attend, the dtype's most negative value elsewhere.
    """
    check_parents(parents)
    n = len(parents)
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            allowed[i] = allowed[p]
        allowed[i, i] = True
    mask = torch.zeros(new, past + n, dtype=dtype, device=device)
    mask[:, past:].masked_fill_(~allowed[n - new:].to(device), torch.finfo(dtype).min)
    return mask[None, None]


def child_map(tokens: Sequence[int], parents: Sequence[int]) -> dict[int, dict[int, int]]:
    """``{parent: {token: child}}`` (parent -1 = the pending token); when siblings carry the same token the first
    one is kept, the child every acceptance rule here takes."""
    children: dict[int, dict[int, int]] = {}
    for i, (t, p) in enumerate(zip(tokens, parents)):
        children.setdefault(p, {}).setdefault(int(t), i)
    return children


def verify_tree_greedy(tokens: Sequence[int], parents: Sequence[int], logits: torch.Tensor) -> tuple[list[int], int]:
    """Greedy acceptance of a token tree.

    Args:
        tokens, parents: the tree (``n`` nodes, see the module docstring).
        logits: ``[n + 1, V]`` target logits over ``[pending] + tokens``.

    Returns:
        ``(path, next_token)``: the accepted nodes from the root down (indices into ``tokens``; empty when the
        target's first argmax is no child of the root) and the target's argmax after the last of them. When
        siblings carry the same token the first one is taken.
    """
    children = child_map(tokens, parents)
    best = logits.argmax(dim=-1).tolist()
    path: list[int] = []
    node = -1
    while True:
        token = best[node + 1]
        nxt = children.get(node, {}).get(token)
        if nxt is None:
            return path, token
        path.append(nxt)
        node = nxt


def verify_tree_sampling(tokens: Sequence[int], parents: Sequence[int], probs: torch.Tensor,
                         generator: torch.Generator | None = None,
                         draft_probs: torch.Tensor | None = None) -> tuple[list[int], int]:
    """Lossless acceptance of a token tree under sampling: multi-candidate recursive rejection sampling (SpecInfer,
    Miao et al. 2024, §4.2; Yang et al. 2024, "Multi-Candidate Speculative Decoding", the rule for candidates drawn
    without replacement).

    At a node with children carrying tokens t_1, t_2, ... (in index order), p_1 = p is the target's distribution
    there and q_1 = q the draft's. Child i is accepted with probability min(1, p_i(t_i) / q_i(t_i)); on a
    rejection p_{i+1} = norm(max(p_i - q_i, 0)) and q_{i+1} = q_i with t_i removed and renormalised; when every
    child is rejected the next token is sampled from the last residual p. Each stage is one speculative sampling
    step (Leviathan et al. 2023) whose residual p_{i+1} does not depend on which t_i was drawn, so by induction
    from the last stage every emitted token is distributed exactly as p, for any draw of the children in which t_i
    follows q_i given t_1..t_{i-1}: a draw without replacement from q, or any fixed set of candidates with one-hot
    q (then p_{i+1} is p_i with t_i removed, and child i is accepted with probability p_i(t_i)). The walk continues
    from the accepted child with the target's distribution there.

    Args:
        tokens, parents: the tree (see the module docstring).
        probs: ``[n + 1, V]`` float32 target sampling distributions (after temperature, top-k/top-p/min-p) over
            ``[pending] + tokens``.
        draft_probs: ``[n, V]`` float32: row i is the draft distribution q node i was drawn from (siblings share
            it), its children drawn without replacement in index order; None for a deterministic tree (one-hot q:
            prompt lookup, a greedy draft's top tokens).

    Returns:
        ``(path, next_token)`` as :func:`verify_tree_greedy`.
    """
    children = child_map(tokens, parents)
    path: list[int] = []
    node = -1
    while True:
        p = probs[node + 1].clone()
        q = None
        accepted = None
        for token, child in children.get(node, {}).items():
            total = float(p.sum())
            if total <= 0:
                break
            if draft_probs is None:  # one-hot q
                if float(torch.rand((), generator=generator)) * total < float(p[token]):
                    accepted = child
                    break
                p[token] = 0.0
                continue
            if q is None:
                q = draft_probs[child].clone()
            q_total = float(q.sum())
            if q_total <= 0 or float(q[token]) <= 0:
                raise ValueError(f"tree node {child} (token {token}) has draft probability 0: it was not drawn "
                                 "from its draft distribution")
            p, q = p / total, q / q_total
            if float(torch.rand((), generator=generator)) * float(q[token]) < float(p[token]):
                accepted = child
                break
            p = (p - q).clamp_min_(0.0)
            q[token] = 0.0
        if accepted is None:
            return path, int(sample(p / p.sum() if p.sum() > 0 else probs[node + 1], generator))
        path.append(accepted)
        node = accepted


def accepted_nodes(tokens: Sequence[int], parents: Sequence[int], accepted: Sequence[int]) -> list[int]:
    """The node indices of an accepted path given its tokens: from the root, the first child carrying each accepted
    token (the child :func:`verify_tree_greedy` and :func:`verify_tree_sampling` take).

    Raises:
        ValueError: ``accepted`` does not follow the tree.
    """
    children = child_map(tokens, parents)
    path, node = [], -1
    for t in accepted:
        node = children.get(node, {}).get(int(t), -2)
        if node == -2:
            raise ValueError(f"accepted token {int(t)} at depth {len(path) + 1} is no child of the path so far")
        path.append(node)
    return path


def path_rows(path: Sequence[int]) -> list[int]:
    """Logits rows of the accepted path followed by the bonus row: ``[0] + [i + 1 for i in path]``."""
    return [0] + [i + 1 for i in path]


def depth_first_order(parents: Sequence[int]) -> list[int]:
    """The nodes in depth-first order, children in index order, so the main path (:func:`main_path`) comes first:
    a batch laid out this way keeps a prefix of the main path contiguous after the pending token."""
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        children.setdefault(p, []).append(i)
    order, stack = [], list(reversed(children.get(-1, [])))
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(reversed(children.get(node, [])))
    return order


def would_emit(tokens: Sequence[int], parents: Sequence[int], target: Sequence[int]) -> list[tuple[int, int]]:
    """What a tree would have emitted on a step that verified something else (a chain), from the tokens the target
    emitted there: for each node budget w = 1..n (the tree cut to its first w nodes, as a drafter's smaller budget
    keeps them), ``(fewest, most)`` tokens greedy verification of it would have emitted.

    ``target`` is the step's accepted tokens plus its bonus token: the target's greedy continuation, the same
    whatever was drafted. Walking the tree along it, a walk that stops at depth m < ``len(target)`` (no child carries
    the target's next token) emits exactly m + 1 tokens; a walk that takes all of ``target`` would go on past what
    the step shows, so it emits at least ``len(target) + 1`` and at most the deepest node below it, plus one.
    Exact for greedy verification; under sampling the same walk is a proxy (the emitted tokens are one sample).

    Returns:
        ``[(fewest, most), ...]``, one pair per budget w = 1..n.

    Raises:
        ValueError: ``target`` is empty (a step emits at least its bonus token).
    """
    if not target:
        raise ValueError("would_emit needs the step's emitted tokens (at least the bonus token)")
    # The walk over all n nodes; a budget w keeps its nodes below w, and since indices increase along a path (and a
    # token's first sibling is the one taken), the walk within the first w nodes is this walk's nodes below w.
    children = child_map(tokens, parents)
    path, node = [], -1
    for t in target:
        node = children.get(node, {}).get(int(t), -1)
        if node < 0:
            break
        path.append(node)
    deepest_by_w = []  # the deepest node under a full match among the first w nodes, per w
    if len(path) == len(target):
        depth = depths(parents)
        below, deepest = {path[-1]}, 0
        for i in range(len(tokens)):
            if i == path[-1] or (i > path[-1] and parents[i] in below):
                below.add(i)
                deepest = max(deepest, depth[i])
            deepest_by_w.append(deepest)
    out = []
    for w in range(1, len(tokens) + 1):
        m = sum(1 for i in path if i < w)
        out.append((m + 1, m + 1) if m < len(target) else (m + 1, deepest_by_w[w - 1] + 1))
    return out


def main_path(parents: Sequence[int]) -> list[int]:
    """The chain a tree falls back to: from the root, always the first child (the drafter's best guess)."""
    first_child: dict[int, int] = {}
    for i, p in enumerate(parents):
        first_child.setdefault(p, i)
    path, node = [], -1
    while node in first_child:
        node = first_child[node]
        path.append(node)
    return path
