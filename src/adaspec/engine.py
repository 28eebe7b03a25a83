"""The engine loop: draft → verify (one target forward) → accept → roll back, repeated; K = 0 is plain decoding.

Cache invariant (as in gpt-fast's ``speculative_decode``): between steps the target's KV cache holds every token of
the sequence except the last one, which is "pending". A step runs the target once over ``[pending] + drafts`` (K + 1
positions), verification keeps n accepted drafts plus one target token, and the target cache is cropped to the
sequence length before the new tokens, so the new last token is pending again. No prefix is ever re-run. The draft
model reconciles its own cache against the sequence (see :class:`~adaspec.drafters.model.ModelDrafter`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from adaspec.backends.base import Backend
from adaspec.controllers.base import Controller
from adaspec.controllers.fixed import FixedController
from adaspec.controllers.tree_choice import TreeChoice
from adaspec.constrained import RequestGrammar
from adaspec.drafters.base import Draft, Drafter, empty_draft
from adaspec.drafters.forced import ForcedDrafter, request_drafter, unwrapped, without_forced
from adaspec.drafters.multi import cached_prefixes, measure_drafters, route
from adaspec.errors import ConfigError, ContextLengthError
from adaspec.processors import LogitsControls
from adaspec.sampling import SamplingParams, logits_to_probs, sample
from adaspec.stats import GenerationStats, StepRecord, peak_rss_bytes
from adaspec.structured import Constraint, GrammarState, GrammarVocab, constraint_of
from adaspec.text import TextStream
from adaspec.tree import check_budget, path_rows, verify_tree_greedy, verify_tree_sampling, would_emit
from adaspec.verify import parse_lossy, verify_greedy, verify_lossy, verify_sampling


@dataclass
class GenerationConfig:
    """Per-request settings (names follow Hugging Face ``GenerationConfig`` / OpenAI).

    Attributes:
        max_new_tokens: upper bound on generated tokens (>= 1).
        temperature, top_k, top_p: see :class:`~adaspec.sampling.SamplingParams`; temperature 0 = greedy.
        seed: seeds the sampler (and nothing else); None draws a random seed.
        stop: stop strings; the returned text ends before the first one.
        eos_token_ids: ids that end generation (None = the engine's defaults from the tokenizer/model).
        ignore_eos: keep going past EOS (benchmarks that need a fixed number of tokens).
        strict: batch-invariant target for this request (``Backend.batch_invariant``): every decoding forward uses
            the same kernels whatever K is, so greedy speculative output is token-for-token plain (strict) greedy
            output and a repeated request gives the same text whatever the controller's state. None = leave the
            backend as it is configured. Costs a wider forward per plain step (``adaspec eval`` measures it).
        lossy: a LOSSY acceptance rule of :data:`~adaspec.verify.LOSSY_RULES` (``"typical"``, ``"topk:3"``,
            ``"bild:2"``): faster, but the output is no longer the target's; never a default. None = exact
            verification (lossless).
        return_margins: record, per generated token, the target's top-1 minus top-2 logit at the position it was
            chosen (:attr:`GenerationResult.margins`): where two runs diverge, a tiny margin means numerics.
        repetition_penalty, presence_penalty, frequency_penalty, logit_bias: sequence-dependent logits controls
            (:class:`~adaspec.processors.LogitsControls`: Hugging Face / OpenAI semantics), applied at every
            verified position with that position's history, so speculation stays lossless with them.
        min_p: min-p sampling (:class:`~adaspec.sampling.SamplingParams`).
        logprobs: return each generated token's log-probability and this many top alternatives (0: the chosen
            token's only; at most 20) in :attr:`GenerationResult.logprobs`: log-softmax of the target's logits after
            the controls above, before temperature and top-k/top-p/min-p (vLLM's "processed logits" minus the
            sampling filters). None = off.
        prompt_logprobs: the same for every prompt token after the first (the model's own distribution, no
            controls; OpenAI ``echo`` + ``logprobs``) in :attr:`GenerationResult.prompt_logprobs`. None = off.
        prompt_logprobs_chunk: with ``prompt_logprobs``, the prefill runs in forwards of at most this many
            positions, each scored before the next, so at most ``[chunk, V]`` float32 logits are held at once
            (None: :func:`score_rows`, 256 MiB of logits).
        tree_budget: draft token trees of at most this many nodes per step (:mod:`adaspec.tree`; the controller's K is
            the depth) where the drafter branches (``ngram-tree``; a draft model: a tree grown level by level as EAGLE-2
            does, or its chain plus sibling leaves, :meth:`~adaspec.drafters.model.ModelDrafter.propose_tree`), the
            target can verify trees and the request is exact (no lossy rule), not strict and without logits controls;
            greedy or sampled (the multi-candidate rule of :func:`~adaspec.tree.verify_tree_sampling`); chains
            otherwise, with the reason in :attr:`GenerationStats.tree_fallback`. 0 (default) = chains.
        tree_choice: with a tree budget, ``"goodput"`` (default) chooses chain or tree before each step from the
            measured tokens per ms of trees against the chains they contain on the same steps, and the tree's width
            (at most ``tree_budget`` nodes) from the acceptance by rank and the measured cost of a node
            (:class:`~adaspec.controllers.tree_choice.TreeChoice`), so a tree that does not pay on this machine
            and workload gives way to the chain; ``"always"`` verifies a full-width tree every
            speculative step. The goodput choice follows measured times, so a seeded sampled request repeats its
            output exactly only with ``"always"`` (greedy output is the target's either way).
        tree_expand: draft-model trees grow level by level, this many nodes expanded per level by one draft forward
            (EAGLE-2) where the draft backend can grow trees; 0 = one-level trees (the draft's chain plus sibling
            leaves); None (default) = the drafter's own setting (:class:`~adaspec.drafters.model.ModelDrafter`
            ``tree_expand``, 4). Prompt lookup ignores it.
        response_format, json_schema, regex, grammar: structured output (:mod:`adaspec.structured`), at most one:
            ``response_format="json_object"`` (any JSON object) or a :class:`~adaspec.structured.Constraint`;
            ``json_schema`` a JSON schema (dict or JSON text; strict); ``regex`` a regular expression; ``grammar`` a
            Lark grammar. Every emitted token is allowed by the grammar, under speculation too, losslessly
            (:mod:`adaspec.constrained`); EOS only where the grammar is satisfied, and the request ends with
            ``"stop"`` once the grammar allows nothing more. ``max_new_tokens`` reached inside an unfinished value
            ends it with ``"length"``: the text is then a prefix of a valid output, not a valid one. Chains only.
        forced_drafts: under a grammar, propose the tokens it forces as drafts before the engine's drafter
            (:class:`~adaspec.drafters.forced.ForcedDrafter`; free, certain where the grammar allows one token).
        cache_partition: the partition of a cross-request drafter cache this request reads and writes
            (:class:`~adaspec.drafters.suffix_cache.SuffixCache`; ``adaspec serve`` sets one per API key): it never
            drafts from another partition's text. None: the drafter's own partition.
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: Sequence[str] = ()
    eos_token_ids: Sequence[int] | None = None
    ignore_eos: bool = False
    strict: bool | None = None
    lossy: str | None = None
    return_margins: bool = False
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] | None = None
    min_p: float = 0.0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    prompt_logprobs_chunk: int | None = None
    tree_budget: int = 0
    tree_choice: str = "goodput"
    tree_expand: int | None = None
    response_format: str | Constraint | None = None
    json_schema: Mapping | str | None = None
    regex: str | None = None
    grammar: str | None = None
    forced_drafts: bool = True
    cache_partition: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):  # OpenAI and HF accept one stop string as a plain str
            self.stop = (self.stop,)
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        self.sampling  # validates temperature/top_k/top_p/min_p
        self.controls  # validates the penalties and logit_bias
        self.constraint  # validates the structured-output options (compiled by the engine)
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_LOGPROBS:
                raise ConfigError(f"{name} must be in [0, {MAX_LOGPROBS}] (top alternatives per token), got {value}")
        if self.prompt_logprobs_chunk is not None and self.prompt_logprobs_chunk < 1:
            raise ConfigError(f"prompt_logprobs_chunk must be >= 1, got {self.prompt_logprobs_chunk}")
        check_budget(self.tree_budget)
        if self.tree_expand is not None and self.tree_expand < 0:
            raise ConfigError(f"tree_expand must be >= 0 (0 = one-level draft-model trees), got {self.tree_expand}")
        if self.tree_choice not in ("goodput", "always"):
            raise ConfigError(f"tree_choice must be 'goodput' or 'always', got {self.tree_choice!r}")
        if self.lossy is not None:
            try:
                parse_lossy(self.lossy)
            except ValueError as e:
                raise ConfigError(str(e)) from None

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.min_p)

    @property
    def constraint(self) -> Constraint | None:
        """The request's structured-output constraint (:mod:`adaspec.structured`), or None."""
        return constraint_of(self.response_format, self.json_schema, self.regex, self.grammar)

    @property
    def controls(self) -> LogitsControls | None:
        """The request's sequence-dependent logits controls, or None when all are off."""
        c = LogitsControls(self.repetition_penalty, self.presence_penalty, self.frequency_penalty,
                           {int(t): float(b) for t, b in (self.logit_bias or {}).items()})
        return c if c.active else None


MAX_LOGPROBS = 20


@dataclass
class TokenLogprob:
    """One token's log-probability (natural log) and the most likely alternatives at its position.

    Attributes:
        token_id: the token. logprob: its log-probability.
        top: ``[(token id, logprob)]``, most likely first (as many as asked for).
    """

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class GenerationResult:
    """The output of one request.

    Attributes:
        token_ids: generated ids (an EOS token that ended generation is included).
        text: decoded text without special tokens, cut before a stop string ("" without a tokenizer).
        finish_reason: ``"stop"`` (EOS or stop string) or ``"length"`` (max_new_tokens or the context window).
        stats: counters and timings.
        margins: with ``return_margins``, one float per token of ``token_ids``: the target's top-1 minus top-2
            logit where the token was chosen (logit units; None otherwise).
        logprobs: with ``logprobs``, one :class:`TokenLogprob` per token of ``token_ids`` (None otherwise).
        prompt_logprobs: with ``prompt_logprobs``, one per prompt token, None for the first (None otherwise).
    """

    token_ids: list[int]
    text: str
    finish_reason: str
    stats: GenerationStats
    margins: list[float] | None = None
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None


@dataclass
class StreamChunk:
    """One streamed piece: the tokens a step emitted and the text that became final. The last chunk has
    ``result`` set, or (a batched row that failed, :class:`adaspec.batch.BatchEngine`) ``error``."""

    token_ids: list[int]
    text: str
    result: GenerationResult | None = field(default=None)
    error: BaseException | None = field(default=None)
    logprobs: list[TokenLogprob] | None = field(default=None)  # for token_ids, when the request asks for them
    prompt_logprobs: list[TokenLogprob | None] | None = field(default=None)  # first chunk only, when asked for


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
        params = cfg.sampling
        prompt = checked_prompt(prompt_ids, self.target)
        check_logit_bias(cfg, self.target)
        eos, generator = request_eos(cfg, self.eos_token_ids), request_generator(cfg)
        if cfg.stop and self.tokenizer is None:
            raise ConfigError("stop strings need a tokenizer (pass tokenizer= to SpeculativeEngine)")
        text = TextStream(self.tokenizer, cfg.stop) if self.tokenizer is not None else None
        lossy = parse_lossy(cfg.lossy) if cfg.lossy is not None else None
        stats = GenerationStats(prompt_tokens=len(prompt))
        self.controller.reset()
        stop_rule = self.controller.draft_stop()
        if cfg.strict and not self.target.supports_batch_invariance:
            raise ConfigError(f"strict mode needs a batch-invariant backend; {self.target.name} "
                              f"({type(self.target).__name__}) has none")
        grammar = self.start_grammar(cfg)
        was_invariant = self.target.batch_invariant
        if cfg.strict is not None:
            self.target.batch_invariant = cfg.strict
        try:
            yield from self._stream(prompt, cfg, params, eos, generator, text, stats, stop_rule, lossy, grammar)
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

    def _stream(self, prompt: list[int], cfg: GenerationConfig, params: SamplingParams, eos: tuple[int, ...],
                generator: torch.Generator, text: TextStream | None, stats: GenerationStats, stop_rule,
                lossy: tuple[str, float] | None, state: GrammarState | None = None) -> Iterator[StreamChunk]:
        """The loop of :meth:`stream`, once the request is validated and the backend's mode is set."""
        grammar = RequestGrammar(state) if state is not None else None
        margins: list[float] | None = [] if cfg.return_margins else None
        logprobs: list[TokenLogprob] | None = [] if cfg.logprobs is not None else None
        controls = cfg.controls
        drafter = request_drafter(self.drafter, grammar, cfg.forced_drafts)
        tree_budget, stats.tree_fallback = self._tree_mode(cfg, params, lossy, controls, grammar)
        chooser = self._tree_choice() if tree_budget and cfg.tree_choice == "goodput" else None
        start = time.perf_counter()
        self.target.reset()
        logits, prompt_lp = scored_prefill(self.target, prompt, cfg)
        last = controlled(logits[-1:], controls, prompt, len(prompt))
        first = pick_token(last[0] if grammar is None else grammar.first(last)[0], params, generator)
        self.target.synchronize()
        stats.ttft_ms = stats.prefill_ms = (time.perf_counter() - start) * 1e3
        new, finish = self._accept(prompt, [first], cfg, eos, text, 0, grammar)
        if margins is not None:
            margins += top_margins(last)[:len(new)]
        lp = token_logprobs(last, new, cfg.logprobs)
        if logprobs is not None:
            logprobs += lp
        ids = prompt + new
        yield StreamChunk(new, text.delta() if text else "", logprobs=lp, prompt_logprobs=prompt_lp)
        if drafter is not None and finish is None:
            t = time.perf_counter()
            if cfg.cache_partition is not None:
                drafter.set_partition(cfg.cache_partition)
            drafter.prefill(prompt)
            drafter.set_controls(controls, len(prompt))
            stats.prefill_ms += (time.perf_counter() - t) * 1e3
            # a draft cache kept from a request before
            self.controller.set_synced(cached_prefixes(unwrapped(drafter), ids))

        while finish is None:
            step_start = time.perf_counter()
            generated = len(ids) - len(prompt)
            n_forced = 0
            room = min(cfg.max_new_tokens - generated, self.target.max_context - len(ids))
            if room <= 0:
                new, finish = [], "length"
                break
            route(unwrapped(drafter), self.controller, ids)  # per-step drafter choice (MultiDrafter only)
            k = min(self.controller.next_k(), room - 1) if drafter is not None else 0
            # a tree's nodes must fit the context (the depth k already does) and the target's tree capacity
            budget = min(tree_budget, self.target.max_context - len(ids), self.target.max_tree_nodes)
            as_tree = bool(k > 0 and budget > 1 and (chooser is None or chooser.use_tree()))
            if as_tree:
                if chooser is not None:
                    budget = chooser.width(k, budget)
                draft = drafter.propose_tree(ids, k, budget, params, generator, cfg.tree_expand)
            elif isinstance(drafter, ForcedDrafter):  # the grammar's forced tokens, then K of the wrapped drafter
                draft, n_forced = drafter.propose_free(ids, k, room - 1, params, generator, stop_rule)
            else:
                draft = drafter.propose(ids, k, params, generator, stop_rule) if k > 0 else empty_draft()
            if grammar is not None:  # drafts the grammar rejects are cut before verification
                draft = grammar.cut(draft)
            # the tree this chain step could have verified, to learn whether trees pay without running them
            what_if = (drafter.propose_tree(ids, k, budget, params, generator, cfg.tree_expand)
                       if chooser is not None and chooser.what_if and not as_tree and len(draft) and budget > 1
                       else None)
            draft_end = time.perf_counter()

            accepted, token, logits, path = self._verify(ids, draft, params, generator, lossy, controls,
                                                         len(prompt), grammar)
            n_accepted = len(accepted)
            self.target.synchronize()
            verify_end = time.perf_counter()

            new, finish = self._accept(ids, accepted + [token], cfg, eos, text, generated, grammar)
            if margins is not None:
                margins += top_margins(logits[:len(new)])
            lp = token_logprobs(logits[:len(new)], new, cfg.logprobs)
            if logprobs is not None:
                logprobs += lp
            ids += new
            step = StepRecord(k=k, drafted=len(draft), accepted=n_accepted, emitted=len(new),
                              context_len=len(ids) - len(new),
                              draft_ms=(draft_end - step_start) * 1e3, verify_ms=(verify_end - draft_end) * 1e3,
                              total_ms=(time.perf_counter() - step_start) * 1e3,
                              drafter=(draft.source or drafter.name) if len(draft) else "", tree=as_tree)
            stats.record(step)
            self.controller.update(without_forced(step, n_forced))
            if chooser is not None and k > 0:
                chooser.update(as_tree, step.emitted, step.total_ms, chain_emitted(draft, accepted, len(new)), k,
                               nodes=len(draft), path=path, verify_ms=step.verify_ms)
                if what_if is not None and len(what_if):
                    bounds = would_emit(what_if.tokens.tolist(), what_if.parents or list(range(-1, len(what_if) - 1)),
                                        accepted + [token])
                    chooser.update_what_if(n_accepted + 1, step.total_ms, len(draft), k, bounds)
            if finish is None:
                yield StreamChunk(new, text.delta() if text else "", logprobs=lp)
            else:
                break

        if self.drafter is not None and stats.steps and not self._warming:  # ended normally after the drafter's
            self.drafter.finish(ids)  # prefill (a warm-up's text is not a response: not kept)
        stats.new_tokens = len(ids) - len(prompt)
        stats.grammar_ms = grammar.ms if grammar is not None else 0.0
        stats.total_ms = (time.perf_counter() - start) * 1e3
        stats.peak_rss_bytes = peak_rss_bytes()
        tail = text.delta(final=True) if text else ""
        result = GenerationResult(ids[len(prompt):], text.text if text else "", finish or "length", stats, margins,
                                  logprobs, prompt_lp)
        yield StreamChunk(new if stats.steps else [], tail, result, logprobs=lp if stats.steps else None)

    # Pieces of a step ---------------------------------------------------------------------------------------
    def _tree_choice(self) -> TreeChoice:
        """The chain/tree chooser of requests with ``tree_choice="goodput"``: one per engine, kept across requests
        like the goodput controller's costs, since whether a tree pays is mostly the machine's and the drafter's
        matter (what a node costs, what a draft tree costs to build). A new request starts from what the last ones
        measured (on a CPU where trees lose it runs chains from its first step, probing at the backed-off gap)
        instead of paying the exploration tree steps again; the comparison keeps the last ``window`` steps, so it
        follows the text as it changes."""
        what_if = getattr(self.drafter, "free_trees", False)
        if self.tree_choice is None or self.tree_choice.what_if != what_if:
            self.tree_choice = TreeChoice(what_if=what_if)
        return self.tree_choice

    def _tree_mode(self, cfg: GenerationConfig, params: SamplingParams, lossy, controls,
                   grammar: RequestGrammar | None = None) -> tuple[int, str]:
        """``(tree budget, why chains instead)``: the request's tree budget where trees can be verified here, else
        0 and the reason (empty when the request asked for chains)."""
        if not cfg.tree_budget or self.drafter is None:
            return 0, ""
        why = ("a grammar constraint (structured output verifies chains)" if grammar is not None
               else "a lossy acceptance rule" if lossy is not None
               else "logits controls (penalties, logit_bias)" if controls is not None
               else f"{self.target.name} cannot verify trees" if not self.target.supports_trees
               else f"{self.drafter.name} proposes chains only (trees need ngram-tree or a draft model)"
               if not getattr(self.drafter, "branches", True)
               else "strict mode" if self.target.batch_invariant
               else "")
        return (0, f"chains: {why}") if why else (cfg.tree_budget, "")

    def _verify(self, ids: list[int], draft: Draft, params: SamplingParams, generator: torch.Generator,
                lossy: tuple[str, float] | None = None, controls: LogitsControls | None = None,
                prompt_len: int = 0, grammar: RequestGrammar | None = None
                ) -> tuple[list[int], int, torch.Tensor, list[int]]:
        """One target forward over ``[pending] + draft`` (a chain, or a token tree), the accept/reject decision
        and the cache rollback: ``(accepted draft tokens, next token, the target's logits along them, the accepted
        nodes' indices in the draft)``, the logits ``[accepted + 1, V]`` (a tree's path) or ``[K + 1, V]`` (a chain),
        after the request's controls (not the grammar's mask: logprobs and margins report the model's view). Under a
        grammar (a chain cut to what it allows, :meth:`RequestGrammar.cut`) every row is masked before the decision
        (:mod:`adaspec.constrained`)."""
        fed = in_vocab(draft.tokens, self.target.vocab_size)
        if draft.is_tree:
            tokens = draft.tokens.tolist()
            logits = self.target.forward_tree([ids[-1]] + fed, draft.parents)
            if params.greedy:
                path, token = verify_tree_greedy(tokens, draft.parents, logits)
            else:  # multi-candidate rejection sampling, one-hot q for a deterministic tree (prompt lookup)
                probs, q = common_width(logits_to_probs(logits, params), draft.probs, tokens)
                path, token = verify_tree_sampling(tokens, draft.parents, probs, generator, q)
            self.target.keep_tree_path(len(ids), path)
            return [tokens[i] for i in path], token, logits[path_rows(path)], path
        logits = self.target.forward([ids[-1]] + fed, len(draft) + 1)
        logits = controlled(logits, controls, ids, prompt_len, torch.tensor(fed, dtype=torch.long))
        scored = logits if grammar is None else grammar.scored(logits, fed)
        n_accepted, token = decide(scored, draft, params, generator, lossy)
        if grammar is not None:
            token = grammar.corrected(scored, n_accepted, len(draft), token, params, generator, lossy)
        self.target.truncate(len(ids) + n_accepted)
        return draft.tokens[:n_accepted].tolist(), token, logits, list(range(n_accepted))

    def _accept(self, ids: list[int], new: list[int], cfg: GenerationConfig, eos: tuple[int, ...],
                text: TextStream | None, generated: int,
                grammar: RequestGrammar | None = None) -> tuple[list[int], str | None]:
        def cut_here(tokens: list[int]) -> tuple[list[int], str | None]:
            return cut(ids, tokens, cfg, eos, text, generated, self.target.max_context)

        return cut_here(new) if grammar is None else grammar.accept(new, cut_here)

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
        calibrate = getattr(self.controller, "calibrate", None)
        if calibrate is not None:
            self.verify_curve = dict(calibrate(self.target) or {})
        if self.drafter is not None and type(self.controller).seed_draft_costs is not Controller.seed_draft_costs:
            self.controller.seed_draft_costs(measure_drafters(self.drafter))


def pick_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """The token after a ``[V]`` logits row: argmax when greedy, else a sample from the processed distribution."""
    if params.greedy:
        return int(logits.argmax())
    return int(sample(logits_to_probs(logits, params), generator))


def controlled(logits: torch.Tensor, controls: LogitsControls | None, ids: Sequence[int], prompt_len: int,
               drafts: torch.Tensor | None = None) -> torch.Tensor:
    """The target's ``[n, V]`` logits after ``ids + drafts[:i]`` (row i) with the request's controls applied
    (:meth:`LogitsControls.apply`); unchanged when there are none."""
    return logits if controls is None else controls.apply(logits, ids, prompt_len, drafts)


def token_logprobs(logits: torch.Tensor, tokens: Sequence[int], top: int | None) -> list[TokenLogprob] | None:
    """Row i of ``[n, V]`` logits scored ``tokens[i]``: its log-softmax value and the ``top`` best alternatives.
    None when ``top`` is None (logprobs not asked for)."""
    if top is None:
        return None
    out: list[TokenLogprob] = []
    for start in range(0, len(tokens), LOGPROB_ROWS):  # one [LOGPROB_ROWS, V] log-softmax copy at a time
        part = list(tokens[start:start + LOGPROB_ROWS])
        lp = logits[start:start + len(part)].float().log_softmax(-1)
        chosen = lp[torch.arange(len(part)), torch.tensor(part, dtype=torch.long)].tolist()
        items = [TokenLogprob(int(t), float(v)) for t, v in zip(part, chosen)]
        if top > 0:
            values, index = lp.topk(min(top, lp.shape[-1]), dim=-1)
            for item, vs, ix in zip(items, values.tolist(), index.tolist()):
                item.top = [(int(i), float(v)) for i, v in zip(ix, vs)]
        out += items
    return out


LOGPROB_ROWS = 64  # positions per log-softmax block in token_logprobs
SCORED_LOGITS_BYTES = 256 << 20  # default bound on the float32 logits a scored prefill holds at once


def score_rows(vocab_size: int, budget_bytes: int = SCORED_LOGITS_BYTES) -> int:
    """Positions of ``[n, vocab_size]`` float32 logits that fit ``budget_bytes`` (at least 1)."""
    return max(1, budget_bytes // (4 * max(1, vocab_size)))


def prompt_logprobs(logits: torch.Tensor, prompt: Sequence[int], top: int | None) -> list[TokenLogprob | None] | None:
    """Per prompt token, its log-probability under the model given the tokens before it (None for the first), from
    the prefill's ``[len(prompt), V]`` logits. None when ``top`` is None."""
    if top is None:
        return None
    return [None] + (token_logprobs(logits[:len(prompt) - 1], list(prompt[1:]), top) or [])


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


def chain_emitted(draft: Draft, accepted: list[int], emitted: int) -> int:
    """What the chain inside a tree draft (its main path, :func:`adaspec.tree.main_path`) would have emitted on
    this step: its common prefix with the accepted path, plus the bonus token, at most ``emitted``. For a chain
    draft: ``emitted``."""
    if not draft.is_tree:
        return emitted
    main = draft.as_chain().tokens.tolist()
    n = 0
    while n < min(len(main), len(accepted)) and main[n] == accepted[n]:
        n += 1
    return min(n + 1, emitted)


def checked_prompt(prompt_ids: Sequence[int], target: Backend) -> list[int]:
    """``prompt_ids`` as a list of int, checked against ``target``'s context window.

    Raises:
        ConfigError: the prompt is empty.
        ContextLengthError: it leaves no room for a new token in the context window.
    """
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ConfigError("the prompt is empty")
    if len(prompt) >= target.max_context:
        raise ContextLengthError(
            f"the prompt has {len(prompt)} tokens but {target.name}'s context window is "
            f"{target.max_context}; shorten the prompt to at most {target.max_context - 1} tokens")
    return prompt


def check_logit_bias(cfg: GenerationConfig, target: Backend) -> None:
    """Raises ConfigError when ``cfg.logit_bias`` names a token id outside ``target``'s vocabulary."""
    if cfg.logit_bias:
        LogitsControls(logit_bias={int(t): float(b) for t, b in cfg.logit_bias.items()}).check_vocab(target.vocab_size)


def request_eos(cfg: GenerationConfig, default: tuple[int, ...]) -> tuple[int, ...]:
    """The EOS ids a request stops at: none with ``ignore_eos``, else its own or the engine's ``default``."""
    if cfg.ignore_eos:
        return ()
    return tuple(cfg.eos_token_ids if cfg.eos_token_ids is not None else default)


def request_generator(cfg: GenerationConfig) -> torch.Generator:
    """The request's sampler: seeded with ``cfg.seed``, or a random seed when it is None."""
    return torch.Generator().manual_seed(cfg.seed if cfg.seed is not None else random.randrange(2**63))


def decide(logits: torch.Tensor, draft: Draft, params: SamplingParams, generator: torch.Generator,
           lossy: tuple[str, float] | None = None) -> tuple[int, int]:
    """Verification of ``draft`` (K tokens) against the target's ``[K + 1, V]`` logits over ``[pending] + draft``:
    ``(n_accepted, next token)`` by the greedy rule, speculative sampling (Leviathan et al. 2023), or a lossy rule."""
    tokens = draft.tokens.tolist()
    if lossy is not None:
        probs, _ = common_width(logits.float().softmax(-1) if params.greedy else logits_to_probs(logits, params), None,
                                tokens)
        return verify_lossy(draft.tokens, probs, *lossy, greedy=params.greedy, generator=generator)
    if params.greedy:
        return verify_greedy(draft.tokens, logits)
    probs, q = common_width(logits_to_probs(logits, params), draft.probs, tokens)
    return verify_sampling(draft.tokens, q, probs, generator)


def cut(ids: list[int], new: list[int], cfg: GenerationConfig, eos: tuple[int, ...], text: TextStream | None,
        generated: int, max_context: int) -> tuple[list[int], str | None]:
    """Cut ``new`` at EOS, max_new_tokens, the context window (``max_context`` tokens) or a stop string; return
    (tokens to append, finish reason or None)."""
    finish = None
    for i, t in enumerate(new):
        if t in eos:
            new, finish = new[:i + 1], "stop"
            break
    if generated + len(new) >= cfg.max_new_tokens:
        new = new[:cfg.max_new_tokens - generated]
        finish = finish or "length"
    if len(ids) + len(new) >= max_context:
        finish = finish or "length"
    if text is not None:
        keep = text.push(new)
        if keep < len(new) or text.stopped:
            new, finish = new[:keep], "stop"
    return new, finish


def top_margins(logits: torch.Tensor) -> list[float]:
    """Top-1 minus top-2 logit per row of ``[n, V]`` logits (logit units)."""
    top = logits.float().topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).tolist()


def in_vocab(tokens: torch.Tensor, vocab_size: int) -> list[int]:
    """Drafted ids as the target is fed them: a draft vocabulary wider than the target's may propose an id the target
    lacks; its target probability is 0, so it is always rejected, and the forward gets id 0 in its place (the rows
    after it are never used)."""
    return [t if t < vocab_size else 0 for t in tokens.tolist()]


def common_width(probs: torch.Tensor, draft_probs: torch.Tensor | None,
                 tokens: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Target ``[n, V_t]`` and draft ``[k, V_d]`` distributions zero-padded to one width, at least every drafted id
    + 1: vocabularies padded to other widths (Qwen2.5-0.5B's 151936 rows against 7B's 152064) then compare id by
    id, an id beyond the target's vocabulary has target probability 0 (always rejected), and neither side is
    renormalised (a cut would change q(x) and the residual)."""
    width = max(probs.shape[-1], draft_probs.shape[-1] if draft_probs is not None else 0,
                max(tokens, default=-1) + 1)

    def pad(x: torch.Tensor) -> torch.Tensor:
        return x if x.shape[-1] == width else torch.nn.functional.pad(x, (0, width - x.shape[-1]))

    return pad(probs), None if draft_probs is None else pad(draft_probs)


def default_eos_ids(tokenizer) -> tuple[int, ...]:
    """EOS ids from a Hugging Face tokenizer: ``eos_token_id`` plus the chat end-of-turn token if it has one."""
    if tokenizer is None:
        return ()
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    vocab = tokenizer.get_vocab()
    for name in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<end_of_turn>"):
        if name in vocab:
            ids.add(vocab[name])
    return tuple(sorted(ids))
