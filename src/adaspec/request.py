"""What a request is: its settings (:class:`GenerationConfig`), its output (:class:`GenerationResult`,
:class:`StreamChunk`), the checks run before it starts and its stop conditions (:func:`cut`).

Names follow Hugging Face ``generate`` and the OpenAI API. Shared by the single-request engine
(:mod:`adaspec.engine`) and the batch engine (:mod:`adaspec.batch`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from adaspec.backends.base import Backend
from adaspec.errors import ConfigError, ContextLengthError
from adaspec.logprobs import TokenLogprob
from adaspec.processors import LogitsControls
from adaspec.sampling import SamplingParams
from adaspec.stats import GenerationStats
from adaspec.structured.constraint import Constraint, constraint_of
from adaspec.text import TextStream
from adaspec.tree import check_budget
from adaspec.verify import parse_lossy

__all__ = ["GenerationConfig", "GenerationResult", "StreamChunk", "TokenLogprob", "MAX_LOGPROBS", "checked_prompt",
           "check_logit_bias", "request_eos", "request_generator", "default_eos_ids", "cut"]


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
