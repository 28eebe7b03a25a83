"""Issue 14: token trees on ik_llama.cpp, the default runtime: the branches are sequences sharing the prefix's cells
(:class:`adaspec.backends.gguf.GgufBackend`), verified in one ``llama_decode``.

ik_llama.cpp's numerics depend on batch shapes (a 40-token sequence fed in one forward or as 39 + 4 tokens differs by
up to 7 logits on this model) and on the cache's cell layout, so every reference here is a chain fed in the same
pieces as the tree. The checks: a node's logits equal its own path's chain (exactly when the batch shapes match,
within :data:`KERNEL` logits otherwise), while the same node scored as if it saw its sibling differs by far more (a
negative control); a kept path, the first one or a side branch (which leaves holes that are compacted), continues
like a chain's for many steps; greedy decoding with n-gram trees reproduces plain decoding on these prompts; misuse
raises.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from adaspec.api import load_model
from adaspec.controllers import FixedController
from adaspec.drafters import NgramTreeDrafter
from adaspec.engine import GenerationConfig, SpeculativeEngine

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("ik_llama_cpp") is None, reason="needs ik-llama-cpp-python")]

MODEL = "smollm2-135m-instruct"
KERNEL = 1.0  # |Δlogit| allowed between a tree node and its path's chain (batch-shape kernel differences)


@pytest.fixture(scope="module")
def path():
    return load_model(f"{MODEL}@ik", progress=False, threads=2).backend.path


def _backend(path, **kw):
    from adaspec.backends.ik_backend import IkLlamaBackend

    return IkLlamaBackend(path, max_context=512, threads=2, **kw)


PREFIX = [1, 504, 3458, 28, 1204, 1441, 282, 260, 3987, 30]  # "<|im_start|>..." style ids, any real tokens do


def test_tree_nodes_score_their_own_paths(path):
    tree, chain = _backend(path), _backend(path)
    tokens, parents = [314, 1030, 2104, 282, 17, 99], [-1, 0, 0, -1, 3, 3]  # two branches of two children each
    tree.forward(PREFIX[:-1])
    out = tree.forward_tree([PREFIX[-1]] + tokens, parents)
    assert out.shape == (7, tree.vocab_size) and tree.seq_len == len(PREFIX) - 1 + 7
    paths = {0: [314], 1: [314, 1030], 2: [314, 2104], 3: [282], 4: [282, 17], 5: [282, 99]}
    worst = 0.0
    for node, nodes_path in paths.items():
        chain.reset()
        chain.forward(PREFIX[:-1])
        ref = chain.forward([PREFIX[-1]] + nodes_path, 1)[-1]
        assert int(out[node + 1].argmax()) == int(ref.argmax()), node
        worst = max(worst, float((out[node + 1] - ref).abs().max()))
    assert worst < KERNEL
    # negative control: node 2 (314 -> 2104) scored as if it also saw its sibling 1030 is far from its own path
    chain.reset()
    chain.forward(PREFIX[:-1])
    wrong = chain.forward([PREFIX[-1], 314, 1030, 2104], 1)[-1]
    assert float((out[3] - wrong).abs().max()) > 4 * worst
    # keep 282 -> 99 and continue: the cache holds prefix + path, and continues like a chain's
    tree.keep_tree_path(len(PREFIX), [3, 5])
    assert tree.seq_len == len(PREFIX) + 2
    chain.reset()
    chain.forward(PREFIX[:-1])
    chain.forward([PREFIX[-1], 282, 99])
    a, b = tree.forward([42, 7], 2), chain.forward([42, 7], 2)
    assert torch.equal(a.argmax(-1), b.argmax(-1)) and float((a - b).abs().max()) < KERNEL


@pytest.mark.parametrize("prefix_len", [10, 40])
def test_kept_paths_continue_like_a_chain(path, prefix_len):
    """24 steps keeping nothing, the first path or a side branch (holes, compacted): the tree's cache scores every
    step's nodes and the token after them like a chain fed the same pieces (freed branch cells never leak into
    sequence 0). Without the compaction a 40-token run drifted by 4-9 logits from step 7 on."""
    tree, chain = _backend(path), _backend(path)
    ids = [(i * 37) % 2000 + 5 for i in range(prefix_len)]
    tree.forward(ids[:-1])
    chain.forward(ids[:-1])
    worst = 0.0
    for step in range(24):
        tokens, parents = [100 + step, 200 + step, 300 + step, 400 + step], [-1, -1, 1, 1]
        out = tree.forward_tree([ids[-1]] + tokens, parents)
        keep = [[], [0], [1, 3], [1, 2]][step % 4]  # nothing, the first path, side branches
        tree.keep_tree_path(len(ids), keep)
        ref = chain.forward([ids[-1]] + [tokens[k] for k in keep], 1 + len(keep))
        worst = max(worst, float((out[[0] + [1 + k for k in keep]] - ref).abs().max()))
        ids += [tokens[k] for k in keep] + [500 + step]
        assert tree.seq_len == chain.seq_len == len(ids) - 1
        a, b = tree.forward([ids[-1]], 1), chain.forward([ids[-1]], 1)
        tree.truncate(len(ids) - 1)
        chain.truncate(len(ids) - 1)
        worst = max(worst, float((a - b).abs().max()))
    assert worst < KERNEL  # (argmaxes may flip where the top two are closer than that)


@pytest.mark.parametrize("budget", [6, 12])
def test_greedy_tree_decoding_reproduces_plain_decoding(path, budget):
    prompt = [3, 17, 42, 5, 9, 9, 12, 3, 17, 42, 7, 3, 17, 8, 3, 17, 42, 5, 3, 17]  # "3 17" continues 3 ways
    plain = SpeculativeEngine(_backend(path), None, None).generate(prompt, GenerationConfig(max_new_tokens=48))
    eng = SpeculativeEngine(_backend(path), NgramTreeDrafter(), FixedController(4))
    out = eng.generate(prompt, GenerationConfig(max_new_tokens=48, tree_budget=budget, tree_choice="always"))
    assert out.stats.tree_fallback == ""
    assert any(s.drafted > s.k for s in out.stats.steps)  # some step verified a tree, not a chain
    assert out.stats.accepted_tokens > 0
    assert out.token_ids == plain.token_ids


def test_nodes_out_of_depth_first_order_come_back_in_node_order(path):
    """The batch runs the main path first (depth-first); a tree whose nodes are not in that order (a draft model's
    tree lists siblings after the chain) must still return row i + 1 for node i, and keep paths right."""
    tree, chain = _backend(path), _backend(path)
    tokens, parents = [314, 282, 1030, 17, 2104], [-1, -1, 0, 1, 2]  # batch order: 0, 2, 4, 1, 3
    tree.forward(PREFIX[:-1])
    out = tree.forward_tree([PREFIX[-1]] + tokens, parents)
    paths = {0: [314], 1: [282], 2: [314, 1030], 3: [282, 17], 4: [314, 1030, 2104]}
    for node, nodes_path in paths.items():
        chain.reset()
        chain.forward(PREFIX[:-1])
        ref = chain.forward([PREFIX[-1]] + nodes_path, 1)[-1]
        assert float((out[node + 1] - ref).abs().max()) < KERNEL, node
        assert int(out[node + 1].argmax()) == int(ref.argmax()), node
    tree.keep_tree_path(len(PREFIX), [1, 3])  # the side branch 282 -> 17 (rows 4 and 5 of the batch)
    chain.reset()
    chain.forward(PREFIX[:-1])
    chain.forward([PREFIX[-1], 282, 17])
    a, b = tree.forward([42], 1), chain.forward([42], 1)
    assert float((a - b).abs().max()) < KERNEL


def test_trees_near_the_context_end_and_over_capacity_stay_within_bounds(path):
    """The engine caps a tree's nodes to the context left and to the backend's tree sequences."""
    from adaspec.backends.ik_backend import IkLlamaBackend

    prompt = [3, 17, 42, 5, 9, 9, 12, 3, 17, 42, 7, 3, 17, 8, 3, 17, 42, 5, 3, 17]
    for max_context in range(len(prompt) + 2, len(prompt) + 14):
        target = IkLlamaBackend(path, max_context=max_context, threads=2, tree_sequences=4)
        eng = SpeculativeEngine(target, NgramTreeDrafter(), FixedController(4))
        out = eng.generate(prompt, GenerationConfig(max_new_tokens=64, tree_budget=12, tree_choice="always"))
        assert len(prompt) + len(out.token_ids) <= max_context
        assert all(s.drafted <= 4 for s in out.stats.steps)  # at most tree_sequences nodes


def test_tree_misuse_raises(path):
    b = _backend(path)
    b.forward(PREFIX[:-1])
    b.forward_tree([PREFIX[-1], 5, 6], [-1, 0])
    with pytest.raises(ValueError, match="token tree is pending"):
        b.forward([7], 1)
    with pytest.raises(ValueError, match="token tree is pending"):
        b.forward_tree([PREFIX[-1], 5], [-1])
    with pytest.raises(ValueError, match="pending; keep a path"):
        b.truncate(len(PREFIX) + 1)
    with pytest.raises(ValueError, match="does not follow the tree"):
        b.keep_tree_path(len(PREFIX), [1])
    with pytest.raises(ValueError, match="starts after"):
        b.keep_tree_path(len(PREFIX) - 1, [0])
    b.truncate(len(PREFIX))  # back to the prefix and pending token: the tree is dropped
    assert b.seq_len == len(PREFIX)
    b.forward([7], 1)  # and the backend works again
    with pytest.raises(ValueError, match="without a tree forward"):
        b.keep_tree_path(len(PREFIX) + 1, [])
    with pytest.raises(ValueError, match="parents"):
        b.forward_tree([1, 2, 3], [-1])
    small = _backend(path, tree_sequences=2)
    small.forward(PREFIX[:-1])
    with pytest.raises(ValueError, match="3 leaves; this backend holds 2"):
        small.forward_tree([PREFIX[-1], 5, 6, 7], [-1, -1, -1])
    assert small.seq_len == len(PREFIX) - 1  # refused before touching the cache
    assert not _backend(path, tree_sequences=0).supports_trees


def test_grown_tree_nodes_score_their_own_paths_and_keep_a_path(path):
    """grow_tree, one level per call: first children take over their parent's sequence, later ones get a copy of
    it up to the parent; every node scores its own path (a chain fed the same pieces), and a kept path continues
    like a chain."""
    tree, chain = _backend(path), _backend(path)
    tree.forward(PREFIX)
    first = tree.grow_tree([314, 282, 17], [-1, -1, -1])
    second = tree.grow_tree([1030, 2104, 99], [0, 0, 1])  # 314's two children (the second on a new sequence)
    third = tree.grow_tree([5, 6], [4, 3])  # below 2104 (a copied sequence) and below 1030 (a taken-over one)
    assert tree.seq_len == len(PREFIX) + 8
    rows = [(first[0], [314]), (first[1], [282]), (first[2], [17]), (second[0], [314, 1030]),
            (second[1], [314, 2104]), (second[2], [282, 99]), (third[0], [314, 2104, 5]), (third[1], [314, 1030, 6])]
    worst = 0.0
    for out, nodes_path in rows:
        chain.reset()
        ref = chain.forward(PREFIX + nodes_path, 1)[-1]
        assert int(out.argmax()) == int(ref.argmax()), nodes_path
        worst = max(worst, float((out - ref).abs().max()))
    assert worst < KERNEL
    chain.reset()  # negative control: 5 scored as if it also saw 1030 (its parent's sibling)
    wrong = chain.forward(PREFIX + [314, 1030, 2104, 5], 1)[-1]
    assert float((third[0] - wrong).abs().max()) > 4 * worst
    with pytest.raises(ValueError, match="token tree is pending"):
        tree.forward([7], 1)
    with pytest.raises(ValueError, match="one level per call"):
        tree.grow_tree([8, 9], [6, 8])
    with pytest.raises(ValueError, match="does not follow the tree"):
        tree.keep_tree_path(len(PREFIX), [4])
    tree.keep_tree_path(len(PREFIX), [0, 4, 6])  # 314 -> 2104 -> 5
    assert tree.seq_len == len(PREFIX) + 3
    chain.reset()
    chain.forward(PREFIX + [314, 2104, 5])
    a, b = tree.forward([42, 7], 2), chain.forward([42, 7], 2)
    assert torch.equal(a.argmax(-1), b.argmax(-1)) and float((a - b).abs().max()) < KERNEL
    small = _backend(path, tree_sequences=2)  # sequences run out: refused before the cache changes
    small.forward(PREFIX)
    small.grow_tree([314, 282], [-1, -1])
    with pytest.raises(ValueError, match="more than its 2 sequences"):
        small.grow_tree([1030, 2104], [0, 0])
    small.truncate(len(PREFIX))  # back to the prefix: the tree is dropped
    assert small.seq_len == len(PREFIX) and torch.isfinite(small.forward([7], 1)).all()


def test_greedy_grown_draft_trees_on_ik_reproduce_plain_decoding(path):
    from adaspec.drafters import ModelDrafter

    prompt = [3, 17, 42, 5, 9, 9, 12, 3, 17, 42, 7, 3, 17, 8, 3, 17, 42, 5, 3, 17]
    plain = SpeculativeEngine(_backend(path), None, None).generate(prompt, GenerationConfig(max_new_tokens=40))
    draft = _backend(path)
    grown = []
    grow = draft.grow_tree
    draft.grow_tree = lambda tokens, parents: (grown.append(len(tokens)), grow(tokens, parents))[1]
    eng = SpeculativeEngine(_backend(path), ModelDrafter(draft), FixedController(4))
    out = eng.generate(prompt, GenerationConfig(max_new_tokens=40, tree_budget=10, tree_choice="always"))
    assert out.token_ids == plain.token_ids and out.stats.tree_fallback == ""
    assert grown and max(grown) > 1  # levels of several nodes were grown on the draft's cache


def test_greedy_suffix_decoding_on_ik_reproduces_plain_decoding(path):
    """The suffix drafter's chains and trees on the default runtime, with a cache warmed by a first request."""
    from adaspec.drafters.suffix import SuffixDrafter

    prompt = [3, 17, 42, 5, 9, 9, 12, 3, 17, 42, 7, 3, 17, 8, 3, 17, 42, 5, 3, 17]
    plain = SpeculativeEngine(_backend(path), None, None).generate(prompt, GenerationConfig(max_new_tokens=32))
    eng = SpeculativeEngine(_backend(path), SuffixDrafter(), FixedController(4))
    for budget in (0, 8, 8):
        out = eng.generate(prompt, GenerationConfig(max_new_tokens=32, tree_budget=budget, tree_choice="always"))
        assert out.token_ids == plain.token_ids
    assert out.stats.accepted_tokens > 0 and eng.drafter.cache.responses == 3
