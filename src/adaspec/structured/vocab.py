"""One model's vocabulary as the grammar engine sees it (:class:`GrammarVocab`) and a constraint compiled against it
(:class:`CompiledGrammar`), within the parser limits (:func:`parser_limits`)."""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from adaspec.errors import ConfigError
from adaspec.structured.constraint import Constraint, _llguidance
from adaspec.structured.state import GrammarState


def parser_limits():
    """Parser limits: llguidance's defaults made explicit; "fuel" bounds the work of building a grammar's lexer
    (``initial_lexer_fuel``) and of each mask step (``step_lexer_fuel``, ``step_max_items``)."""
    llg = _llguidance()
    return llg.LLParserLimits(initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000, step_max_items=50_000,
                              max_grammar_size=500_000, verbose_errors=False)


class GrammarVocab:
    """One model's vocabulary as the grammar engine sees it (token ids as the backend numbers them), with a cache
    of compiled grammars. Build it once per model (:meth:`from_tokenizer` reads a whole Hugging Face vocabulary).

    Args:
        tokenizer: an ``llguidance.LLTokenizer``.
        vocab_size: the backend's logits width V (>= the tokenizer's; padding ids are never allowed).
    """

    def __init__(self, tokenizer, vocab_size: int, cache_size: int = 64) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = int(vocab_size)
        self._cache: OrderedDict[Constraint, Any] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    @classmethod
    def ensure(cls, vocab: GrammarVocab | None, hf_tokenizer, vocab_size: int, eos_ids: Sequence[int],
               owner: str) -> GrammarVocab:
        """``vocab``, or one built :meth:`from_tokenizer` when it is None (an engine's first constrained request).

        Raises:
            ConfigError: no tokenizer (the message names ``owner``, the engine to pass it to), or as
                :meth:`from_tokenizer`.
        """
        if vocab is not None:
            return vocab
        if hf_tokenizer is None:
            raise ConfigError(f"structured output needs a tokenizer (pass tokenizer= to {owner})")
        return cls.from_tokenizer(hf_tokenizer, vocab_size, eos_ids)

    @classmethod
    def from_tokenizer(cls, hf_tokenizer, vocab_size: int, eos_ids: Sequence[int]) -> GrammarVocab:
        """From a fast Hugging Face tokenizer (the one :mod:`adaspec.models.tokenizers` gives a model, whose ids
        are the backend's), with ``eos_ids`` the ids that end a sequence (allowed where the grammar accepts).

        Raises:
            ConfigError: the tokenizer is not a fast (Rust) tokenizer, or it has no EOS id.
        """
        _llguidance()  # a clear error when it is missing
        from llguidance.hf import from_tokenizer

        eos = [int(t) for t in eos_ids] or ([hf_tokenizer.eos_token_id] if hf_tokenizer.eos_token_id is not None
                                            else [])
        if not eos:
            raise ConfigError("structured output needs an end-of-sequence token id (the tokenizer has none)")
        n_vocab = max(int(vocab_size), len(hf_tokenizer))
        try:
            tok = from_tokenizer(hf_tokenizer, n_vocab=n_vocab, eos_token=eos)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"structured output cannot read this tokenizer ({type(hf_tokenizer).__name__}): {e}") \
                from None
        return cls(tok, vocab_size)

    @classmethod
    def from_tokens(cls, tokens: Sequence[bytes], eos_ids: Sequence[int], encode=None,
                    special_ids: Sequence[int] = ()) -> GrammarVocab:
        """From an explicit list of token byte strings (id i = ``tokens[i]``; the EOS ids' entries are special) and
        an ``encode(bytes) -> list[int]`` (default: greedy longest match, special tokens only where the whole text
        is one), for tokenizers outside Hugging Face. ``special_ids``: more special tokens (a tool-call tag)."""
        llg = _llguidance()
        table = [bytes(t) for t in tokens]
        eos = [int(t) for t in eos_ids]
        specials = eos + [int(t) for t in special_ids]

        def greedy(data: bytes) -> list[int]:
            whole = [t for t in specials if t not in eos and table[t] == data]
            if whole:
                return whole[:1]
            out, i = [], 0
            while i < len(data):
                best = max((t for t, b in enumerate(table) if b and t not in specials and data.startswith(b, i)),
                           key=lambda t: len(table[t]), default=None)
                if best is None:
                    raise ValueError(f"cannot tokenize byte {data[i]!r}")
                out.append(best)
                i += len(table[best])
            return out

        class _Wrapped:
            eos_token_id, bos_token_id, special_token_ids = eos[0], None, specials

            def __init__(self):
                self.tokens = table

            def __call__(self, data: bytes) -> list[int]:
                return (encode or greedy)(data)

        return cls(llg.LLTokenizer(llg.TokenizerWrapper(_Wrapped()), eos_token=eos), len(table))

    def compile(self, constraint: Constraint) -> CompiledGrammar:
        """The compiled grammar of ``constraint`` (cached: the same constraint compiles once).

        Raises:
            ConfigError: the schema, regex or grammar is invalid or too complex; the message names the problem.
            TriggerUnavailable: a lazy grammar's trigger is not one special token here.
        """
        trigger = self._trigger(constraint)
        with self._lock:
            if constraint in self._cache:
                self._cache.move_to_end(constraint)
                return CompiledGrammar(self._cache[constraint], self.vocab_size, trigger)
        llg = _llguidance()
        grammar = constraint.grammar()
        if constraint.kind == "lark":
            grammar = llg.LLMatcher.grammar_from_lark(self._special_literals(constraint.source))
        matcher = llg.LLMatcher(self.tokenizer, grammar, log_level=0, limits=parser_limits())
        if matcher.is_error():
            raise ConfigError(f"invalid {constraint.kind.replace('_', ' ')}: {_first_line(matcher.get_error())}")
        with self._lock:
            self._cache[constraint] = matcher
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return CompiledGrammar(matcher, self.vocab_size, trigger)

    def _trigger(self, constraint: Constraint) -> int | None:
        """The token id of a lazy grammar's trigger (None: not lazy).

        Raises:
            TriggerUnavailable: the trigger is not one special token of this vocabulary.
        """
        if not constraint.trigger:
            return None
        ids = self.tokenizer.tokenize_str(constraint.trigger)
        if len(ids) != 1 or not self.tokenizer.is_special_token(ids[0]):
            raise TriggerUnavailable(f"the trigger {constraint.trigger!r} is not one special token of this "
                                     "model's vocabulary")
        return int(ids[0])

    def _special_literals(self, lark: str) -> str:
        """``lark`` with each quoted literal that this tokenizer reads as one special token (``"<tool_call>"`` in
        Qwen2.5's vocabulary) written as that token (``<[id]>``): the model emits such a text as its special token,
        which llguidance otherwise never matches against the literal's bytes."""
        def sub(m: re.Match) -> str:
            ids = self.tokenizer.tokenize_str(m.group(1))
            return f"<[{ids[0]}]>" if len(ids) == 1 and self.tokenizer.is_special_token(ids[0]) else m.group(0)

        return re.sub(r'"(<[^"\\\s]+>)"', sub, lark)


def _first_line(error: str) -> str:
    lines = [x.strip() for x in error.strip().splitlines() if x.strip()]
    return " ".join(lines[:3]) if lines else "unknown error"


class TriggerUnavailable(ConfigError):
    """A lazy grammar's trigger is not one special token of the model's vocabulary (the grammar cannot tell the
    trigger from free text there)."""


class CompiledGrammar:
    """A constraint compiled against one vocabulary; :meth:`start` gives each request its own state.

    Attributes:
        trigger: a lazy grammar's trigger token id (:attr:`Constraint.trigger`), else None.
    """

    def __init__(self, matcher, vocab_size: int, trigger: int | None = None) -> None:
        self._matcher = matcher
        self.vocab_size = vocab_size
        self.trigger = trigger

    def start(self) -> GrammarState:
        return GrammarState(self._matcher.deep_copy(), self.vocab_size, self.trigger)
