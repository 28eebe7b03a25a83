"""The suffix trie and the global cache against a brute-force matcher, under random inserts and evictions."""

from __future__ import annotations

from collections import Counter, OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaspec.drafters.suffix_cache import SuffixCache
from adaspec.drafters.suffix_tree import SuffixTrie, TrieCursor
from adaspec.errors import ConfigError

DEPTH = 4
seqs = st.lists(st.integers(0, 3), min_size=0, max_size=12)  # small alphabet: many repeats and branches


def brute_counts(held: list[list[int]], depth: int) -> Counter:
    """{pattern: occurrences} over every held sequence, for patterns of 1..depth tokens."""
    out: Counter = Counter()
    for s in held:
        for i in range(len(s)):
            for m in range(1, min(depth, len(s) - i) + 1):
                out[tuple(s[i:i + m])] += 1
    return out


def trie_counts(trie: SuffixTrie) -> Counter:
    out: Counter = Counter()
    stack = [(trie.ROOT, ())]
    while stack:
        node, path = stack.pop()
        for t, c in trie.children(node):
            assert trie.count[c] > 0, "a node with no window was left in the trie"
            assert trie.depth[c] == len(path) + 1
            out[path + (t,)] = trie.count[c]
            stack.append((c, path + (t,)))
    return out


def check(trie: SuffixTrie, held: list[list[int]]) -> None:
    expected = brute_counts(held, trie.max_depth)
    assert trie_counts(trie) == expected
    assert trie.windows == sum(len(s) for s in held)
    assert trie.nodes == 1 + len(expected)  # no leaked nodes: freed ones are reused
    for pattern, n in list(expected.items())[:20]:  # find() agrees, and continuation frequencies are counts
        node = trie.find(pattern)
        assert trie.count[node] == n
        follow = {p[-1]: c for p, c in expected.items() if len(p) == len(pattern) + 1 and p[:-1] == pattern}
        assert {t: trie.count[c] for t, c in trie.children(node)} == follow


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), seqs), max_size=25))
def test_trie_equals_brute_force_under_inserts_and_removals(ops):
    trie, held = SuffixTrie(DEPTH), []
    for remove, s in ops:
        if remove and held:
            victim = held.pop(len(s) % len(held))
            trie.remove(victim)
        else:
            trie.insert(s)
            held.append(s)
        check(trie, held)


def brute_matches(held: list[list[int]], context: list[int], depth: int) -> list[int]:
    """Lengths m of the suffixes of ``context`` that occur in ``held`` (what ``SuffixTrie.matches`` finds)."""
    counts = brute_counts(held, depth)
    out = []
    for m in range(1, min(len(context), depth - 1) + 1):
        if tuple(context[-m:]) not in counts:
            break
        out.append(m)
    return out


PARTS = ["", "a", "b"]
ops = st.lists(st.tuples(st.sampled_from(["add", "add", "touch"]), st.sampled_from(PARTS), seqs), max_size=30)


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(1, 30))
def test_eviction_under_load_never_corrupts_a_match(steps, budget):
    """Responses written to and read from three partitions under a small budget: after every operation each
    partition's trie is exactly the brute-force trie of what the reference model says it holds (LRU over
    partitions, FIFO within one), and every match is the brute force's."""
    cache = SuffixCache(max_tokens=budget, max_depth=DEPTH)
    model: OrderedDict[str, list[list[int]]] = OrderedDict()  # partition -> responses, least recently used first
    for op, part, r in steps:
        if part in model:
            model.move_to_end(part)
        if op == "touch":
            cache.touch(part)
        else:
            cache.add(r, part)
            if r:
                kept = r[-budget:]
                while sum(len(x) for rs in model.values() for x in rs) + len(kept) > budget:
                    victim = next(iter(model))
                    model[victim].pop(0)
                    if not model[victim]:
                        del model[victim]
                model.setdefault(part, []).append(kept)
        assert cache.partitions == list(model)
        assert cache.tokens == sum(len(x) for rs in model.values() for x in rs) <= budget
        assert cache.responses == sum(map(len, model.values()))
        for p in PARTS:
            trie = cache.trie(p)
            if p not in model:
                assert trie is None
                continue
            check(trie, model[p])
            for context in (r, [x for rs in model.values() for x in rs[-1]]):  # matches under load, any partition
                assert [m for m, _ in trie.matches(context)] == brute_matches(model[p], context, DEPTH)


@settings(max_examples=60, deadline=None)
@given(seqs, seqs)
def test_cursor_appends_as_insert_does(a, b):
    one, two = SuffixTrie(DEPTH), SuffixTrie(DEPTH)
    one.insert(a + b)
    cur = TrieCursor(two)
    cur.extend(a)
    cur.extend(b)
    assert trie_counts(one) == trie_counts(two)


def test_partitions_are_apart_and_share_one_budget():
    cache = SuffixCache(max_tokens=10, max_depth=4)
    cache.add([1, 2, 3, 4], "alice")
    cache.add([5, 6, 7, 8], "bob")
    assert cache.trie("alice").find([5]) < 0 and cache.trie("bob").find([1]) < 0
    cache.touch("alice")  # a request of alice's starts: bob is now the least recently used partition
    cache.add([9, 9, 9], "carol")  # 11 tokens > 10: bob's response goes, though alice's is older
    assert cache.tokens == 7 and cache.partitions == ["alice", "carol"] and cache.trie("bob") is None
    assert cache.trie("alice").find([1, 2]) >= 0 and cache.partition_tokens("alice") == 4
    cache.add([7] * 5, "carol")  # within a partition the oldest goes first; alice (least recent) goes first of all
    assert cache.partitions == ["carol"] and cache.partition_tokens("carol") == 8 and cache.evicted == 2


def test_removing_what_was_never_inserted_is_refused():
    trie = SuffixTrie(4)
    trie.insert([1, 2, 3])
    with pytest.raises(ValueError, match="not in the suffix tree"):
        trie.remove([7, 8])


def test_memory_is_bounded_by_the_budget():
    cache = SuffixCache(max_tokens=2000, max_depth=16)
    for i in range(50):  # novel text: the worst case, max_depth nodes per token
        cache.add([(i * 131 + j * 7919) % 50_000 for j in range(200)])
    assert cache.tokens <= 2000
    per_token = cache.bytes_per_token()
    # each token: <= max_depth nodes of 33 bytes in the arrays (+ extra children), plus its own 8 bytes
    assert 8 < per_token < 16 * (33 + 200)
    assert cache.memory_bytes() < 2000 * 16 * (33 + 200)


@pytest.mark.parametrize("kw", [dict(max_depth=0), dict(max_depth=65), dict(max_tokens=-1)])
def test_bad_settings(kw):
    with pytest.raises(ConfigError):
        SuffixCache(**kw)
