"""Tool calls (OpenAI ``tools`` / ``tool_choice``) in the model's own format: Qwen2.5's (Hermes-style) ``<tool_call>``.

The chat template renders the tools into the system prompt and the model answers a call as::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

(several calls one after another, separated by a newline). :class:`ToolPlan` turns a request's ``tools`` and
``tool_choice`` into what the engine runs:

* ``"none"``: the tools are not rendered and the output is text;
* ``"auto"`` (the default with tools): the model chooses; the output is parsed afterwards, and calls found in it
  become ``tool_calls`` (free text before the first call stays ``content``). Where the model's vocabulary has
  ``<tool_call>`` as one special token (Qwen2.5), a lazy grammar (:meth:`ToolPlan.lazy_constraint`) leaves the
  output free until the model emits it and constrains the call from there, as ``"required"`` does: a call the model
  opens is always well formed and its name and keys are forced drafts. Elsewhere ``"auto"`` stays unconstrained;
* ``"required"`` or a named function: the output is constrained by a grammar (:meth:`ToolPlan.constraint`, a
  Lark grammar whose call bodies are JSON schemas: ``name`` fixed to one of the allowed tools and ``arguments``
  following that tool's ``parameters``), so it is always a well-formed call; the name and the keys are forced
  tokens, drafted for free under speculation.

A response with calls has ``finish_reason: "tool_calls"`` (OpenAI's). Calls are parsed with :func:`parse_tool_calls`
and, when streaming, with :class:`ToolCallStream`, which passes text through until a call opens and sends each call
whole when it closes; where a grammar shapes the calls, it streams each call as it is written (its name once
complete, then its ``arguments`` text in pieces), and the unstreamed answer is read the same way
(:func:`parse_calls`), so both give the same calls.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from adaspec.errors import ConfigError
from adaspec.structured.constraint import JSON_OPTIONS, Constraint

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.S)
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


@dataclass
class ToolPlan:
    """A request's tools and how the output may use them (see the module docstring).

    Attributes:
        mode: ``"none"``, ``"auto"``, ``"required"`` or ``"named"``.
        tools: the OpenAI tool definitions (``{"type": "function", "function": {...}}``) offered.
        name: the function a ``"named"`` choice forces.
        parallel: several calls in one answer allowed (OpenAI ``parallel_tool_calls``, default true).
    """

    mode: str
    tools: list[dict] = field(default_factory=list)
    name: str | None = None
    parallel: bool = True

    @property
    def template_tools(self) -> list[dict] | None:
        """The tools the chat template renders (None: none)."""
        return None if self.mode == "none" else self.tools

    @property
    def parses_calls(self) -> bool:
        return self.mode != "none"

    def constraint(self) -> Constraint | None:
        """The grammar of a forced call (``"required"``, ``"named"``), None otherwise."""
        if self.mode not in ("required", "named"):
            return None
        return Constraint.lark(self._calls_grammar())

    def lazy_constraint(self) -> Constraint | None:
        """``"auto"``: the calls' grammar, lazy from ``<tool_call>`` (free text before it, the calls after it;
        :attr:`Constraint.trigger`); None for the other modes."""
        return Constraint.lark(self._calls_grammar(), trigger=OPEN) if self.mode == "auto" else None

    def _calls_grammar(self) -> str:
        """Lark: one call (or several, one per line, where parallel calls are allowed) of the chosen tools, each
        ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` with the arguments following the tool's
        parameters."""
        chosen = [t for t in self.tools if self.mode != "named" or t["function"]["name"] == self.name]
        bodies = [_call_schema(t["function"]) for t in chosen]
        schema = bodies[0] if len(bodies) == 1 else {"anyOf": bodies}
        schema = {**schema, "x-guidance": {**JSON_OPTIONS, "lenient": True}}
        repeat = ' ("\\n" call)*' if self.parallel else ""
        return (f'start: call{repeat}\ncall: "{OPEN}" "\\n" body "\\n" "{CLOSE}"\n'
                f"body: %json {json.dumps(schema)}\n")


def _call_schema(function: dict) -> dict:
    params = function.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "object", "properties": {"name": {"const": function["name"]}, "arguments": params},
            "required": ["name", "arguments"], "additionalProperties": False}


def plan_tools(tools: list[Any] | None, tool_choice: Any, parallel: bool | None) -> ToolPlan | None:
    """The :class:`ToolPlan` of a request (None without tools and without a tool choice).

    Raises:
        ConfigError: a malformed tool, an unknown choice, a named function that is not among the tools, or a
            choice other than ``"none"`` without tools; the message names the field.
    """
    if not tools:
        if tool_choice in (None, "none"):
            return None
        raise ConfigError(f"tool_choice {tool_choice!r} needs tools")
    checked = [_checked_tool(i, t) for i, t in enumerate(tools)]
    names = [t["function"]["name"] for t in checked]
    if len(set(names)) != len(names):
        raise ConfigError("tools: function names must be unique")
    parallel = True if parallel is None else bool(parallel)
    if tool_choice in (None, "auto"):
        return ToolPlan("auto", checked, parallel=parallel)
    if tool_choice in ("none", "required"):
        return ToolPlan(tool_choice, checked, parallel=parallel)
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name")
        if name not in names:
            raise ConfigError(f"tool_choice names the function {name!r}, which is not among the tools "
                              f"({', '.join(names)})")
        return ToolPlan("named", checked, name=name, parallel=parallel)
    raise ConfigError("tool_choice must be 'none', 'auto', 'required' or "
                      "{'type': 'function', 'function': {'name': ...}}")


def _checked_tool(i: int, tool: Any) -> dict:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise ConfigError(f"{where} must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}")
    fn = tool["function"]
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"{where}.function.name must be 1-64 letters, digits, '_', '.' or '-', got {name!r}")
    params = fn.get("parameters")
    if params is not None and not (isinstance(params, dict) and params.get("type", "object") == "object"):
        raise ConfigError(f"{where}.function.parameters must be a JSON schema of an object")
    return {"type": "function", "function": {k: v for k, v in fn.items()
                                             if k in ("name", "description", "parameters", "strict")}}


def template_message(message: dict) -> dict:
    """An OpenAI message as the chat template takes it: an assistant's ``tool_calls`` with their ``arguments``
    as objects (Qwen2.5's template writes them with ``tojson``), not JSON text."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    out = []
    for i, call in enumerate(calls):
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise ConfigError(f"tool_calls[{i}] must be an object with a 'function' object")
        fn = dict(call["function"])
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                fn["arguments"] = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                raise ConfigError(f"tool_calls: the arguments of {fn.get('name')!r} are not valid JSON") from None
        out.append({"type": "function", "function": fn, **({"id": call["id"]} if call.get("id") else {})})
    return {**message, "tool_calls": out}


_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([A-Za-z0-9_.\-]{1,64})"\s*,\s*"arguments"\s*:\s*(?=\{)')
"""The opening of a call as the template writes it, up to its ``arguments`` object: ``{"name": "f", "arguments": ``."""


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _call(body: str) -> dict | None:
    """A call in OpenAI's shape from the JSON between the tags (``arguments`` re-serialised), None where it is no
    call."""
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    args = value.get("arguments", value.get("parameters", {}))
    return {"id": _call_id(), "type": "function",
            "function": {"name": value["name"], "arguments": json.dumps(args, ensure_ascii=False)}}


def parse_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """``(content, tool calls)`` of a model's answer: the calls in OpenAI's shape (``arguments`` as JSON text),
    the text before the first call as content (None when empty). Text that does not hold a complete, valid call
    is all content, with no calls."""
    calls = [c for c in (_call(m.group(1)) for m in _CALL.finditer(text)) if c is not None]
    if not calls:
        return text, []
    content = text[:text.find(OPEN)].strip()
    return content or None, calls


class ToolCallStream:
    """Streamed text split into content deltas and tool-call deltas.

    :meth:`feed` returns the content that is surely not part of a call (text that could still begin
    ``<tool_call>`` is held back); :meth:`calls` the tool-call deltas since the last call of it; :meth:`finish`
    the rest. Two ways to send a call:

    * whole, as one delta, when ``</tool_call>`` closes it and its body parses (:func:`parse_tool_calls`); the text
      of an unclosed or invalid call is content (it was no call). For unconstrained output, where a call may be
      malformed.
    * ``stream_arguments``: as it is written, as OpenAI and vLLM stream calls — one delta with its index, id, type
      and name once the name is complete and the ``arguments`` object opens (the template's order,
      ``{"name": ..., "arguments": {...}}``), then the text of the object in pieces (a client concatenates them per
      index), the call ending with that object. For calls a grammar shapes (a forced tool choice, ``"auto"``'s lazy
      grammar), which are well formed; a call in another shape is still sent whole. The pieces of a call cut short
      (``max_tokens``) stay sent; the finish reason says it did not complete. :func:`parse_calls` reads a whole
      answer the same way.
    """

    def __init__(self, stream_arguments: bool = False) -> None:
        self.stream_arguments = stream_arguments
        self.buffer = ""
        self.in_calls = False
        self.count = 0
        self.spilled = ""  # the text of closed blocks that held no call
        self._args: _ArgsScan | None = None  # the arguments of the call being streamed, once announced

    def feed(self, text: str) -> str:
        self.buffer += text
        if self.in_calls:
            return ""
        at = self.buffer.find(OPEN)
        if at >= 0:
            self.in_calls = True
            out, self.buffer = self.buffer[:at], self.buffer[at:]
            return out
        keep = _partial_suffix(self.buffer, OPEN)
        out, self.buffer = self.buffer[:len(self.buffer) - keep], self.buffer[len(self.buffer) - keep:]
        return out

    def calls(self) -> list[dict]:
        """Tool-call deltas since the last call: a streamed call's opening and argument pieces (one delta per call
        index), and whole calls in other shapes when they close."""
        out: list[dict] = []
        while self.in_calls:
            if self._args is None:
                at = self.buffer.find(OPEN)
                head = (_HEAD.match(self.buffer, at + len(OPEN))
                        if self.stream_arguments and at >= 0 and not self.buffer[:at].strip() else None)
                close = self.buffer.find(CLOSE)
                if head and (close < 0 or close > head.end()):
                    self._args = _ArgsScan(head.end())
                    out.append({"index": self.count, "id": _call_id(), "type": "function",
                                "function": {"name": head.group(1), "arguments": ""}})
                    continue
                if close < 0:
                    break
                end = close + len(CLOSE)
                block, self.buffer = self.buffer[:end], self.buffer[end:]
                parsed = parse_tool_calls(block)[1]
                if not parsed:
                    self.spilled += block  # no call: its text is content (sent by finish)
                for call in parsed:
                    out.append({"index": self.count, **call})
                    self.count += 1
                continue
            piece = self._args.scan(self.buffer)
            if piece:
                _add_arguments(out, self.count, piece)
            close = self.buffer.find(CLOSE, self._args.pos)
            if not self._args.done or close < 0:
                break
            self.buffer, self._args = self.buffer[close + len(CLOSE):], None
            self.count += 1
        return out

    def finish(self) -> tuple[str, list[dict]]:
        """(content left over, calls left): text of an unclosed or invalid call is content (it was no call),
        unless the call was announced already."""
        calls = self.calls()
        rest, self.buffer = self.buffer, ""
        if self._args is not None:
            self._args, rest = None, ""
        rest, self.spilled = self.spilled + rest, ""
        return ("" if not rest.strip() else rest), calls


def parse_calls(text: str) -> tuple[str | None, list[dict]]:
    """``(content, tool calls)`` of a whole answer read as :class:`ToolCallStream` with ``stream_arguments`` reads
    it, its deltas put together per call: what a client of the streamed answer ends up with (content None when
    empty; a call cut short keeps the arguments text it got)."""
    stream = ToolCallStream(stream_arguments=True)
    content = stream.feed(text)
    deltas = stream.calls()
    rest, last = stream.finish()
    calls: dict[int, dict] = {}
    for delta in deltas + last:
        call = calls.get(delta["index"])
        if call is None:
            calls[delta["index"]] = {"id": delta.get("id") or _call_id(), "type": "function",
                                     "function": {"name": delta["function"].get("name", ""),
                                                  "arguments": delta["function"]["arguments"]}}
        else:
            call["function"]["arguments"] += delta["function"]["arguments"]
    content = (content + rest).strip() if calls else content + rest
    return content or None, [calls[i] for i in sorted(calls)]


class _ArgsScan:
    """Where a streamed call's ``arguments`` object ends: a scan of its JSON text (strings, escapes, nesting)
    from ``start``, resumed as the text grows."""

    def __init__(self, start: int) -> None:
        self.pos = start
        self.depth = 0
        self.in_string = self.escaped = self.done = False

    def scan(self, text: str) -> str:
        """The arguments text from where the last scan stopped to the end of ``text`` or of the object."""
        start = self.pos
        while self.pos < len(text) and not self.done:
            c = text[self.pos]
            self.pos += 1
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.in_string = False
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                self.done = self.depth == 0
        return text[start:self.pos]


def _add_arguments(out: list[dict], index: int, piece: str) -> None:
    """Append ``piece`` of call ``index``'s arguments to its delta in ``out`` (one delta per index), or add one."""
    for delta in out:
        if delta["index"] == index:
            delta["function"]["arguments"] += piece
            return
    out.append({"index": index, "function": {"arguments": piece}})


def _partial_suffix(text: str, token: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``token``."""
    for n in range(min(len(text), len(token) - 1), 0, -1):
        if token.startswith(text[-n:]):
            return n
    return 0
