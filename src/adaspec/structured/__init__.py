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

from adaspec.structured.constraint import JSON_OPTIONS, KINDS, MAX_SOURCE_CHARS, Constraint, constraint_of
from adaspec.structured.state import GrammarError, GrammarState, mask_logits
from adaspec.structured.vocab import CompiledGrammar, GrammarVocab, TriggerUnavailable, parser_limits

__all__ = ["JSON_OPTIONS", "KINDS", "MAX_SOURCE_CHARS", "CompiledGrammar", "Constraint", "GrammarError", "GrammarState",
           "GrammarVocab", "TriggerUnavailable", "constraint_of", "mask_logits", "parser_limits"]
