"""A chat request's structured output: ``response_format`` and ``tools`` / ``tool_choice`` into engine settings.

:func:`plan_request` reads the request (400 on a malformed field, naming it); :func:`compile_request` compiles the
constraint on the encode thread (a schema, regex or tool grammar that is invalid or too complex for the grammar
engine's limits is a 400 naming the problem) before the request takes a place or joins a batch, and shares the
compiled grammar with the engine that will run it (:meth:`~adaspec.engine.SpeculativeEngine.compile` caches it).
:func:`chat_message` and :class:`StreamedChoice` shape the answer: tool calls parsed from the model's
``<tool_call>`` blocks (:mod:`adaspec.toolcalls`) with ``finish_reason: "tool_calls"``.
"""

from __future__ import annotations

from dataclasses import dataclass

from adaspec.errors import ConfigError
from adaspec.server.protocol import APIError
from adaspec.toolcalls import ToolCallStream, ToolPlan, parse_calls, parse_tool_calls, plan_tools, template_message
from adaspec.structured.constraint import Constraint
from adaspec.structured.vocab import TriggerUnavailable


@dataclass
class StructuredPlan:
    """What a chat request asks of its output: a constraint (or None) and its tools (or None)."""

    constraint: Constraint | None = None
    tools: ToolPlan | None = None

    @property
    def active(self) -> bool:
        return self.constraint is not None or self.tools is not None

    @property
    def calls_constrained(self) -> bool:
        """The constraint is the tools' grammar (a forced choice, or ``"auto"``'s lazy grammar once compiled; a
        ``response_format`` gives a JSON constraint, never a Lark one): every tool call is well formed, so calls
        stream as they are written (:class:`~adaspec.toolcalls.ToolCallStream`)."""
        return self.tools is not None and self.constraint is not None and self.constraint.kind == "lark"


def plan_request(body) -> StructuredPlan:
    """The request's :class:`StructuredPlan` (completions requests have none).

    Raises:
        APIError: 400, naming the field: a malformed tool or choice, a schema that is not an object, or both a
            JSON response format and a forced tool call.
    """
    fmt = getattr(body, "response_format", None)
    try:
        tools = plan_tools(getattr(body, "tools", None), getattr(body, "tool_choice", None),
                           getattr(body, "parallel_tool_calls", None))
    except ConfigError as e:
        raise APIError(400, str(e), param="tools") from None
    constraint = None
    if fmt is not None and fmt.type != "text":
        try:
            if fmt.type == "json_object":
                constraint = Constraint.json_object()
            else:
                spec = fmt.json_schema
                constraint = Constraint.json_schema(spec.schema_, strict=spec.strict is not False)
        except ConfigError as e:
            raise APIError(400, f"response_format: {e}", param="response_format") from None
    forced = tools.constraint() if tools is not None else None
    if forced is not None and constraint is not None:
        raise APIError(400, "response_format and a forced tool call (tool_choice 'required' or a named function) "
                            "cannot be combined", param="response_format")
    lazy = tools.lazy_constraint() if tools is not None and constraint is None else None  # "auto", see toolcalls
    return StructuredPlan(constraint or forced or lazy, tools)


def compile_request(host, handle, plan: StructuredPlan) -> None:
    """Compile ``plan``'s constraint for ``handle``'s engine (on the encode thread; cached by constraint), and
    share the vocabulary and its compiled grammars with the engine that will run it: ``handle``'s
    (``--max-batch 1``) or the batch engine (``--max-batch`` > 1, where each row keeps its own grammar state).
    ``tool_choice: "auto"``'s lazy grammar is dropped (the output stays free and is parsed afterwards) where the
    model's vocabulary has no ``<tool_call>`` special token.

    Raises:
        APIError: 400 when the constraint does not compile (the message names the problem).
    """
    if plan.constraint is None:
        return
    param = "tool_choice" if plan.calls_constrained else "response_format"
    try:
        host.compile_constraint(handle, plan.constraint)
    except TriggerUnavailable:
        plan.constraint = None
    except ConfigError as e:
        raise APIError(400, f"{param}: {e}", param=param) from None


def template_messages(messages: list[dict]) -> list[dict]:
    """Messages for the chat template (assistant tool calls with object arguments).

    Raises:
        APIError: 400 on tool-call arguments that are not JSON.
    """
    try:
        return [template_message(m) for m in messages]
    except ConfigError as e:
        raise APIError(400, str(e), param="messages") from None


def chat_message(plan: StructuredPlan, text: str, finish_reason: str) -> tuple[dict, str]:
    """The assistant message and finish reason of a finished chat choice: tool calls parsed where the request
    offered tools, as the streamed answer gives them (``finish_reason: "tool_calls"`` when it stopped after calls;
    a call the token budget cut keeps ``"length"``)."""
    if plan.tools is None or not plan.tools.parses_calls:
        return {"role": "assistant", "content": text}, finish_reason
    content, calls = parse_calls(text) if plan.calls_constrained else parse_tool_calls(text)
    if not calls:
        return {"role": "assistant", "content": text}, finish_reason
    return {"role": "assistant", "content": content, "tool_calls": calls}, (
        "tool_calls" if finish_reason == "stop" else finish_reason)


class StreamedChoice:
    """One streamed chat choice's deltas under a plan: content passes through (held back while it may open a
    call), calls as :class:`~adaspec.toolcalls.ToolCallStream` gives them: streamed as they are written where the
    grammar shapes them, else each whole when it closes."""

    def __init__(self, plan: StructuredPlan) -> None:
        self.parser = (ToolCallStream(stream_arguments=plan.calls_constrained)
                       if plan.tools is not None and plan.tools.parses_calls else None)
        self.any_calls = False

    def deltas(self, text: str) -> list[dict]:
        if self.parser is None:
            return [{"content": text}] if text else []
        out = []
        content = self.parser.feed(text)
        if content:
            out.append({"content": content})
        calls = self.parser.calls()
        if calls:
            self.any_calls = True
            out.append({"tool_calls": calls})
        return out

    def finish(self, finish_reason: str) -> tuple[list[dict], str]:
        """The last deltas and the finish reason (``"tool_calls"`` when calls were sent and it stopped)."""
        if self.parser is None:
            return [], finish_reason
        rest, calls = self.parser.finish()
        out = ([{"content": rest}] if rest else []) + ([{"tool_calls": calls}] if calls else [])
        self.any_calls = self.any_calls or bool(calls)
        return out, "tool_calls" if self.any_calls and finish_reason == "stop" else finish_reason
