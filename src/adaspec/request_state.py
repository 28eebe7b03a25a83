"""One request's progress through generation: the accept step, shared by both engines.

:class:`RequestState` holds what a request carries from step to step — its sequence, sampler, stop conditions, text,
grammar, logprobs, margins and statistics — and the three things every step does with them: pick the first token
after the prefill (:meth:`RequestState.first`), verify a chain of drafts on the target's logits
(:meth:`RequestState.verify`) and emit the accepted tokens cut at the stop conditions (:meth:`RequestState.emit`).
:class:`~adaspec.engine.SpeculativeEngine` runs one; each row of :class:`~adaspec.batch.BatchEngine` runs its own.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from adaspec.backends.base import Backend
from adaspec.constrained import RequestGrammar
from adaspec.drafters.base import Draft
from adaspec.errors import ConfigError
from adaspec.logprobs import TokenLogprob, token_logprobs, top_margins
from adaspec.processors import LogitsControls, controlled
from adaspec.request import (GenerationConfig, GenerationResult, StreamChunk, check_logit_bias, checked_prompt, cut,
                             request_eos, request_generator)
from adaspec.sampling import SamplingParams, pick_token
from adaspec.stats import GenerationStats, peak_rss_bytes
from adaspec.text import TextStream
from adaspec.verify import decide, parse_lossy


@dataclass
class RequestState:
    """A request between steps.

    Attributes:
        prompt: the prompt's token ids. ids: prompt + generated tokens (``ids[-1]`` is the target's pending token).
        cfg: its settings. params, generator, eos, lossy, controls: derived from ``cfg`` once (:meth:`open`).
        max_context: the target's context window in tokens.
        text: detokenized output and stop strings (None without a tokenizer).
        grammar: its structured-output state (None without a constraint).
        stats: counters and timings; ``start`` is the ``time.perf_counter()`` its timings count from.
        margins, logprobs, prompt_logprobs: the outputs asked for (None when not asked for).
    """

    prompt: list[int]
    cfg: GenerationConfig
    params: SamplingParams
    eos: tuple[int, ...]
    generator: torch.Generator
    max_context: int
    text: TextStream | None = None
    lossy: tuple[str, float] | None = None
    controls: LogitsControls | None = None
    grammar: RequestGrammar | None = None
    ids: list[int] = field(default_factory=list)
    stats: GenerationStats = field(default_factory=GenerationStats)
    margins: list[float] | None = None
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    start: float = 0.0

    @classmethod
    def open(cls, prompt_ids: Sequence[int], cfg: GenerationConfig, target: Backend, default_eos: tuple[int, ...],
             tokenizer=None, grammar: RequestGrammar | None = None) -> RequestState:
        """A checked new request on ``target`` (its context window and vocabulary).

        Raises:
            ContextLengthError: the prompt leaves no room for a new token in the context window.
            ConfigError: an empty prompt, a ``logit_bias`` id outside the vocabulary, stop strings without a
                tokenizer, or an invalid lossy rule.
        """
        prompt = checked_prompt(prompt_ids, target)
        check_logit_bias(cfg, target)
        if cfg.stop and tokenizer is None:
            raise ConfigError("stop strings need a tokenizer (pass tokenizer= to the engine)")
        return cls(prompt, cfg, cfg.sampling, request_eos(cfg, default_eos), request_generator(cfg),
                   target.max_context, text=TextStream(tokenizer, cfg.stop) if tokenizer is not None else None,
                   lossy=parse_lossy(cfg.lossy) if cfg.lossy is not None else None, controls=cfg.controls,
                   grammar=grammar, ids=list(prompt), stats=GenerationStats(prompt_tokens=len(prompt)),
                   margins=[] if cfg.return_margins else None,
                   logprobs=[] if cfg.logprobs is not None else None)

    @property
    def generated(self) -> int:
        """Tokens generated so far."""
        return len(self.ids) - len(self.prompt)

    def room(self) -> int:
        """Tokens this request may still emit: its ``max_new_tokens`` budget within the context window."""
        return min(self.cfg.max_new_tokens - self.generated, self.max_context - len(self.ids))

    def first(self, logits: torch.Tensor) -> tuple[list[int], str | None, list[TokenLogprob] | None]:
        """The prefill's token from the last prompt position's ``[1, V]`` logits, emitted; sets TTFT and the
        prefill time. Returns as :meth:`emit`."""
        last = controlled(logits[-1:], self.controls, self.prompt, len(self.prompt))
        token = pick_token(last[0] if self.grammar is None else self.grammar.first(last)[0], self.params,
                           self.generator)
        self.stats.ttft_ms = self.stats.prefill_ms = (time.perf_counter() - self.start) * 1e3
        return self.emit([token], last)

    def verify(self, logits: torch.Tensor, draft: Draft, fed: list[int]) -> tuple[int, int, torch.Tensor]:
        """Verify a chain ``draft`` (K tokens) on the target's ``[K + 1, V]`` logits over ``[pending] + fed`` (``fed``:
        the drafts as the target was fed them, :func:`~adaspec.verify.in_vocab`),
        after the request's controls and, under a grammar, its mask (the draft already cut to what the grammar
        allows, :meth:`RequestGrammar.cut`): ``(accepted drafts n, the next token, the controlled logits)``. The
        logits returned are the model's view for logprobs and margins (controls applied, grammar mask not)."""
        logits = controlled(logits, self.controls, self.ids, len(self.prompt), torch.tensor(fed, dtype=torch.long))
        scored = logits if self.grammar is None else self.grammar.scored(logits, fed)
        n_accepted, token = decide(scored, draft, self.params, self.generator, self.lossy)
        if self.grammar is not None:
            token = self.grammar.corrected(scored, n_accepted, len(draft), token, self.params, self.generator,
                                           self.lossy)
        return n_accepted, token, logits

    def emit(self, tokens: list[int], logits: torch.Tensor) -> tuple[list[int], str | None, list[TokenLogprob] | None]:
        """Append ``tokens`` (accepted drafts + the target's token; row i of the ``[>= len(tokens), V]`` logits
        chose token i) cut at EOS, the budget, the context window or a stop string, and under a grammar at the
        token that completes it: ``(tokens kept, finish reason or None, their logprobs or None)``."""
        ids = self.ids

        def cut_here(new: list[int]) -> tuple[list[int], str | None]:
            return cut(ids, new, self.cfg, self.eos, self.text, len(ids) - len(self.prompt), self.max_context)

        new, finish = cut_here(tokens) if self.grammar is None else self.grammar.accept(tokens, cut_here)
        if self.margins is not None:
            self.margins += top_margins(logits[:len(new)])
        lp = token_logprobs(logits[:len(new)], new, self.cfg.logprobs)
        if self.logprobs is not None:
            self.logprobs += lp
        self.ids += new
        return new, finish, lp

    def chunk(self, new: list[int], logprobs: list[TokenLogprob] | None = None) -> StreamChunk:
        """A streamed piece: ``new`` tokens and the text that became final with them."""
        return StreamChunk(new, self.text.delta() if self.text else "", logprobs=logprobs)

    def finished(self, finish: str | None, new: list[int], logprobs: list[TokenLogprob] | None = None) -> StreamChunk:
        """The last chunk (``new`` tokens, the rest of the text and the :class:`GenerationResult`); completes the
        statistics (``finish`` None counts as ``"length"``)."""
        s = self.stats
        s.new_tokens = self.generated
        s.grammar_ms = self.grammar.ms if self.grammar is not None else 0.0
        s.total_ms = (time.perf_counter() - self.start) * 1e3
        s.peak_rss_bytes = peak_rss_bytes()
        tail = self.text.delta(final=True) if self.text else ""
        result = GenerationResult(self.ids[len(self.prompt):], self.text.text if self.text else "",
                                  finish or "length", s, self.margins, self.logprobs, self.prompt_logprobs)
        return StreamChunk(new, tail, result, logprobs=logprobs)
