"""The structured workload: schema-constrained extraction and tool calls over the texts shipped in ``adaspec/data``.

Three task kinds (categories), each with a known right answer, built on the fly from the shipped data (the recipe is
in ``adaspec/data/README.md``; nothing new is shipped):

* ``extract-signature`` (HumanEval, 82 tasks): the signature of the task's function as JSON
  (``function_name``, ``parameters`` in order, ``returns``: the return annotation or ""). Truth: the function's
  own ``ast``. Most of the answer is copied from the prompt (prompt lookup's ground) or forced by the schema.
* ``extract-answer`` (GSM8K, 600 problems): ``{"reasoning": ..., "answer": <number>}``. Truth: the ``#### N``
  answer (exact match of ``answer``).
* ``tool-translate`` (Spec-Bench ``translation``, 80 sentences): a forced call of a ``translate`` tool with
  ``text`` (the German sentence, copied), ``source_language`` and ``target_language``. Truth: the sentence and the
  two languages the question names.

:func:`load_tasks` interleaves the kinds (task i of each in turn), so a short ``limit`` covers all three;
:func:`score` says whether an answer is schema-valid (:func:`schema_errors`, a validator for the JSON-schema subset
these schemas use) and which expected fields it got exactly right.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

from adaspec.errors import ConfigError
from adaspec.structured import Constraint
from adaspec.toolcalls import ToolPlan, parse_tool_calls, plan_tools
from adaspec.workload_data import FILES, data_dir, read_rows
from adaspec.workloads import load_workload

CATEGORIES = ("extract-signature", "extract-answer", "tool-translate")
SIGNATURE_SCHEMA = {"type": "object", "additionalProperties": False,
                    "required": ["function_name", "parameters", "returns"],
                    "properties": {"function_name": {"type": "string"},
                                   "parameters": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
                                   "returns": {"type": "string"}}}
ANSWER_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["reasoning", "answer"],
                 "properties": {"reasoning": {"type": "string", "maxLength": 600}, "answer": {"type": "number"}}}
TRANSLATE_TOOL = {"type": "function", "function": {
    "name": "translate", "description": "Translate a text from one language to another.",
    "parameters": {"type": "object", "additionalProperties": False,
                   "required": ["text", "source_language", "target_language"],
                   "properties": {"text": {"type": "string"}, "source_language": {"type": "string"},
                                  "target_language": {"type": "string"}}}}}
SYSTEM = "You extract information. Answer with JSON only."


@dataclass(frozen=True)
class StructuredTask:
    """One task: chat messages, what constrains the answer, and the fields a right answer has.

    Attributes:
        id, category: a stable id and one of :data:`CATEGORIES`.
        messages: OpenAI-style chat messages.
        schema: the answer's JSON schema (extraction tasks), or None.
        tools: the tool plan (tool tasks; the call is forced), or None.
        expected: ``{field: right value}`` (a tool call's argument names for tool tasks).
    """

    id: str
    category: str
    messages: tuple[dict, ...]
    schema: dict | None = None
    tools: ToolPlan | None = field(default=None, hash=False)
    expected: dict = field(default_factory=dict, hash=False)

    @property
    def constraint(self) -> Constraint:
        return Constraint.json_schema(self.schema) if self.schema is not None else self.tools.constraint()

    @property
    def template_tools(self) -> list[dict] | None:
        return self.tools.template_tools if self.tools is not None else None

    def model_input(self, chat: bool = True) -> list[dict]:
        """What to encode (as :meth:`adaspec.workloads.Prompt.model_input`): the chat messages."""
        return list(self.messages)

    def request_fields(self) -> dict:
        """The OpenAI chat request fields that constrain this task's answer (``adaspec bench --endpoint``):
        ``response_format`` with the strict JSON schema, or the tool with ``tool_choice: "required"``."""
        if self.schema is not None:
            return {"response_format": {"type": "json_schema", "json_schema": {
                "name": self.category.replace("-", "_"), "schema": self.schema, "strict": True}}}
        return {"tools": self.tools.tools, "tool_choice": "required", "parallel_tool_calls": False}


def _signature(code: str, name: str) -> dict:
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            args = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
            return {"function_name": name, "parameters": args,
                    "returns": ast.unparse(node.returns) if node.returns is not None else ""}
    raise ConfigError(f"no function {name!r} in the HumanEval prompt")


def _signature_tasks() -> list[StructuredTask]:
    out = []
    for row in read_rows(data_dir() / FILES["humaneval"]):
        text = (f"Extract the signature of the function `{row['entry_point']}` in this code as JSON with the keys "
                f"function_name, parameters (the parameter names in order) and returns (its return annotation, or "
                f"\"\" when it has none).\n\n```python\n{row['prompt']}```")
        out.append(StructuredTask(f"sig-{row['task_id']}", "extract-signature",
                                  ({"role": "system", "content": SYSTEM}, {"role": "user", "content": text}),
                                  schema=SIGNATURE_SCHEMA, expected=_signature(row["prompt"], row["entry_point"])))
    return out


def _answer_tasks() -> list[StructuredTask]:
    out = []
    for i, row in enumerate(read_rows(data_dir() / FILES["gsm8k"])):
        answer = float(row["answer"].split("####")[-1].strip().replace(",", ""))
        text = (f"{row['question']}\n\nSolve the problem. Answer as JSON with the keys reasoning (a short "
                f"explanation) and answer (the final number).")
        out.append(StructuredTask(f"gsm8k-{i}", "extract-answer",
                                  ({"role": "system", "content": SYSTEM}, {"role": "user", "content": text}),
                                  schema=ANSWER_SCHEMA, expected={"answer": answer}))
    return out


_TRANSLATE = re.compile(r"^Translate (\w+) to (\w+):\s*(.*)$", re.S)


def _tool_tasks() -> list[StructuredTask]:
    plan = plan_tools([TRANSLATE_TOOL], "required", False)
    out = []
    for p in load_workload("specbench:translation"):
        m = _TRANSLATE.match(p.text.strip())
        if m is None:
            continue
        source, target, sentence = m.groups()
        text = f"{p.text}\n\nCall the translate tool with the text to translate and the two languages."
        out.append(StructuredTask(f"tool-{p.id}", "tool-translate", ({"role": "user", "content": text},),
                                  tools=plan, expected={"text": sentence.strip(), "source_language": source,
                                                        "target_language": target}))
    return out


def load_tasks(limit: int | None = None, categories: tuple[str, ...] = CATEGORIES) -> list[StructuredTask]:
    """The structured tasks, interleaved by category, at most ``limit`` of them.

    Raises:
        ConfigError: an unknown category.
    """
    bad = [c for c in categories if c not in CATEGORIES]
    if bad:
        raise ConfigError(f"unknown structured category {bad[0]!r}; choose from {', '.join(CATEGORIES)}")
    builders = {"extract-signature": _signature_tasks, "extract-answer": _answer_tasks,
                "tool-translate": _tool_tasks}
    lists = [builders[c]() for c in categories]
    out = [t for row in zip(*lists) for t in row]  # interleaved; longer lists' tails after
    longest = max((len(x) for x in lists), default=0)
    shortest = min((len(x) for x in lists), default=0)
    for i in range(shortest, longest):
        out += [x[i] for x in lists if i < len(x)]
    return out[:limit] if limit is not None else out


def workload_tasks(limit: int | None = None) -> list[StructuredTask]:
    """The workload named ``structured`` in ``adaspec compare``: ``limit`` tasks per category (None: all)."""
    return load_tasks(None if limit is None else limit * len(CATEGORIES))


def schema_errors(value: Any, schema: dict, path: str = "$") -> list[str]:
    """Where ``value`` breaks ``schema`` (empty: valid), for the JSON-schema subset of this workload and the tests:
    ``type`` (object, array, string, integer, number, boolean, null), ``properties``, ``required``,
    ``additionalProperties: false``, ``items``, ``enum``, ``const``, ``minimum``/``maximum``, ``maxLength``,
    ``maxItems``. Other keywords are ignored."""
    errors: list[str] = []
    kind = schema.get("type")
    checks = {"object": lambda v: isinstance(v, dict), "array": lambda v: isinstance(v, list),
              "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
              "null": lambda v: v is None,
              "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)}
    if kind is not None and not checks[kind](value):
        return [f"{path}: expected {kind}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in enum")
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: expected {schema['const']!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: below minimum")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: above maximum")
    if isinstance(value, str) and "maxLength" in schema and len(value) > schema["maxLength"]:
        errors.append(f"{path}: longer than maxLength")
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{path}: more than maxItems")
        for i, item in enumerate(value):
            errors += schema_errors(item, schema.get("items", {}), f"{path}[{i}]")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        errors += [f"{path}: missing {k!r}" for k in schema.get("required", []) if k not in value]
        if schema.get("additionalProperties") is False:
            errors += [f"{path}: unexpected {k!r}" for k in value if k not in props]
        for k, v in value.items():
            if k in props:
                errors += schema_errors(v, props[k], f"{path}.{k}")
    return errors


def score(task: StructuredTask, text: str, finish_reason: str) -> dict:
    """``{"valid": bool, "exact": fraction of expected fields right, "fields": {field: bool}}`` of an answer.
    Valid: the answer finished (not cut by the token budget) and is JSON following the schema (an extraction), or
    holds a call of the tool whose arguments follow its parameters (a tool call)."""
    calls = parse_tool_calls(text)[1] if task.schema is None else []
    return score_message(task, text, [c["function"] for c in calls], finish_reason)


def score_message(task: StructuredTask, content: str | None, calls: list[dict], finish_reason: str | None) -> dict:
    """:func:`score` of an OpenAI chat answer: its ``content`` (extractions) or its tool calls (``calls``:
    ``[{"name": ..., "arguments": JSON text}]``, as a server's ``tool_calls`` give them)."""
    value: Any = None
    if task.schema is not None:
        try:
            value = json.loads(content or "")
        except json.JSONDecodeError:
            value = None
        schema = task.schema
    else:
        fn = TRANSLATE_TOOL["function"]
        if calls and calls[0].get("name") == fn["name"]:
            try:
                value = json.loads(calls[0].get("arguments") or "")
            except json.JSONDecodeError:
                value = None
        schema = fn["parameters"]
    valid = finish_reason != "length" and value is not None and not schema_errors(value, schema)
    fields = {k: isinstance(value, dict) and _same(value.get(k), v) for k, v in task.expected.items()}
    return {"valid": bool(valid), "exact": sum(fields.values()) / len(fields) if fields else 0.0, "fields": fields}


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, float):
        return isinstance(got, (int, float)) and not isinstance(got, bool) and abs(got - want) < 1e-6
    if isinstance(want, str) and isinstance(got, str):
        return got.strip() == want.strip()
    return got == want
