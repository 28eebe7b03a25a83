"""Speculation under a grammar (:mod:`adaspec.structured`), lossless: cut drafts, mask the verified rows.

One step over a chain of K drafts, with the grammar state at the sequence so far (the accepted prefix):

1. **Cut** (:func:`cut_draft`): the drafts are kept up to the first one the grammar rejects, before verification,
   so no verify width is spent on a token that cannot be emitted.
2. **Mask** (:func:`masked`): the matcher advances over the kept drafts, row i of the allowed-token masks is taken
   after ``drafts[:i]``, then it rolls back (:meth:`~adaspec.structured.GrammarState.masks`); each of the K' + 1
   verified rows of target logits gets -inf on the tokens its position forbids. Temperature, top-k/top-p/min-p then
   act on the masked logits, so the target distribution p at every position is the constrained one: the target's
   masked and renormalised distribution, exactly what constrained plain decoding samples from.
3. **Verify** as usual on the masked rows. Greedy: the argmax of the masked logits at each position, so the output
   is constrained plain greedy decoding token for token. Sampling: speculative (rejection) sampling (Leviathan et
   al. 2023) with the masked p and the draft's own q. Rejection sampling is exact for *any* proposal q, masked or
   not: a draft model that drafts without the grammar has q on tokens the grammar forbids, and those drafts are
   cut. At a cut position i the draft had proposed x_i ~ q_i with p_i(x_i) = 0, which rejection sampling would
   reject with certainty, drawing the correction from norm(max(p_i - q_i, 0)); :func:`residual_token` draws
   exactly that (not a plain sample of p_i, which would not be exact for a model's q). For a deterministic drafter
   (q = one-hot(x_i), n-gram lookup, grammar-forced tokens) the residual is p_i itself. A drafter whose q is
   itself masked by the grammar never proposes a token that is cut, and the rule is the textbook one on (p, q).
4. **Advance** the grammar over the emitted tokens (accepted drafts + the target's token) after the cut for EOS,
   max_tokens and stop strings, as the KV cache keeps them; rejected drafts were never consumed (rolled back in 2).

:class:`RequestGrammar` carries one request through these four steps; both engines use it per request
(:class:`~adaspec.engine.SpeculativeEngine`) and per batch row (:class:`~adaspec.batch.BatchEngine`), so a row
of a batch is constrained exactly as a request alone is. Token trees are not verified under a grammar (the engine
verifies chains and says so in :attr:`~adaspec.stats.GenerationStats.tree_fallback`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from adaspec.drafters.base import Draft
from adaspec.sampling import SamplingParams, logits_to_probs, sample
from adaspec.structured.state import GrammarState, mask_logits


def cut_draft(state: GrammarState, draft: Draft) -> tuple[Draft, torch.Tensor | None]:
    """``draft`` (a chain) cut before the first token the grammar rejects from ``state``, and the draft
    distribution q ``[V]`` of the rejected token (None when nothing was cut or the draft is deterministic)."""
    tokens = draft.tokens.tolist()
    n = state.valid_prefix(tokens)
    if n == len(tokens):
        return draft, None
    probs = draft.probs
    kept = Draft(draft.tokens[:n], None if probs is None else probs[:n], draft.source)
    return kept, None if probs is None else probs[n]


def masked(state: GrammarState, logits: torch.Tensor, drafts: list[int]) -> torch.Tensor:
    """The target's ``[K + 1, V]`` logits over ``[pending] + drafts`` with each row masked by the grammar after
    ``drafts[:i]`` (every draft allowed, :func:`cut_draft`); the state is left where it was."""
    return mask_logits(logits, state.masks(drafts))


def residual_token(masked_row: torch.Tensor, q: torch.Tensor, params: SamplingParams,
                   generator: torch.Generator) -> int:
    """The correction at a position whose draft (sampled from ``q``, ``[V_d]`` float) the grammar cut: a sample of
    norm(max(p - q, 0)) with p the masked target distribution of ``masked_row`` (``[V]`` logits). Exact rejection
    sampling, as the cut token has p = 0 (see the module docstring)."""
    p = logits_to_probs(masked_row[None], params)[0]
    width = max(p.shape[-1], q.shape[-1])
    p = torch.nn.functional.pad(p, (0, width - p.shape[-1]))
    q = torch.nn.functional.pad(q.float(), (0, width - q.shape[-1]))
    residual = (p - q).clamp_min(0.0)
    total = residual.sum()
    if not total > 0:  # q >= p everywhere p lives: cannot happen with p(x) = 0 < q(x), kept for safety
        residual, total = p, p.sum()
    return int(sample(residual / total, generator))


class RequestGrammar:
    """One request's grammar bookkeeping through the steps of a decoding loop (see the module docstring).

    A lazy grammar (``state.trigger`` set, :attr:`~adaspec.structured.Constraint.trigger`) is not applied until the
    output holds its trigger token: positions before it are free (unmasked, nothing cut), the trigger and every
    token after it go through the grammar, whose start state allows only the trigger. A cut that drops the trigger
    (max_tokens, a stop string) makes the grammar wait for it again.

    Args:
        state: the request's :class:`~adaspec.structured.GrammarState`, standing at the sequence so far; it is
            advanced only by :meth:`accept`, over the tokens the KV cache keeps.
    """

    def __init__(self, state: GrammarState) -> None:
        self.state = state
        self.trigger = state.trigger
        self.live = state.trigger is None  # the grammar applies (a lazy one: its trigger was emitted)
        self.cut_q: torch.Tensor | None = None  # the draft's q ``[V_d]`` of the token the last cut removed

    @property
    def ms(self) -> float:
        """Milliseconds spent in the grammar engine so far (masks, cuts, forced tokens)."""
        return self.state.ms

    def forced(self) -> list[int]:
        """The tokens the grammar forces from here (none while a lazy grammar waits for its trigger)."""
        return self.state.forced() if self.live else []

    def first(self, logits: torch.Tensor) -> torch.Tensor:
        """The prefill's last ``[1, V]`` logits masked by the grammar's start state (a lazy one: unmasked)."""
        return mask_logits(logits, self.state.allowed()[None]) if self.live else logits

    def cut(self, draft: Draft) -> Draft:
        """Step 1: ``draft`` (a chain) cut before the first token the grammar rejects (:func:`cut_draft`; a lazy
        grammar checks the drafts from its trigger on)."""
        tokens = draft.tokens.tolist()
        if not self.live and self.trigger not in tokens:  # a lazy grammar still waiting: nothing to check
            self.cut_q = None
            return draft
        start = 0 if self.live else tokens.index(self.trigger)
        tail = Draft(draft.tokens[start:], None if draft.probs is None else draft.probs[start:], draft.source)
        tail, self.cut_q = cut_draft(self.state, tail)
        if len(tail) == len(draft) - start:
            return draft
        n = start + len(tail)
        return Draft(draft.tokens[:n], None if draft.probs is None else draft.probs[:n], draft.source)

    def scored(self, logits: torch.Tensor, fed: list[int]) -> torch.Tensor:
        """Step 2: the target's ``[K + 1, V]`` logits over ``[pending] + fed`` (the cut draft), each row masked
        by the grammar after the drafts before it (:func:`masked`; a lazy grammar: the rows after its trigger)."""
        if self.live:
            return masked(self.state, logits, fed)
        if self.trigger not in fed:  # a lazy grammar still waiting: every row is free
            return logits
        start = fed.index(self.trigger)  # rows up to the trigger's own are free
        rows = self.state.masks(fed[start:])[1:]  # after the trigger, after each draft that follows it
        return torch.cat([logits[:start + 1], mask_logits(logits[start + 1:], rows)])

    def corrected(self, scored: torch.Tensor, n_accepted: int, n_drafted: int, token: int, params: SamplingParams,
                  generator: torch.Generator, lossy=None) -> int:
        """Step 3's token after verification on ``scored``: where every kept draft was accepted and a sampled
        draft was cut after them, the residual norm(max(p - q, 0)) at the cut (:func:`residual_token`) instead
        of ``token``; else ``token``."""
        if self.cut_q is not None and n_accepted == n_drafted and not params.greedy and lossy is None:
            return residual_token(scored[n_accepted], self.cut_q, params, generator)
        return token

    def accept(self, new: list[int], cut: Callable[[list[int]], tuple[list[int], str | None]]
               ) -> tuple[list[int], str | None]:
        """Step 4: advance the grammar over ``new`` (accepted drafts + the target's token) up to the token that
        completes it, apply the engine's ``cut`` (EOS, max_tokens, context, stop strings: ``tokens -> (kept,
        finish reason)``) and keep the grammar where the KV cache is kept. Returns ``(kept tokens, finish
        reason)``: ``"stop"`` when the grammar allows nothing more after them."""
        ended, woke = False, None  # woke: where a lazy grammar's trigger is in new
        was_live = self.live
        for i, t in enumerate(new):
            if not self.live:
                if t != self.trigger:
                    continue
                self.live, woke = True, i
            self.state.advance([t])
            if self.state.done:
                new, ended = new[:i + 1], True
                break
        consumed = len(new)
        new, finish = cut(new)
        first = 0 if was_live else (woke if woke is not None else consumed)  # new's first token in the grammar
        self.state.rollback(max(0, consumed - max(len(new), first)))
        if woke is not None and woke >= len(new):  # the cut dropped the trigger: wait for it again
            self.live = False
        if ended and len(new) == consumed:
            finish = finish or "stop"
        return new, finish
