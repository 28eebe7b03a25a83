"""What a request's output must be: a :class:`Constraint` (see :mod:`adaspec.structured`) and the parser of a
request's options into one (:func:`constraint_of`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from adaspec.errors import ConfigError

KINDS = ("json_object", "json_schema", "regex", "lark")
#: llguidance compile options of every JSON grammar: compact output (see :mod:`adaspec.structured`).
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
#: a JSON value large enough to be a mistake, in characters of its text (schemas, regexes, grammars).
MAX_SOURCE_CHARS = 200_000


def _llguidance():
    try:
        import llguidance
    except ImportError:  # pragma: no cover - the dependency is in the test/serve/structured extras
        raise ConfigError("structured output needs the llguidance package: pip install 'adaspec[structured]'") from None
    return llguidance


@dataclass(frozen=True)
class Constraint:
    """What a request's output must be (see :mod:`adaspec.structured`); build it with the class methods.

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
