"""The engine loop: draft → verify (one target forward) → accept → roll back, repeated; K = 0 is plain decoding.

Cache invariant (as in gpt-fast's ``speculative_decode``): between steps the target's KV cache holds every token of
the sequence except the last one, which is "pending". A step runs the target once over ``[pending] + drafts`` (K + 1
positions), verification keeps n accepted drafts plus one target token, and the target cache is cropped to the
sequence length before the new tokens, so the new last token is pending again. No prefix is ever re-run. The draft
model reconciles its own cache against the sequence (see :class:`~adaspec.drafters.model.ModelDrafter`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import torch

from adaspec.backends.base import Backend
from adaspec.controllers.base import Controller
from adaspec.controllers.fixed import FixedController
from adaspec.controllers.tree_choice import AlwaysTrees, TreeChoice
from adaspec.constrained import RequestGrammar
from adaspec.drafters.base import Draft, Drafter, empty_draft
from adaspec.drafters.forced import ForcedDrafter, forced_first, request_drafter, unwrapped, without_forced
from adaspec.drafters.multi import cached_prefixes, catch_up_limits, measure_drafters
from adaspec.errors import ConfigError
from adaspec.logprobs import score_rows, token_logprobs
from adaspec.request import (  # noqa: F401 (re-exported: adaspec.engine is where users import the request types)
    GenerationConfig,
    GenerationResult,
    StreamChunk,
    TokenLogprob,
    check_logit_bias,
    checked_prompt,
    cut,
    default_eos_ids,
    request_eos,
    request_generator,
)
from adaspec.request_state import RequestState
from adaspec.sampling import logits_to_probs
from adaspec.stats import StepRecord
from adaspec.structured.constraint import Constraint
from adaspec.structured.state import GrammarState
from adaspec.structured.vocab import GrammarVocab
from adaspec.tree import path_rows, verify_tree_greedy, verify_tree_sampling
from adaspec.verify import common_width, in_vocab


class SpeculativeEngine:
    """Speculative decoding over one target backend, one drafter and one controller (batch size 1).

    Args:
        target: the target model's backend.
        drafter: proposes tokens (None = plain decoding only).
        controller: chooses K per step (default: fixed K = 0 without a drafter).
        tokenizer: Hugging Face tokenizer, used for text, stop strings and default EOS ids (optional).
        eos_token_ids: default EOS ids (default: the tokenizer's / model's).
    """

    def __init__(self, target: Backend, drafter: Drafter | None = None, controller: Controller | None = None,
                 tokenizer=None, eos_token_ids: Sequence[int] | None = None) -> None:
        self.target = target
        self.drafter = drafter
        self.controller = controller or FixedController(0)
        if drafter is None and not isinstance(self.controller, FixedController):
            self.controller = FixedController(0)
        if drafter is None and self.controller.next_k() != 0:
            raise ConfigError("a draft length K > 0 needs a drafter")
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(eos_token_ids) if eos_token_ids is not None else default_eos_ids(tokenizer)
        self.verify_curve: dict[int, float] = {}  # ms per forward of n tokens, measured by warmup() (goodput only)
        self.tree_choice: TreeChoice | None = None  # the chain/tree chooser, kept across requests (tree_choice())
        self.grammar_vocab: GrammarVocab | None = None  # built from the tokenizer on the first constrained request
        self._warming = False  # inside warmup(): the drafter is not told of the generation's end

    def generate(self, prompt_ids: Sequence[int], config: GenerationConfig | None = None) -> GenerationResult:
        """Generate a continuation of ``prompt_ids`` (list of int token ids); see :meth:`stream`."""
        chunks = self.stream(prompt_ids, config)
        try:
            for chunk in chunks:
                if chunk.result is not None:
                    return chunk.result
        finally:
            chunks.close()  # restores the backend's mode at once (see GenerationConfig.strict)
        raise AssertionError("stream ended without a result")

    def stream(self, prompt_ids: Sequence[int], config: GenerationConfig | None = None) -> Iterator[StreamChunk]:
        """Generate, yielding a :class:`StreamChunk` per step; the last chunk carries the result.

        Closing the iterator early stops generation (used by servers when a client disconnects).

        Raises:
            ContextLengthError: the prompt leaves no room for a new token in the target's context window.
            ConfigError: invalid settings.
        """
        cfg = config or GenerationConfig()
        req = RequestState.open(prompt_ids, cfg, self.target, self.eos_token_ids, self.tokenizer)
        if cfg.strict and not self.target.supports_batch_invariance:
            raise ConfigError(f"strict mode needs a batch-invariant backend; {self.target.name} "
                              f"({type(self.target).__name__}) has none")
        state = self.start_grammar(cfg)
        req.grammar = RequestGrammar(state) if state is not None else None
        self.controller.reset()
        was_invariant = self.target.batch_invariant
        if cfg.strict is not None:
            self.target.batch_invariant = cfg.strict
        try:
            yield from self._stream(req)
        finally:
            self.target.batch_invariant = was_invariant

    def compile(self, constraint: Constraint):
        """``constraint`` compiled against this engine's vocabulary (:class:`~adaspec.structured.CompiledGrammar`;
        cached). The vocabulary is read from the tokenizer once (``grammar_vocab``; set it to use another).

        Raises:
            ConfigError: no tokenizer, or an invalid schema/regex/grammar (the message names the problem).
        """
        self.grammar_vocab = GrammarVocab.ensure(self.grammar_vocab, self.tokenizer, self.target.vocab_size,
                                                 self.eos_token_ids, "SpeculativeEngine")
        return self.grammar_vocab.compile(constraint)

    def start_grammar(self, cfg: GenerationConfig) -> GrammarState | None:
        """A fresh grammar state for a request with a constraint (None without one). Raises as :meth:`compile`."""
        constraint = cfg.constraint
        return None if constraint is None else self.compile(constraint).start()

    def _stream(self, req: RequestState) -> Iterator[StreamChunk]:
        """The loop of :meth:`stream`, once the request is validated and the backend's mode is set."""
        cfg, stats = req.cfg, req.stats
        stop_rule = self.controller.draft_stop()
        drafter = request_drafter(self.drafter, req.grammar, cfg.forced_drafts)
        tree_budget, stats.tree_fallback = self._tree_mode(req)
        trees = (None if not tree_budget else self._tree_choice() if cfg.tree_choice == "goodput" else AlwaysTrees())
        req.start = time.perf_counter()
        self.target.reset()
        logits, req.prompt_logprobs = scored_prefill(self.target, req.prompt, cfg)
        stats.cached_tokens = self.target.reused_tokens
        new, finish, lp = req.first(logits)
        first = req.chunk(new, lp)
        first.prompt_logprobs = req.prompt_logprobs
        yield first
        if drafter is not None and finish is None:
            t = time.perf_counter()
            if cfg.cache_partition is not None:
                drafter.set_partition(cfg.cache_partition)
            drafter.prefill(req.prompt)
            drafter.set_controls(req.controls, len(req.prompt))
            stats.prefill_ms += (time.perf_counter() - t) * 1e3
            # a draft cache kept from a request before
            self.controller.set_synced(cached_prefixes(unwrapped(drafter), req.ids),
                                       catch_up_limits(unwrapped(drafter)))

        ids = req.ids
        while finish is None:
            step_start = time.perf_counter()
            room = req.room()
            if room <= 0:
                new, finish = [], "length"
                break
            forced = forced_first(drafter, self.controller, ids, room - 1)  # the grammar's, then the drafter choice
            k = min(self.controller.next_k(), room - 1) if drafter is not None else 0
            # a tree's nodes must fit the context (the depth k already does) and the target's tree capacity
            budget = min(tree_budget, self.target.max_context - len(ids), self.target.max_tree_nodes)
            width = trees.plan(k, budget) if trees is not None else 0
            draft, n_forced = self._propose(req, drafter, k, width, room, stop_rule, forced)
            # the tree this chain step could have verified, to learn whether trees pay without running them
            what_if = (drafter.propose_tree(ids, k, budget, req.params, req.generator, cfg.tree_expand)
                       if trees is not None and trees.what_if and not width and len(draft) and budget > 1 else None)
            draft_end = time.perf_counter()

            accepted, token, logits, path = self._verify(req, draft)
            n_accepted = len(accepted)
            self.target.synchronize()
            verify_end = time.perf_counter()

            new, finish, lp = req.emit(accepted + [token], logits)
            step = StepRecord(k=k, drafted=len(draft), accepted=n_accepted, emitted=len(new),
                              context_len=len(ids) - len(new),
                              draft_ms=(draft_end - step_start) * 1e3, verify_ms=(verify_end - draft_end) * 1e3,
                              total_ms=(time.perf_counter() - step_start) * 1e3,
                              drafter=(draft.source or drafter.name) if len(draft) else "", tree=bool(width))
            stats.record(step)
            self.controller.update(without_forced(step, n_forced))
            if trees is not None:
                trees.observe(step, draft, accepted, token, path, what_if)
            if finish is None:
                yield req.chunk(new, lp)

        if self.drafter is not None and stats.steps and not self._warming:  # ended normally after the drafter's
            self.drafter.finish(ids)  # prefill (a warm-up's text is not a response: not kept)
        yield req.finished(finish, new if stats.steps else [], lp if stats.steps else None)

    # Pieces of a step ---------------------------------------------------------------------------------------
    def _tree_choice(self) -> TreeChoice:
        """The chain/tree chooser of requests with ``tree_choice="goodput"``: one per engine, kept across requests
        like the goodput controller's costs, since whether a tree pays is mostly the machine's and the drafter's
        matter (what a node costs, what a draft tree costs to build). A new request starts from what the last ones
        measured (on a CPU where trees lose it runs chains from its first step, probing at the backed-off gap)
        instead of paying the exploration tree steps again; the comparison keeps the last ``window`` steps, so it
        follows the text as it changes."""
        what_if = self.drafter.free_trees
        if self.tree_choice is None or self.tree_choice.what_if != what_if:
            self.tree_choice = TreeChoice(what_if=what_if)
        return self.tree_choice

    def _tree_mode(self, req: RequestState) -> tuple[int, str]:
        """``(tree budget, why chains instead)``: the request's tree budget where trees can be verified here, else
        0 and the reason (empty when the request asked for chains)."""
        if not req.cfg.tree_budget or self.drafter is None:
            return 0, ""
        why = ("a grammar constraint (structured output verifies chains)" if req.grammar is not None
               else "a lossy acceptance rule" if req.lossy is not None
               else "logits controls (penalties, logit_bias)" if req.controls is not None
               else f"{self.target.name} cannot verify trees" if not self.target.supports_trees
               else f"{self.drafter.name} proposes chains only (trees need ngram-tree or a draft model)"
               if not self.drafter.branches
               else "strict mode" if self.target.batch_invariant
               else "")
        return (0, f"chains: {why}") if why else (req.cfg.tree_budget, "")

    def _propose(self, req: RequestState, drafter: Drafter | None, k: int, width: int, room: int,
                 stop_rule, forced: list[int]) -> tuple[Draft, int]:
        """The step's draft: a tree of ``width`` nodes and ``k`` levels, or a chain of ``k`` tokens (behind the
        grammar's ``forced`` tokens, at most ``room - 1`` in all, under a grammar), cut to what the grammar allows:
        ``(draft, forced tokens at its start)``."""
        n_forced = 0
        if width:
            draft = drafter.propose_tree(req.ids, k, width, req.params, req.generator, req.cfg.tree_expand)
        elif isinstance(drafter, ForcedDrafter):  # the grammar's forced tokens, then K of the wrapped drafter
            draft, n_forced = drafter.propose_free(req.ids, forced, k, room - 1, req.params, req.generator,
                                                   stop_rule)
        else:
            draft = drafter.propose(req.ids, k, req.params, req.generator, stop_rule) if k > 0 else empty_draft()
        if req.grammar is not None:  # drafts the grammar rejects are cut before verification
            draft = req.grammar.cut(draft)
        return draft, n_forced

    def _verify(self, req: RequestState, draft: Draft) -> tuple[list[int], int, torch.Tensor, list[int]]:
        """One target forward over ``[pending] + draft`` (a chain, or a token tree), the accept/reject decision
        and the cache rollback: ``(accepted draft tokens, next token, the target's logits along them, the accepted
        nodes' indices in the draft)``, the logits ``[accepted + 1, V]`` (a tree's path) or ``[K + 1, V]`` (a chain),
        after the request's controls (:meth:`RequestState.verify`)."""
        ids = req.ids
        if draft.is_tree:
            fed, tokens = in_vocab(draft.tokens, self.target.vocab_size), draft.tokens.tolist()
            logits = self.target.forward_tree([ids[-1]] + fed, draft.parents)
            if req.params.greedy:
                path, token = verify_tree_greedy(tokens, draft.parents, logits)
            else:  # multi-candidate rejection sampling, one-hot q for a deterministic tree (prompt lookup)
                probs, q = common_width(logits_to_probs(logits, req.params), draft.probs, tokens)
                path, token = verify_tree_sampling(tokens, draft.parents, probs, req.generator, q)
            self.target.keep_tree_path(len(ids), path)
            return [tokens[i] for i in path], token, logits[path_rows(path)], path
        fed = in_vocab(draft.tokens, self.target.vocab_size)
        logits = self.target.forward([ids[-1]] + fed, len(draft) + 1)
        n_accepted, token, logits = req.verify(logits, draft, fed)
        self.target.truncate(len(ids) + n_accepted)
        return draft.tokens[:n_accepted].tolist(), token, logits, list(range(n_accepted))

    def warmup(self, prompt_ids: Sequence[int] = tuple(range(100, 148)), steps: int = 3) -> None:
        """Run a short greedy generation so one-time allocation costs stay out of measurements; then let a controller
        with a ``calibrate(backend)`` method (goodput) measure the target's verification cost curve (a few short
        forwards at the warm-up's context; the target's cache is left as it was; kept as ``verify_curve``, ms by
        tokens per forward). The default prompt has 48 tokens, as many as a short chat prompt, so that a draft
        model's first catch-up is timed at a realistic size: the goodput controller prices later catch-ups per
        token from it (ids are taken modulo the vocabulary). A controller that prices steps (its own
        ``seed_draft_costs``: goodput) also gets each
        draft model's drafting and catch-up cost per token measured on its backend
        (:func:`~adaspec.drafters.multi.measure_drafters`): the warm-up generation times a catch-up only where the
        draft cache lacked the prompt, and a draft model whose cache already held it (another engine on the same
        drafter warmed up first) would otherwise have its catch-up priced by a guess."""
        ids = [int(t) % self.target.vocab_size for t in prompt_ids]
        self._warming = True
        try:
            self.generate(ids, GenerationConfig(max_new_tokens=steps, ignore_eos=True, seed=0))
        finally:
            self._warming = False
        curve = self.controller.calibrate(self.target)
        if curve is not None:
            self.verify_curve = dict(curve)
        if self.drafter is not None and type(self.controller).seed_draft_costs is not Controller.seed_draft_costs:
            self.controller.seed_draft_costs(measure_drafters(self.drafter))

def scored_prefill(target: Backend, prompt: Sequence[int], cfg: GenerationConfig
                   ) -> tuple[torch.Tensor, list[TokenLogprob | None] | None]:
    """Prefill ``prompt`` on ``target`` (appended to its cache): the last position's ``[1, V]`` logits and, with
    ``cfg.prompt_logprobs``, the prompt's log-probabilities (:func:`prompt_logprobs`), computed over forwards of at
    most ``cfg.prompt_logprobs_chunk`` positions so the ``[len(prompt), V]`` logits are never held at once."""
    if cfg.prompt_logprobs is None:
        return target.forward(prompt, 1), None
    rows = cfg.prompt_logprobs_chunk or score_rows(target.vocab_size)
    scored: list[TokenLogprob | None] = [None]
    for start in range(0, len(prompt), rows):
        part = list(prompt[start:start + rows])
        logits = target.forward(part, len(part))
        scored += token_logprobs(logits, list(prompt[start + 1:start + len(part) + 1]), cfg.prompt_logprobs) or []
    return logits[-1:], scored
