"""Draft-model drafter: a smaller causal LM with its own KV cache proposes K tokens autoregressively."""

from __future__ import annotations

from collections.abc import Generator

import torch

from adaspec.backends.base import Backend
from adaspec.drafters.base import Draft, Drafter, DraftStop, Proposal, empty_draft, run_proposal
from adaspec.errors import ConfigError
from adaspec.processors import LogitsControls
from adaspec.sampling import SamplingParams, logits_to_probs, sample
from adaspec.tree import depths, main_path


class ModelDrafter(Drafter):
    """Drafts with a model behind any :class:`Backend` (Leviathan et al. 2023's approximation model M_q).

    The draft cache holds a prefix of the sequence plus the drafts it fed itself. Before each proposal the cache is
    rolled back to the longest prefix shared with the engine's sequence (rejected drafts disappear) and the missing
    tokens (usually the correction or bonus token, plus the last accepted draft) are fed in one forward.
    Drafting K tokens costs K forwards; the last drafted token is never fed (the next call feeds it if accepted).
    Near the end of the draft model's own context window (which may be shorter than the target's) it drafts fewer
    tokens, then none: the engine then takes plain steps.

    The cache outlives a request: a new request's first proposal keeps the prefix it shares with the previous
    sequence (a multi-turn chat repeats the earlier prompt and answer) and feeds only the rest. The cache is
    trusted while the backend holds as many tokens as this drafter fed it; when someone else reset or fed the
    backend in between, the drafter starts from an empty cache.

    **Bounded catch-up** (``catch_up``): a proposal that would feed more than ``catch_up`` tokens (the prompt of a
    lazily prefilled request, the text of a long plain run) instead restarts the cache from the sequence's last
    ``catch_up`` tokens: the draft model then sees a window of the text (from that token on, at positions counted
    from 0) that grows as drafting goes on. Which tokens are proposed changes, never what the target emits.
    """

    def __init__(self, backend: Backend, *, follow_controls: bool = True, tree_expand: int = 4,
                 tree_top_k: int = 8, catch_up: int | None = None) -> None:
        """Args:
            backend: the draft model (any :class:`Backend`); it may hold several sequences for batched rows.
            follow_controls: propose from logits after the request's penalties and logit bias
                (:meth:`set_controls`); False proposes from the raw draft logits (output is the same either way,
                acceptance differs).
            tree_expand: token trees (:meth:`propose_tree`) grow level by level, the ``tree_expand`` most likely
                nodes of each level expanded by one draft forward (EAGLE-2), where the backend can grow trees
                (``supports_tree_growth``); 0, or a backend that cannot, drafts one-level trees (the chain plus
                sibling leaves).
            tree_top_k: children considered per expanded node.
            catch_up: the most tokens a proposal feeds to catch up (at least 2: the last draft and the
                correction; at most half the draft model's context window, which a restart must leave room to
                draft in); None: no bound, the draft model always sees the whole sequence.

        Raises:
            ConfigError: ``tree_expand`` < 0, ``tree_top_k`` < 1 or ``catch_up`` < 2."""
        if tree_expand < 0 or tree_top_k < 1:
            raise ConfigError(f"tree_expand must be >= 0 and tree_top_k >= 1, got {tree_expand} and {tree_top_k}")
        self.backend = backend
        self.follow_controls = follow_controls
        self.tree_expand = tree_expand
        self.tree_top_k = tree_top_k
        self.name = backend.name
        self._cached: list[int] = []  # token ids whose KV is in the backend's cache: ids[_offset:_offset + len]
        self._offset = 0  # where the cache starts in the sequence (> 0 after a bounded catch-up's restart)
        self._stable = 0  # sequence length known to equal the engine's sequence (cached tokens from _offset on)
        self.catch_up = catch_up
        self._controls: LogitsControls | None = None  # the request's penalties / logit bias (set_controls)
        self._prompt_len = 0

    @property
    def catch_up(self) -> int | None:
        """The bounded catch-up in effect (the setting, at most half the draft model's window); None: no bound.
        Setting it empties the cache of a drafter holding a window (the next proposal feeds as the new bound says).

        Raises:
            ConfigError: set below 2."""
        return self._catch_up

    @catch_up.setter
    def catch_up(self, n: int | None) -> None:
        n = check_catch_up(n)
        self._catch_up = None if n is None else min(n, max(self.backend.max_context // 2, 2))
        if self._offset:
            self.forget()

    def for_sequence(self, seq: int) -> ModelDrafter:
        return ModelDrafter(self.backend.sequence(seq), follow_controls=self.follow_controls,
                            tree_expand=self.tree_expand, tree_top_k=self.tree_top_k, catch_up=self.catch_up)

    def prefill(self, prompt_ids: list[int]) -> None:
        # Lazy: the first proposal feeds the prompt (chunked) through _sync, so a request that never speculates
        # (the controller chose K = 0 throughout) never pays for the draft's prefill. The cache is kept: _sync
        # cuts it at the first token that differs from the new sequence, checked token by token from 0.
        self._stable = 0

    def set_controls(self, controls: LogitsControls | None, prompt_len: int) -> None:
        """Propose from the draft's logits after the request's controls (the history at each drafted position is
        ``ids`` plus the tokens drafted before it), so under penalties the draft proposes what the controlled target
        will accept. The draft's vocabulary may be narrower: biases and counts of ids outside it are dropped."""
        self._controls = controls if self.follow_controls and controls is not None and controls.active else None
        self._prompt_len = prompt_len

    def cached_prefix(self, ids: list[int]) -> int:
        """Leading tokens of ``ids`` a proposal would not feed: the common prefix with what the cache was fed
        (after a bounded catch-up's restart, counted from the window's start, the tokens before it included)."""
        if self.backend.seq_len != len(self._cached):
            return 0
        n = self._common(ids, len(self._cached))
        return self._offset + n if n else 0

    def _common(self, ids: list[int], limit: int, known: int = 0) -> int:
        """Leading cached tokens (at most ``limit``) equal to ``ids`` from the cache's offset on; the first
        ``known`` of them are taken as equal unchecked."""
        offset, cached = self._offset, self._cached
        limit = min(limit, len(ids) - offset)
        n = max(min(known, limit), 0)
        while n < limit and cached[n] == ids[offset + n]:  # indexed, not sliced: no copy of the sequence per step
            n += 1
        return n

    def feed(self, ids: list[int], limit: int | None = None) -> int:
        """Bring the cache to hold all of ``ids`` but its last token, as the first proposal after ``ids`` would
        (e.g. to take a draft prefill out of a timed run; a bounded catch-up restarts at the last ``catch_up``
        tokens first); nothing beyond the draft model's window. ``limit``: feed at most that many of the tokens
        it lacks, the first ones (a later call goes on: a draft prefill spread over steps). Like :meth:`prefill`,
        it starts a new sequence. Returns the number of tokens fed."""
        self._stable = 0
        pending = self._sync(ids)[:-1][:limit]
        if not pending or self._room(ids) < 0:
            return 0
        self._feed(pending)
        return len(pending)

    def lag(self, ids: list[int]) -> int:
        """Tokens of ``ids`` the cache lacks, at most ``catch_up``: about what the next proposal after ``ids`` feeds
        (0 when the cache holds them all; the proposal then feeds the last one again)."""
        lag = len(ids) - self.cached_prefix(ids)
        return lag if self.catch_up is None else min(lag, self.catch_up)

    def _sync(self, ids: list[int]) -> list[int]:
        """Roll the cache back to the prefix shared with ``ids``; return the tokens still to feed (never empty).
        With a ``catch_up`` bound, more than ``catch_up`` of them, or more of ``ids`` from the cache's offset on than
        the draft model's window holds: the cache restarts at the last ``catch_up`` tokens of ``ids``."""
        if self.backend.seq_len != len(self._cached):  # the backend was reset or fed behind this drafter's back
            self.backend.reset()
            self._cached, self._stable, self._offset = [], 0, 0
        # always feed at least one token to get logits
        n = self._common(ids, min(len(self._cached), len(ids) - 1 - self._offset), self._stable - self._offset)
        if n == 0 and self._offset:  # nothing shared with the window: a new sequence starts from its first token
            self._offset = 0
        start = self._offset + n
        bound = self.catch_up
        if bound is not None and (len(ids) - start > bound or len(ids) - self._offset > self.backend.max_context):
            self.backend.reset()  # lagging by more than the bound, or the window is full: the last `bound` tokens
            self._cached, self._offset, n = [], len(ids) - bound, 0
        elif n < len(self._cached):
            self.backend.truncate(n)
        del self._cached[n:]
        return ids[self._offset + n:]

    def _room(self, ids: list[int]) -> int:
        """Positions left in the draft model's window after ``ids`` as the cache holds it (from its offset)."""
        return self.backend.max_context - (len(ids) - self._offset)

    def forget(self) -> None:
        """Empty the draft cache: the next proposal feeds the whole sequence, as a first request's would."""
        self._cached, self._stable, self._offset = [], 0, 0
        self.backend.reset()

    def _feed(self, tokens: list[int]) -> torch.Tensor:
        """Forward ``tokens`` through the draft model and record them as cached; returns the last position's ``[V]``
        logits (see :meth:`_fed`)."""
        return run_proposal(self._fed(tokens))

    def _fed(self, tokens: list[int]) -> Generator[tuple[Backend, list[int]], torch.Tensor, torch.Tensor]:
        """Ask for ``tokens`` to be fed (yield), then record them as cached and return the logits sent back. If the
        forward fails, the cache is emptied before the error propagates: the cache is kept across requests, so a
        half-extended one (an interrupt, out of memory) must not outlive the failure."""
        try:
            logits = yield self.backend, tokens
        except BaseException:
            try:
                self.forget()
            except Exception:  # the backend is broken too: the next request's _sync starts from seq_len anyway
                pass
            raise
        self._cached.extend(tokens)
        return logits

    def propose(self, ids: list[int], k: int, sampling: SamplingParams, generator: torch.Generator | None = None,
                stop: DraftStop | None = None) -> Draft:
        return run_proposal(self.proposal(ids, k, sampling, generator, stop))

    def propose_tree(self, ids: list[int], depth: int, budget: int, sampling: SamplingParams,
                     generator: torch.Generator | None = None, expand: int | None = None) -> Draft:
        """A token tree of at most ``budget`` nodes and ``depth`` levels from the draft model.

        **Grown trees** (``expand``, default ``tree_expand``, > 0 and a backend that can grow trees,
        :meth:`_grown_tree`): level by level, the ``expand`` best nodes of the level are expanded by one draft forward
        (:meth:`Backend.grow_tree`), each proposing its ``tree_top_k`` best children; the ``budget`` best nodes by path
        probability are kept (EAGLE-2, Li et al. 2024). Under sampling the children are sampled without replacement from
        the draft's distribution and the draft returns it (``probs``), for the multi-draft rule of
        :func:`~adaspec.tree.verify_tree_sampling`.

        **One-level trees** (otherwise, :meth:`_tree_proposal`): the draft's most likely chain of ``depth`` tokens,
        plus the tokens it ranks next at each depth as sibling leaves, as many as the budget leaves room for.

        Either way the first child at every node is the draft's best guess there (greedy; under sampling its first
        draw), the tree's main path (:meth:`Draft.as_chain`), and a deterministic tree's smaller budget keeps a
        prefix of the nodes (what :meth:`~adaspec.controllers.tree_choice.TreeChoice.width` assumes).

        Returns:
            a :class:`Draft` with ``parents`` (at most ``budget`` nodes), or an empty one where the draft model's
            window leaves no room.
        """
        expand = self.tree_expand if expand is None else expand
        if expand < 0:
            raise ConfigError(f"a tree expands >= 0 nodes per level, got {expand}")
        if expand and self.backend.supports_tree_growth and budget > 1 and depth > 1:
            draft = self._grown_tree(ids, depth, budget, sampling, generator, expand)
            if draft is not None:
                return draft
        return run_proposal(self._tree_proposal(ids, min(depth, budget), budget, sampling))

    def _grown_tree(self, ids: list[int], depth: int, budget: int, sampling: SamplingParams,
                    generator: torch.Generator | None, expand: int) -> Draft | None:
        """EAGLE-2's dynamic draft tree (Li et al. 2024, §4.1 expansion and §4.2 re-ranking), on a backend that grows
        trees; None where the draft window has no room for it (the caller drafts a one-level tree).

        Every candidate node has a key: its parent's key times the draft probability of the j-th most likely token
        there (j = the node's rank among its siblings), capped at its parent's key. Greedy (and for deterministic
        drafts) the j-th child is that token, so the key is the node's path probability Π q; under sampling the j-th
        child is the j-th draw without replacement from q (exponential race, Plackett-Luce order), and the key, fixed
        before the draw, is the j-th largest probability. Each level expands at most ``min(expand, room // levels)``
        nodes, a cap fixed before any draw, and only nodes still among the ``budget`` best keys so far. Kept: the
        ``budget`` best keys (ties: the shallower, then the earlier), a set closed under ancestors whose siblings
        keep their draw order.

        Why sampling stays lossless (:func:`~adaspec.tree.verify_tree_sampling` needs each node's children to be an
        ordered draw from q without replacement, of a number that may depend on earlier siblings' draws but not on
        their own): a node X's draw changes only its descendants' keys, which are at most X's own. They can push
        out of a level's expansion slots, or of the budget, only nodes with lower keys than X, whose own descendants
        then rank below X too; X itself wins ties (shallower), and X's earlier siblings have keys at least X's. So
        whether X is kept never depends on X's draw. (A cap on expansions that shrank with the nodes grown so far
        would break this: X's draw would decide how much room deeper, better nodes get.)

        The draft cache keeps the main path's expanded nodes, as a chain draft keeps its drafted tokens. A forward
        that fails empties the draft cache (as :meth:`_fed` does) before the error propagates.
        """
        pending = self._sync(ids)
        depth = min(depth, self._room(ids) + 1)
        if depth <= 1:
            return None
        logits = self._feed(pending)
        self._stable = len(ids)
        base = self.backend.seq_len  # the cache before the tree: ids from the cache's offset on
        # grown entries that fit the draft cache, and the backend's tree capacity (GGUF: a sequence per node at most),
        # shared out between the levels before any draw
        room = min(self.backend.max_context - self.backend.seq_len, self.backend.max_tree_nodes)
        if room < 1:
            return None
        depth = min(depth, room + 1)
        cap = min(expand, room // (depth - 1))
        greedy = sampling.greedy
        tokens: list[int] = []
        parents: list[int] = []
        keys: list[float] = []
        rows: list[int] = []  # each node's parent distribution, an index into dists
        dists: list[torch.Tensor] = []
        grown_at: dict[int, int] = {}  # node -> its index among the grown (forwarded) nodes
        grown = 0
        frontier: list[tuple[int, torch.Tensor]] = [(-1, logits)]
        history = {-1: list(ids)}
        node_key = {-1: 1.0}
        for level in range(depth):
            level_nodes = []
            for node, lg in frontier:
                if self._controls is not None:
                    lg = self._controls.apply(lg[None], history[node], self._prompt_len)[0]
                q = torch.softmax(lg.float(), -1) if greedy else logits_to_probs(lg, sampling).float()
                dists.append(q)
                ranked = _top_tokens(q, self.tree_top_k)  # [(prob, token)] best first, ties by id
                if greedy:
                    drawn = [t for _, t in ranked]
                else:
                    race = (q / torch.empty_like(q).exponential_(generator=generator)).masked_fill_(q <= 0, -1.0)
                    drawn = torch.topk(race, len(ranked)).indices.tolist()
                for (prob, _), token in zip(ranked, drawn):
                    tokens.append(int(token))
                    parents.append(node)
                    keys.append(min(node_key[node] * prob, node_key[node]))
                    rows.append(len(dists) - 1)
                    level_nodes.append(len(tokens) - 1)
            if level == depth - 1 or not level_nodes:
                break
            # expand the level's best nodes that could still be among the budget best (a node ranked below the
            # budget now only falls further as deeper candidates arrive)
            order = sorted(range(len(tokens)), key=lambda i: (-keys[i], i))
            rank = {n: r for r, n in enumerate(order)}
            best = [n for n in sorted(level_nodes, key=lambda i: (-keys[i], i))[:cap] if rank[n] < budget]
            if not best:
                break
            for n in best:
                node_key[n] = keys[n]
                history[n] = history[parents[n]] + [tokens[n]]
            try:
                out = self.backend.grow_tree([tokens[n] for n in best],
                                             [grown_at[parents[n]] if parents[n] >= 0 else -1 for n in best])
            except BaseException:
                self.forget()
                raise
            for j, n in enumerate(best):
                grown_at[n] = grown + j
            grown += len(best)
            frontier = list(zip(best, out))
        depth_of = depths(parents)
        keep = sorted(range(len(tokens)), key=lambda i: (-keys[i], depth_of[i], i))[:budget]
        index = {n: i for i, n in enumerate(keep)}
        draft = Draft(torch.tensor([tokens[n] for n in keep], dtype=torch.long),
                      None if greedy else torch.stack([dists[rows[n]] for n in keep]),
                      parents=[index[parents[n]] if parents[n] >= 0 else -1 for n in keep])
        # the draft cache keeps the main path's grown entries (the chain a chain draft would have cached)
        chain = []
        for i in main_path(draft.parents):
            if keep[i] not in grown_at:
                break
            chain.append(keep[i])
        if grown:
            self.backend.keep_tree_path(base, [grown_at[n] for n in chain])
            self._cached.extend(tokens[n] for n in chain)
        return draft

    def _tree_proposal(self, ids: list[int], depth: int, budget: int, sampling: SamplingParams) -> Proposal:
        pending = self._sync(ids)
        depth = min(depth, self._room(ids) + 1)
        if depth <= 0:
            return empty_draft()
        logits = yield from self._fed(pending)
        self._stable = len(ids)
        chain: list[int] = []
        dists: list[torch.Tensor] = []
        history = list(ids)
        for i in range(depth):
            if self._controls is not None:
                logits = self._controls.apply(logits[None], history, self._prompt_len)[0]
            q = torch.softmax(logits.float(), -1) if sampling.greedy else logits_to_probs(logits, sampling).float()
            token = int(q.argmax())
            chain.append(token)
            dists.append(q)
            if i == depth - 1:
                break
            history.append(token)
            logits = yield from self._fed([token])
        spare = budget - len(chain)
        alternatives: list[tuple[float, int, int]] = []  # (path probability, depth, token)
        reach = 1.0
        for i, (q, token) in enumerate(zip(dists, chain)):
            if spare > 0:  # the spare + 1 best, ties at the cut broken by id (which ties topk returns varies with k)
                alternatives += [(reach * prob, i, t) for prob, t in _top_tokens(q, spare + 1) if t != token]
            reach *= float(q[token])
        # rank order, ties to the shallower and the lower id: a smaller budget keeps a prefix of the nodes
        chosen = sorted(alternatives, key=lambda a: (-a[0], a[1], a[2]))[:max(spare, 0)]
        tokens = chain + [t for _, _, t in chosen]
        parents = list(range(-1, len(chain) - 1)) + [i - 1 for _, i, _ in chosen]
        return Draft(torch.tensor(tokens, dtype=torch.long), None, parents=parents)

    def proposal(self, ids: list[int], k: int, sampling: SamplingParams, generator: torch.Generator | None = None,
                 stop: DraftStop | None = None) -> Proposal:
        if k <= 0:
            return empty_draft()
        pending = self._sync(ids)
        k = min(k, self._room(ids) + 1)  # the draft model's window may be shorter than the target's
        if k <= 0:
            return empty_draft()
        logits = yield from self._fed(pending)
        self._stable = len(ids)  # the engine never rewrites ids, so this prefix stays valid
        tokens: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []
        history = list(ids) if self._controls is not None else ids  # ids + the tokens drafted so far (controls)
        for i in range(k):
            if self._controls is not None:
                logits = self._controls.apply(logits[None], history, self._prompt_len)[0]
            if sampling.greedy:
                token = logits.argmax()
                q = torch.softmax(logits.float(), -1) if stop is not None else None
            else:
                q = logits_to_probs(logits, sampling)
                token = sample(q, generator)
                probs.append(q)
            tokens.append(token)
            stopped = stop is not None and stop(i, q, int(token))  # asked at the last position too: its q is data
            if stopped or i == k - 1:
                break
            token_id = int(token)
            if self._controls is not None:
                history.append(token_id)
            logits = yield from self._fed([token_id])
        return Draft(torch.stack(tokens), torch.stack(probs) if probs else None)


def check_catch_up(n: int | None) -> int | None:
    """``n`` as a bounded catch-up (None: no bound).

    Raises:
        ConfigError: ``n`` below 2 (a proposal always feeds the last draft and the correction)."""
    if n is not None and n < 2:
        raise ConfigError(f"a draft model's catch-up bound must be >= 2 tokens (or None for no bound), got {n}")
    return n


def _top_tokens(q: torch.Tensor, k: int) -> list[tuple[float, int]]:
    """The ``k`` most likely tokens of ``q`` with nonzero probability, as ``(probability, id)`` best first, ties by
    id (which tied ids topk returns varies with k)."""
    want = min(k, q.shape[0])
    floor = torch.topk(q, want).values[-1]
    above = torch.nonzero(q > floor).flatten().tolist()
    ties = torch.nonzero(q == floor).flatten().tolist()[:want - len(above)]
    out = sorted(((float(q[t]), t) for t in above + ties), key=lambda pt: (-pt[0], pt[1]))
    return [(p, t) for p, t in out if p > 0]

