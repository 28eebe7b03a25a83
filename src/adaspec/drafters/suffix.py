"""SuffixDecoding drafter: drafts from this request's prompt and output and from earlier requests' responses.

SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975; ArcticInference, vLLM's ``suffix`` method): two suffix
tries (:mod:`adaspec.drafters.suffix_tree`) — a per-request one over the prompt and the output so far (updated as
tokens are accepted, O(max_depth) per token), and the global :class:`~adaspec.drafters.suffix_cache.SuffixCache` of
earlier finished responses, which outlives requests. For each length m of the sequence's last tokens that occurs
in a trie, the candidate continuation follows the counts below that pattern's node: a child's probability is
``count(child) / count(node)`` and a path's probability the product along it. Speculation length follows the
paper's rule: at most ``max_spec_factor · m`` tokens (and the caller's K; the trie holds ``max_depth - m`` below a
match), stopping where the path probability falls below ``min_token_prob``. Match lengths with equal counts are the
same occurrences, so of each such run only the length allowing the longest proposal is tried. Among the (trie, m)
candidates the one with the highest score (the sum of its nodes' path probabilities: the expected number of
accepted tokens if the frequencies were the target's) wins; on a tie, earlier answers before the request's own text.

Chains follow the most frequent child; :meth:`SuffixDrafter.propose_tree` expands the most probable nodes first
into a token tree of at most ``budget`` nodes (verified by :mod:`adaspec.tree`). Proposals are deterministic
given the sequence and the cache (``Draft.probs`` is None: the verifier treats q as one-hot), so greedy and
sampled output stay the target's.

The prompt's other spellings (:mod:`adaspec.drafters.text_views`, ``views``) go into a third trie, matched after the
request's own: once the answer writes an escape (a backslash token), the prompt as it reads inside a JSON string, so
a tool call's string argument can copy the prompt's code; and from the prefill, the text of the prompt's JSON
strings that hold escapes (a tool result), so a raw answer can copy them. On equal scores the other spelling wins
where it matches the sequence's end further back than the best so far, or as far back while the answer is writing
escaped text (its last backslash came after its last raw newline).

Only finished responses enter the global cache (:meth:`SuffixDrafter.finish`, called by the engines when a
request ends normally): a request cancelled mid-generation leaves nothing there. Each response is stored with the
last ``context_tokens`` prompt tokens in front (a chat template's assistant header), so the start of the next
response can match too.
"""

from __future__ import annotations

import heapq
import math

import torch

from adaspec.drafters.base import Draft, Drafter, DraftStop, empty_draft
from adaspec.drafters.suffix_cache import SuffixCache
from adaspec.drafters.suffix_tree import SuffixTrie, TrieCursor
from adaspec.drafters.text_views import text_views_for
from adaspec.errors import ConfigError
from adaspec.sampling import SamplingParams


class SuffixDrafter(Drafter):
    """SuffixDecoding over the request (prompt + output) and a global cache of earlier responses.

    Args:
        cache: the global cache (shared by every drafter built from this one: :meth:`for_sequence`,
            :meth:`with_partition`); None builds one of ``max_tokens`` tokens.
        partition: the cache partition this drafter reads and writes (e.g. an API key's).
        max_depth: trie depth (match length + speculation length), 1..64 (default 24, vLLM's default).
        max_tokens: size of a cache built here (tokens; 0 = no global cache, the request's own text only).
        max_spec_factor: at most ``max_spec_factor · m`` tokens after a match of m tokens (paper: α).
        min_token_prob: stop a path where its probability falls below this.
        min_match: shortest match used (tokens).
        context_tokens: prompt tokens stored in front of each cached response.
        consult_stop: ask the controller's stop rule (``stop`` of :meth:`propose`, e.g. the goodput controller's
            confidence stop) after each drafted token, with that token's frequency q = count(child) / count(node)
            as its probability, so the controller prices each candidate token instead of the rule alone (give a
            large ``max_spec_factor`` and ``min_token_prob`` 0 to leave the length to it).
        views: also match the prompt's other spellings (see the module docstring); needs ``tokenizer``.
        tokenizer: the target's tokenizer (None: no other spellings).

    Raises:
        ConfigError: a setting out of range.
    """

    name = "suffix"
    free_trees = True
    lookup = True

    def __init__(self, cache: SuffixCache | None = None, *, partition: str = "", max_depth: int = 24,
                 max_tokens: int = 100_000, max_spec_factor: float = 1.0, min_token_prob: float = 0.1,
                 min_match: int = 1, context_tokens: int = 4, consult_stop: bool = False, views: bool = True,
                 tokenizer=None) -> None:
        if max_spec_factor <= 0:
            raise ConfigError(f"suffix max_spec_factor must be > 0, got {max_spec_factor}")
        if not 0.0 <= min_token_prob <= 1.0:
            raise ConfigError(f"suffix min_token_prob must be in [0, 1], got {min_token_prob}")
        if min_match < 1 or context_tokens < 0:
            raise ConfigError(f"suffix needs min_match >= 1 and context_tokens >= 0, got {min_match}, "
                              f"{context_tokens}")
        self.cache = cache if cache is not None else SuffixCache(max_tokens, max_depth)
        self.partition = partition
        self.max_depth = self.cache.max_depth
        self.max_spec_factor = max_spec_factor
        self.min_token_prob = min_token_prob
        self.min_match = min_match
        self.context_tokens = context_tokens
        self.consult_stop = consult_stop
        self.views = views
        self.tokenizer = tokenizer
        self._respell = text_views_for(tokenizer) if views else None
        self._new_views([])  # the prompt's other spellings: a trie built when first needed
        self._local = SuffixTrie(self.max_depth)
        self._cursor = TrieCursor(self._local)
        self._prompt: list[int] = []
        self._open = False  # a request is running whose response is not committed yet
        self.last_match = 0  # match length of the last proposal (0: none)
        self._memo_key: tuple | None = None
        self._request = 0  # counts prefills (the memo's key)
        self._memo: tuple[list[int], float, int, list[float]] = ([], 0.0, 0, [])

    def _settings(self) -> dict:
        return dict(max_spec_factor=self.max_spec_factor, min_token_prob=self.min_token_prob,
                    min_match=self.min_match, context_tokens=self.context_tokens, consult_stop=self.consult_stop,
                    views=self.views, tokenizer=self.tokenizer)

    def for_sequence(self, seq: int) -> SuffixDrafter:
        """A drafter for batch row ``seq``: its own request state, the same global cache and partition."""
        return SuffixDrafter(self.cache, partition=self.partition, **self._settings())

    def with_partition(self, partition: str) -> SuffixDrafter:
        """A drafter of the same settings and cache that reads and writes ``partition`` only."""
        return SuffixDrafter(self.cache, partition=partition, **self._settings())

    # A request's life ---------------------------------------------------------------------------------------------
    def set_partition(self, partition: str) -> None:
        """Read and write ``partition`` of the cache from the next request on (the engines call it before
        :meth:`prefill` when :attr:`GenerationConfig.cache_partition <adaspec.engine.GenerationConfig>` is set)."""
        self.partition = partition

    def prefill(self, prompt_ids: list[int]) -> None:
        self.cache.touch(self.partition)  # a partition in use is evicted last
        self._prompt = list(prompt_ids)
        self._local = SuffixTrie(self.max_depth)  # indexed lazily, at the first proposal
        self._cursor = TrieCursor(self._local)
        self._new_views(self._prompt)
        self._open = True
        self._request += 1

    def _new_views(self, prompt: list[int]) -> None:
        """Start the other spellings of ``prompt`` (the request's; [] for a sequence that is not one): the text of
        its escaped JSON strings now, its JSON-escaped text once the answer writes a backslash (:meth:`_add_views`)."""
        self._views: SuffixTrie | None = None
        self._view_prompt = prompt
        self._scanned = len(prompt)  # tokens of the sequence read for the spelling the answer writes in
        self._escaped_added = not prompt
        self._spelling = ""  # what the answer writes in: "escaped", "raw" or "" (neither seen yet)
        if self._respell is not None and self._respell.has_escape(prompt):
            self._index_views(self._respell.unescaped(prompt))

    def finish(self, ids: list[int]) -> None:
        """The request prefilled last ended normally with ``ids`` (prompt + output): cache its response, with the
        last ``context_tokens`` prompt tokens in front. A no-op when no request is open or ``ids`` do not extend
        its prompt."""
        n = len(self._prompt)
        if not self._open or len(ids) <= n or ids[:n] != self._prompt:
            return
        self._open = False
        self.cache.add(ids[max(n - self.context_tokens, 0):], self.partition)

    def _sync(self, ids: list[int]) -> None:
        """Index ``ids`` but the last token in the request's trie (so its own suffix never matches itself)."""
        cur = self._cursor
        if cur.length > len(ids) - 1:  # not an extension of what was indexed (a caller outside the engines)
            self._local = SuffixTrie(self.max_depth)
            cur = self._cursor = TrieCursor(self._local)
            self._new_views([])
            self._request += 1
        cur.extend(ids[cur.length:len(ids) - 1])
        if self._respell is not None:
            self._add_views(ids)

    def _add_views(self, ids: list[int]) -> None:
        """Follow the spelling the answer writes in (its last token with a backslash or a raw newline) and index the
        prompt JSON-escaped once the answer holds a token with a backslash."""
        new = ids[self._scanned:]
        self._scanned = max(self._scanned, len(ids))
        self._spelling = self._respell.spelling(new, self._spelling)
        if not self._escaped_added and self._respell.has_escape(new):
            self._escaped_added = True
            self._index_views([self._respell.escaped(self._view_prompt)])

    def _index_views(self, seqs: list[list[int]]) -> None:
        for seq in filter(None, seqs):
            if self._views is None:
                self._views = SuffixTrie(self.max_depth)
            self._views.insert(seq)

    # Candidates -----------------------------------------------------------------------------------------------------
    def _spec_len(self, m: int, k: int) -> int:
        return min(k, max(1, math.floor(self.max_spec_factor * m)))

    def _chain(self, trie: SuffixTrie, node: int, limit: int) -> tuple[list[int], float, list[float]]:
        """Most frequent continuation below ``node``: (tokens, score = Σ path probabilities, each token's
        frequency given the ones before)."""
        tokens, freqs, p, score = [], [], 1.0, 0.0
        count = trie.count
        while len(tokens) < limit:
            kids = trie.children(node)
            if not kids:
                break
            t, c = kids[0]
            f = count[c] / count[node]
            if p * f < self.min_token_prob:
                break
            tokens.append(t)
            freqs.append(f)
            p, node = p * f, c
            score += p
        return tokens, score, freqs

    def _candidates(self, ids: list[int]):
        """``(trie, m, node, longest)`` for every trie and match length m >= ``min_match`` with a continuation
        (``longest``: the trie's longest match of the sequence's end)."""
        self._sync(ids)
        shared = self.cache.trie(self.partition)
        tries = [t for t in (shared, self._local, self._views) if t is not None]
        for trie in tries:
            # Matches with as many occurrences as each other are the same occurrences: the same continuations. Of
            # such a run only the length that allows the longest proposal is tried (max_spec_factor · m tokens, and
            # the trie holds max_depth - m below the match).
            matches = trie.matches(ids)
            longest = matches[-1][0] if matches else 0
            run: list[tuple[int, int]] = []
            for m, node in matches:
                if m < self.min_match or trie.tok1[node] < 0:
                    continue
                if run and trie.count[run[-1][1]] != trie.count[node]:
                    yield trie, *max(run, key=lambda mn: self._room(mn[0])), longest
                    run = []
                run.append((m, node))
            if run:
                yield trie, *max(run, key=lambda mn: self._room(mn[0])), longest

    def _wins(self, score: float, trie: SuffixTrie, longest: int, best: tuple[float, int]) -> bool:
        """Whether a candidate of ``score`` from ``trie`` beats the best so far, ``(score, its trie's longest
        match)``: a higher score wins. On a tie the prompt's other spelling wins where it matches the sequence's end
        further back, or as far back while the answer is writing escaped text (its last backslash came after its
        last raw newline); else earlier answers win over the request's own text, and that over the other spelling."""
        if score > best[0]:
            return True
        return (score == best[0] > 0 and trie is self._views
                and (longest > best[1] or (longest == best[1] and self._spelling == "escaped")))

    def _room(self, m: int) -> tuple[int, int]:
        """How long a proposal after a match of ``m`` tokens can be (ties: the longer match)."""
        return min(math.floor(self.max_spec_factor * m), self.max_depth - m), m

    def best_chain(self, ids: list[int], k: int) -> tuple[list[int], float, int]:
        """The best chain of at most ``k`` tokens after ``ids``: (tokens, score, match length); ([], 0.0, 0) when
        nothing matches. The last answer is reused while the sequence, ``k`` and the cache are unchanged (a routed
        step asks :meth:`available` and then :meth:`propose`)."""
        return self._best(ids, k)[:3]

    def _best(self, ids: list[int], k: int) -> tuple[list[int], float, int, list[float]]:
        """:meth:`best_chain` plus each token's frequency given the ones before."""
        key = (len(ids), ids[-1] if ids else -1, k, self.cache.version, self._request)
        if key == self._memo_key:
            return self._memo
        best: tuple[list[int], float, int, list[float]] = ([], 0.0, 0, [])
        reach = 0  # the best candidate's trie's longest match
        for trie, m, node, longest in self._candidates(ids):
            tokens, score, freqs = self._chain(trie, node, self._spec_len(m, k))
            if self._wins(score, trie, longest, (best[1], reach)):
                best, reach = (tokens, score, m, freqs), longest
        self._memo_key, self._memo = key, best
        return best

    def available(self, ids: list[int]) -> int:
        """Tokens a proposal can make now (the best chain's length, up to ``max_depth``): 0 = nothing to say.
        :class:`~adaspec.drafters.multi.MultiDrafter` offers it to a routing controller."""
        return len(self.best_chain(ids, self.max_depth)[0])

    def propose(self, ids: list[int], k: int, sampling: SamplingParams, generator: torch.Generator | None = None,
                stop: DraftStop | None = None) -> Draft:
        if k <= 0:
            return empty_draft()
        tokens, _, self.last_match, freqs = self._best(ids, self.max_depth)  # what available() saw, cut to k
        tokens = tokens[:k]
        if stop is not None and self.consult_stop:
            for i, (token, f) in enumerate(zip(tokens, freqs)):
                # a lookup has no distribution over the vocabulary: the stop rule gets the drafted token against
                # the rest, [1 - q, q], with the token at index 1 (all it reads is probs[token])
                if stop(i, torch.tensor([1.0 - f, f]), 1):
                    tokens = tokens[:i + 1]
                    break
        if not tokens:
            return empty_draft()
        return Draft(torch.tensor(tokens, dtype=torch.long))

    def propose_tree(self, ids: list[int], depth: int, budget: int, sampling: SamplingParams,
                     generator: torch.Generator | None = None, expand: int | None = None) -> Draft:
        """The best candidate as a token tree: nodes taken most probable path first (probability >=
        ``min_token_prob``, depth <= the speculation length), at most ``budget``; the highest-scoring tree over
        all (trie, match length) candidates wins."""
        if depth <= 0 or budget <= 0:
            return empty_draft()
        best: tuple[float, list[int], list[int]] = (0.0, [], [])
        reach = 0
        for trie, m, node, longest in self._candidates(ids):
            tokens, parents, score = self._tree(trie, node, self._spec_len(m, depth), budget)
            if self._wins(score, trie, longest, (best[0], reach)):
                best, reach = (score, tokens, parents), longest
        _, tokens, parents = best
        if not tokens:
            return empty_draft()
        return Draft(torch.tensor(tokens, dtype=torch.long), parents=parents)

    def _tree(self, trie: SuffixTrie, root: int, depth: int, budget: int) -> tuple[list[int], list[int], float]:
        """Best-first token tree below ``root``: (tokens, parents, score = Σ path probabilities)."""
        count = trie.count
        heap = [(-1.0, 0, root, -1, -1, 0)]  # (-path prob, tie order, trie node, token, draft parent, level)
        tokens: list[int] = []
        parents: list[int] = []
        score, order = 0.0, 1
        while heap and len(tokens) < budget:
            negp, _, node, token, parent, level = heapq.heappop(heap)
            here = parent
            if node != root:
                tokens.append(token)
                parents.append(parent)
                score -= negp
                here = len(tokens) - 1
            if level == depth:
                continue
            for t, c in trie.children(node):
                q = -negp * count[c] / count[node]
                if q < self.min_token_prob:
                    break  # children come most frequent first
                heapq.heappush(heap, (-q, order, c, t, here, level + 1))
                order += 1
        return tokens, parents, score


def _flag(value: str) -> bool:
    """``1``/``true``/``yes`` or ``0``/``false``/``no``.

    Raises:
        ValueError: anything else.
    """
    low = value.strip().lower()
    if low in ("1", "true", "yes"):
        return True
    if low in ("0", "false", "no"):
        return False
    raise ValueError(value)


_flag.__name__ = "0 or 1"

SPEC_KEYS = {"depth": ("max_depth", int), "tokens": ("max_tokens", int), "factor": ("max_spec_factor", float),
             "prob": ("min_token_prob", float), "match": ("min_match", int), "context": ("context_tokens", int),
             "stop": ("consult_stop", _flag), "views": ("views", _flag)}
"""``suffix:KEY=VALUE,...`` options (:func:`suffix_from_spec`) and the :class:`SuffixDrafter` argument each sets."""


def is_suffix_spec(spec: str) -> bool:
    low = spec.lower()
    return low == "suffix" or low.startswith("suffix:")


def suffix_from_spec(spec: str, tokenizer=None) -> SuffixDrafter:
    """A :class:`SuffixDrafter` from ``suffix`` or ``suffix:KEY=VALUE,...`` (see :func:`suffix_options`);
    ``tokenizer`` (the target's) lets it match the prompt's other spellings.

    Raises:
        ConfigError: an unknown key or a malformed value (names the key).
    """
    return SuffixDrafter(**suffix_options(spec), tokenizer=tokenizer)


def suffix_options(spec: str) -> dict:
    """The :class:`SuffixDrafter` arguments ``suffix`` or ``suffix:KEY=VALUE,...`` sets (only those it names), with
    keys ``depth`` (trie depth), ``tokens`` (global cache size in tokens), ``factor`` (max_spec_factor), ``prob``
    (min_token_prob), ``match`` (min_match), ``context`` (context_tokens), ``stop`` (consult_stop, 0 or 1) and
    ``views`` (match the prompt's other spellings, 0 or 1),
    e.g. ``suffix:tokens=200000,factor=2``; ``;`` separates them too, for comma-separated lists
    (``adaspec compare --methods suffix:tokens=5000;factor=2/goodput,plain``).

    Raises:
        ConfigError: an unknown key or a malformed value (names the key).
    """
    _, _, opts = spec.partition(":")
    kwargs: dict = {}
    for item in filter(None, (x.strip() for x in opts.replace(";", ",").split(","))):
        key, eq, value = item.partition("=")
        if not eq or key not in SPEC_KEYS:
            raise ConfigError(f"drafter {spec!r}: expected KEY=VALUE with KEY one of {', '.join(SPEC_KEYS)}, "
                              f"got {item!r}")
        arg, kind = SPEC_KEYS[key]
        try:
            kwargs[arg] = kind(value)
        except ValueError:
            raise ConfigError(f"drafter {spec!r}: {key} must be {kind.__name__}, got {value!r}") from None
    return kwargs


def with_own_cache(drafter: Drafter | None) -> Drafter | None:
    """``drafter`` with a fresh, empty global cache for each suffix drafter in it (the same settings; any other
    drafter, e.g. a draft model, shared as it is): methods compared side by side must not read each other's
    responses."""
    from adaspec.drafters.multi import MultiDrafter

    if isinstance(drafter, SuffixDrafter):
        return SuffixDrafter(SuffixCache(drafter.cache.max_tokens, drafter.cache.max_depth),
                             partition=drafter.partition, **drafter._settings())
    if isinstance(drafter, MultiDrafter) and any(isinstance(d, SuffixDrafter) for d in drafter.drafters.values()):
        return MultiDrafter({name: with_own_cache(d) for name, d in drafter.drafters.items()},
                            lazy_prefill=drafter.lazy_prefill)
    return drafter


def suffixes_in(drafter: Drafter | None) -> list[SuffixDrafter]:
    """The suffix drafters in ``drafter`` (itself, or sub-drafters of a MultiDrafter)."""
    from adaspec.drafters.multi import MultiDrafter

    parts = drafter.drafters.values() if isinstance(drafter, MultiDrafter) else [drafter]
    return [d for d in parts if isinstance(d, SuffixDrafter)]


def remember(drafter: Drafter | None, prompt: list[int], output: list[int]) -> None:
    """Cache ``output`` (the answer to ``prompt``, from an earlier run) in every suffix drafter in ``drafter``, as if
    ``drafter`` had just written it: a resumed benchmark's caches then hold what they held in one go."""
    for d in suffixes_in(drafter):
        d.prefill(list(prompt))
        d.finish(list(prompt) + list(output))


class CachePerMethod:
    """Each method of a benchmark its own copy of a drafter's suffix caches (:func:`with_own_cache`), kept across
    that method's requests in order. Methods that share a drafter object (``bench`` points differing in K or the
    controller) would otherwise draft from each other's answers, to the same prompt too."""

    def __init__(self) -> None:
        self._by: dict = {}

    def get(self, method, drafter: Drafter | None) -> Drafter | None:
        """``drafter`` itself when it holds no suffix drafter, else ``method``'s copy (made on first use)."""
        if not suffixes_in(drafter):
            return drafter
        if method not in self._by:
            self._by[method] = with_own_cache(drafter)
        return self._by[method]
