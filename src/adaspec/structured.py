"""Structured output: a grammar constraint and its per-request matcher state, over the llguidance engine.

A :class:`Constraint` says what the output must be: any JSON object (``json_object``), JSON following a schema
(``json_schema``, strict by default: an unsupported keyword is an error, not ignored), a regular expression
(``regex``) or a Lark grammar (``lark``). :meth:`GrammarVocab.compile` turns it into a :class:`CompiledGrammar`
against one model's vocabulary (token ids as the backend numbers them); :meth:`CompiledGrammar.start` gives a
request its own :class:`GrammarState`: the set of allowed next tokens (:meth:`GrammarState.allowed`, a ``[V]``
bool mask), :meth:`~GrammarState.advance` / :meth:`~GrammarState.rollback` over tokens, the unique continuation
the grammar forces (:meth:`~GrammarState.forced`) and whether the output may end here (``accepting``) or must
(``done``). End-of-sequence ids are allowed only where the grammar is accepting.

The grammar engine is llguidance (Microsoft; what llama.cpp uses): Earley parsing over a lexer, token masks
computed from a token trie, rollback of consumed tokens, forced ("fast-forward") tokens. Its parser limits
(:func:`parser_limits`: "fuel" per compile and per mask) bound the work of compiling a grammar and of every mask, so a
pathological schema fails with an error instead of hanging a request.

JSON output is compact (``whitespace_flexible`` off, ``", "`` and ``": "`` separators, as OpenAI's strict mode
writes): no run of whitespace can fill the token budget, and keys, separators and brackets become forced tokens.

Raises of this module: :class:`~adaspec.errors.ConfigError` naming the problem (an invalid schema, regex or
grammar; llguidance not installed; a grammar too complex for the limits).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from adaspec.errors import ConfigError

KINDS = ("json_object", "json_schema", "regex", "lark")
#: llguidance compile options of every JSON grammar (see the module docstring).
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
#: a JSON value large enough to be a mistake, in characters of its text (schemas, regexes, grammars).
MAX_SOURCE_CHARS = 200_000


def _llguidance():
    try:
        import llguidance
    except ImportError:  # pragma: no cover - the dependency is in the test/serve/structured extras
        raise ConfigError("structured output needs the llguidance package: pip install 'adaspec[structured]'") from None
    return llguidance


def parser_limits():
    """Parser limits: llguidance's defaults made explicit (fuel ~50k/ms to build a lexer, ~14k/ms per mask step),
    which bound one compile to well under a second and one mask to a few milliseconds of work."""
    llg = _llguidance()
    return llg.LLParserLimits(initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000, step_max_items=50_000,
                              max_grammar_size=500_000, verbose_errors=False)


@dataclass(frozen=True)
class Constraint:
    """What a request's output must be (see the module docstring); build it with the class methods.

    Attributes:
        kind: one of :data:`KINDS`.
        source: the schema as JSON text (``json_schema``), the regex, or the Lark grammar; "" for ``json_object``.
        strict: ``json_schema`` only: unsupported schema keywords are errors (True) or ignored (False).
        trigger: a lazy grammar (``lark`` only): the text of one special token (``"<tool_call>"``) where the grammar
            starts; before the model emits it the output is free (unmasked), from it on the grammar, which begins
            with that token, constrains the rest (llama.cpp's lazy grammars). "" = the grammar applies from the
            first token.
    """

    kind: str
    source: str = ""
    strict: bool = True
    trigger: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"constraint kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if len(self.source) > MAX_SOURCE_CHARS:
            raise ConfigError(f"the {self.kind} is {len(self.source)} characters long (at most {MAX_SOURCE_CHARS})")
        if self.kind in ("regex", "lark") and not self.source.strip():
            raise ConfigError(f"the {self.kind} is empty")
        if self.trigger and self.kind != "lark":
            raise ConfigError(f"a trigger (lazy grammar) needs a lark grammar, not {self.kind}")

    @classmethod
    def json_object(cls) -> Constraint:
        return cls("json_object")

    @classmethod
    def json_schema(cls, schema: dict | str, strict: bool = True) -> Constraint:
        """``schema``: a JSON schema as a dict or as JSON text.

        Raises:
            ConfigError: the text is not JSON, or the schema is not a JSON object.
        """
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ConfigError(f"json_schema: not valid JSON ({e})") from None
        if not isinstance(schema, dict):
            raise ConfigError(f"json_schema: a schema must be a JSON object, got {type(schema).__name__}")
        return cls("json_schema", json.dumps(schema), strict)  # key order kept: it is the output order

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        return cls("regex", pattern)

    @classmethod
    def lark(cls, grammar: str, trigger: str = "") -> Constraint:
        return cls("lark", grammar, trigger=trigger)

    def grammar(self) -> str:
        """The llguidance grammar (its JSON form) of this constraint.

        Raises:
            ConfigError: the schema is not a valid JSON object.
        """
        m = _llguidance().LLMatcher
        if self.kind == "regex":
            return m.grammar_from_regex(self.source)
        if self.kind == "lark":
            return m.grammar_from_lark(self.source)
        schema: Any = {"type": "object"} if self.kind == "json_object" else json.loads(self.source)
        options = dict(JSON_OPTIONS, lenient=not self.strict)
        try:
            return m.grammar_from_json_schema(schema, overrides=options)
        except ValueError as e:
            raise ConfigError(f"json_schema: {e}") from None


class GrammarVocab:
    """One model's vocabulary as the grammar engine sees it (token ids as the backend numbers them), with a cache
    of compiled grammars. Build it once per model: :meth:`from_tokenizer` reads a Hugging Face tokenizer (~1 s).

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
        state = GrammarState(self._matcher.deep_copy(), self.vocab_size)
        state.trigger = self.trigger
        return state


class GrammarError(RuntimeError):
    """The grammar state was driven outside its grammar (a token it does not allow): a bug, not bad input."""


class GrammarState:
    """One request's position in its grammar (an ``llguidance.LLMatcher``).

    Every method that reads the state measures its own time into :attr:`ms` (milliseconds, cumulative), the
    grammar's overhead on the request.
    """

    def __init__(self, matcher, vocab_size: int) -> None:
        self._m = matcher
        self.vocab_size = vocab_size
        self.ms = 0.0
        self.trigger: int | None = None  # a lazy grammar's trigger token (adaspec.constrained.RequestGrammar)

    # Reading ----------------------------------------------------------------------------------------------------
    def allowed(self) -> torch.Tensor:
        """``[V]`` bool: the tokens the grammar allows next (EOS ids only where it is accepting).

        Raises:
            GrammarError: the matcher is in an error state.
        """
        t = time.perf_counter()
        self._check()
        bits = np.unpackbits(np.frombuffer(self._m.compute_bitmask(), dtype=np.uint8), bitorder="little")
        mask = torch.from_numpy(bits[:self.vocab_size].astype(bool))
        if mask.shape[0] < self.vocab_size:
            mask = torch.nn.functional.pad(mask, (0, self.vocab_size - mask.shape[0]))
        self.ms += (time.perf_counter() - t) * 1e3
        if not mask.any():
            raise GrammarError("the grammar allows no token here (and no end of sequence)")
        return mask

    def masks(self, drafts: Sequence[int]) -> torch.Tensor:
        """``[len(drafts) + 1, V]`` bool: row i is :meth:`allowed` after ``drafts[:i]`` (the rows a verification
        over ``[pending] + drafts`` scores). Every draft must be allowed (:meth:`valid_prefix`); rows after the
        grammar has stopped (an end of sequence drafted) repeat the last computed one, as none is read; the state is
        left as it was."""
        rows = [self.allowed()]
        consumed = 0
        for token in drafts:
            if self._m.is_stopped():  # the output ends at this draft (an end of sequence the grammar allowed):
                break  # no row after it is ever read, so those repeat the last one
            self.advance([token])
            consumed += 1
            rows.append(rows[-1] if self._m.is_stopped() else self.allowed())
        rows += [rows[-1]] * (len(drafts) + 1 - len(rows))
        self.rollback(consumed)
        return torch.stack(rows)

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the grammar allows from here (the state is unchanged)."""
        if not tokens:
            return 0
        t = time.perf_counter()
        n = int(self._m.validate_tokens([int(x) for x in tokens]))
        self.ms += (time.perf_counter() - t) * 1e3
        return n

    def forced(self) -> list[int]:
        """The tokens the grammar forces from here (llguidance's fast-forward tokens: the canonical tokenization of
        the bytes every continuation starts with; empty where the next token is free)."""
        t = time.perf_counter()
        out = [] if self._m.is_stopped() or self._m.is_error() else list(self._m.compute_ff_tokens())
        self.ms += (time.perf_counter() - t) * 1e3
        return out

    @property
    def accepting(self) -> bool:
        """The output may end here (the grammar is satisfied)."""
        return bool(self._m.is_accepting())

    @property
    def done(self) -> bool:
        """The output must end here: the grammar allows nothing more (only EOS), or EOS was consumed."""
        return bool(self._m.is_stopped())

    # Moving -----------------------------------------------------------------------------------------------------
    def advance(self, tokens: Sequence[int]) -> None:
        """Consume ``tokens`` (each allowed where it stands).

        Raises:
            GrammarError: a token the grammar does not allow.
        """
        if not tokens:
            return
        if not self._m.consume_tokens([int(t) for t in tokens]):
            raise GrammarError(f"the grammar rejected tokens {list(tokens)}: {self._m.get_error()}")

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` consumed tokens (as the KV cache is cut back)."""
        if n > 0 and not self._m.rollback(int(n)):
            raise GrammarError(f"cannot roll the grammar back {n} tokens: {self._m.get_error()}")

    def _check(self) -> None:
        if self._m.is_error():
            raise GrammarError(f"grammar state error: {self._m.get_error()}")


def mask_logits(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``[n, V]`` logits with the tokens ``allowed`` (``[n, V']`` bool) forbids set to -inf; columns beyond
    ``V'`` are forbidden, mask columns beyond V ignored. A new tensor (float32 or the logits' dtype)."""
    width = logits.shape[-1]
    if allowed.shape[-1] < width:
        allowed = torch.nn.functional.pad(allowed, (0, width - allowed.shape[-1]))
    return logits.masked_fill(~allowed[..., :width], float("-inf"))


def constraint_of(response_format: Any = None, json_schema: Any = None, regex: str | None = None,
                  grammar: str | None = None) -> Constraint | None:
    """The one :class:`Constraint` of a request's options (:class:`~adaspec.engine.GenerationConfig` fields), or
    None when none is set.

    Raises:
        ConfigError: more than one is set, or one is malformed.
    """
    given = [name for name, v in (("response_format", response_format), ("json_schema", json_schema),
                                   ("regex", regex), ("grammar", grammar)) if v is not None]
    if len(given) > 1:
        raise ConfigError(f"set at most one of response_format, json_schema, regex, grammar (got {', '.join(given)})")
    if json_schema is not None:
        return json_schema if isinstance(json_schema, Constraint) else Constraint.json_schema(json_schema)
    if regex is not None:
        return Constraint.regex(regex)
    if grammar is not None:
        return Constraint.lark(grammar)
    if response_format is None or isinstance(response_format, Constraint):
        return response_format
    if response_format == "json_object":
        return Constraint.json_object()
    if response_format == "text":
        return None
    raise ConfigError(f"response_format must be 'text', 'json_object' or a Constraint, got {response_format!r}")
