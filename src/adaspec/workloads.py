"""Evaluation prompts: named workloads built from the data shipped in ``adaspec/data``, or any JSONL file.

Workload names (``load_workload``; ``NAME:<category>`` keeps one category of any named workload):

- ``humaneval``: complete a HumanEval function (82 tasks).
- ``gsm8k``: a GSM8K grade-school maths problem (600), the question alone (zero-shot).
- ``gsm8k-cot``: the same problems, 8-shot chain of thought: the eight exemplars of Wei et al. 2022 (arXiv
  2201.11903, the set lm-evaluation-harness's ``gsm8k_cot`` uses) as earlier chat turns (``Q: ...`` / ``A: ...
  The answer is N.``), then ``Q: <question>``. Answers come out short and end with a stated answer.
- ``specbench``: every Spec-Bench category, first turn (480); ``specbench:<category>`` one category
  (``translation``, ``summarization``, ``qa``, ``math_reasoning``, ``rag`` and MT-bench's ``writing``, ``roleplay``,
  ``reasoning``, ``math``, ``coding``, ``extraction``, ``stem``, ``humanities``).
- ``rag``, ``summarization``: aliases of ``specbench:rag`` and ``specbench:summarization`` (80 each).
- ``code-edit``: rewrite a given HumanEval function with one change; the task's edit kind (its category) cycles
  through ``rename`` (parameters, old → new names given), ``type-hints``, ``comments`` and ``fix-bug`` (one bug
  planted by :func:`plant_bug`). The answer largely repeats the given code.
- ``multi-turn``: a conversation (:attr:`Prompt.messages`): the ``humaneval`` request, the canonical function as the
  assistant's answer, then a request to revise it; the revision (its category) cycles through ``revise-example``
  (add a docstring example), ``revise-types`` (type hints), ``revise-names`` (descriptive variable names) and
  ``revise-empty`` (handle empty input).

- ``agentic``: four sessions of requests that repeat the structure of earlier answers (``agent-tools``: JSON tool
  calls over GSM8K; ``agent-code``: a coding agent's JSON tool calls over HumanEval; ``agent-sql``: SQL over one
  schema; ``agent-extract``: the same JSON fields from Spec-Bench articles), each in step order
  (:attr:`Prompt.step`; :mod:`adaspec.agentic`).

No two workloads share a category name (``adaspec compare`` summarizes per category), bar the aliases, whose
prompts are Spec-Bench's own.

Anything else is read as a JSONL path whose rows carry ``prompt``, ``text``, ``question``, ``turns`` or OpenAI-style
``messages`` (a conversation ending with the user's turn; an integer ``step`` is kept). The data
folder is ``$ADASPEC_DATA`` when set (files named as in :data:`FILES`), else the package's own ``adaspec/data``.
"""

from __future__ import annotations

import ast
import io
import json
import tokenize
from importlib import resources
from pathlib import Path

from adaspec.agentic import agentic_prompts
from adaspec.errors import AdaspecError
from adaspec.workload_data import FILES, Prompt, data_dir, read_rows  # FILES, Prompt, data_dir: also imported from here

ALIASES = {"rag": "specbench:rag", "summarization": "specbench:summarization"}
EDITS = ("rename", "type-hints", "comments", "fix-bug")
REVISIONS = {"revise-example": "add a docstring example", "revise-types": "add type hints",
             "revise-names": "rename the variables to be more descriptive", "revise-empty": "handle empty input"}
REWRITE_REPLY = "Reply with the complete rewritten function only."
COT_EXEMPLARS = "gsm8k_cot_exemplars.jsonl"


def _row_text(row: dict, source: str) -> str:
    if "turns" in row:
        return row["turns"][0]
    if "entry_point" in row:  # HumanEval: ask an instruct model to complete the function
        return f"Complete the following Python function. Reply with code only.\n\n```python\n{row['prompt']}```"
    for key in ("prompt", "text", "question"):
        if key in row:
            return row[key]
    raise AdaspecError(f"{source}: a row has none of the fields turns/prompt/text/question")


def _python(code: str) -> str:
    """``code`` in a Markdown Python block, without its leading blank lines."""
    code = code.lstrip("\n").rstrip()
    return f"```python\n{code}\n```"


_NUMBER = object()  # stands for "an integer literal, plus one"
_MUTATIONS = ({"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "=="},
              {"+": "-", "-": "+", "%": "//", "//": "%"},
              {"and": "or", "or": "and"},
              {"True": "False", "False": "True"},
              _NUMBER,
              {"sorted": "reversed", "lower": "upper", "upper": "lower", "min": "max", "max": "min", "int": "float",
               "any": "all", "all": "any", "if": "if not"},
              {"''": "' '", '""': '" "'})


def plant_bug(code: str, start: int = 0) -> str:
    """``code`` with one small bug planted after character ``start`` (deterministic): the first token found of the
    first of these changes that applies: a comparison flipped (``<`` ↔ ``<=``, ``>`` ↔ ``>=``, ``==`` ↔ ``!=``),
    ``+`` ↔ ``-`` or ``%`` ↔ ``//``, ``and`` ↔ ``or``, ``True`` ↔ ``False``, an integer literal plus one, a builtin
    swapped (``sorted`` → ``reversed``, ``lower`` ↔ ``upper``, ``min`` ↔ ``max``, ``int`` → ``float``, ``any`` ↔
    ``all``) or ``if`` → ``if not``, an empty string made a space. Comments are never touched; the result still
    parses and differs from ``code``'s syntax tree.

    Raises:
        AdaspecError: none of these applies after ``start``.
    """
    offsets = [0]
    for line in code.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))
    tokens = [(offsets[t.start[0] - 1] + t.start[1], offsets[t.end[0] - 1] + t.end[1], t)
              for t in tokenize.generate_tokens(io.StringIO(code).readline)]
    original = ast.dump(ast.parse(code))
    for change in _MUTATIONS:
        for a, b, t in tokens:
            if a < start or t.type == tokenize.COMMENT:
                continue
            if change is _NUMBER:
                if t.type != tokenize.NUMBER or not t.string.isdigit():
                    continue
                new = str(int(t.string) + 1)
            elif t.string in change:
                new = change[t.string]
            else:
                continue
            buggy = code[:a] + new + code[b:]
            try:
                if ast.dump(ast.parse(buggy)) != original:
                    return buggy
            except SyntaxError:
                continue
    raise AdaspecError("no operator or constant to change in the code")


def _entry_function(row: dict) -> ast.FunctionDef:
    tree = ast.parse(row["prompt"] + row["canonical_solution"])
    return [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == row["entry_point"]][-1]


def _code_edit(row: dict, kind: str) -> Prompt:
    """The ``code-edit`` prompt of kind ``kind`` (see :data:`EDITS`) for a HumanEval row."""
    name, code = row["entry_point"], row["prompt"] + row["canonical_solution"]
    if kind == "rename":
        a = _entry_function(row).args
        params = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x]]
        renames = ", ".join(f"`{p}` → `{p}_arg`" for p in params)
        instruction = (f"Rename the parameters of the function `{name}` below: {renames}. Update every use, in the "
                       "code and in the docstring, and change nothing else.")
    elif kind == "type-hints":
        instruction = (f"Add type hints to the function `{name}` below: every parameter, the return value and each "
                       "local variable where it is first assigned (keep the hints it already has). "
                       "Change nothing else.")
    elif kind == "comments":
        instruction = (f"Add a short comment above each statement in the body of the function `{name}` below, saying "
                       "what it does. Leave the docstring and the code as they are.")
    elif kind == "fix-bug":
        code = plant_bug(code, start=len(row["prompt"]))
        instruction = (f"The function `{name}` below has exactly one bug: a single operator, constant, name or "
                       "condition is wrong. Fix it and change nothing else.")
    else:
        raise AdaspecError(f"unknown edit kind {kind!r}: not one of {', '.join(EDITS)}")
    text = f"{instruction}\n\n{_python(code)}\n\n{REWRITE_REPLY}"
    return Prompt(f"{row['task_id']}:{kind}", kind, text)


def _multi_turn(row: dict, revision: str) -> Prompt:
    """The ``multi-turn`` prompt asking for ``revision`` (a key of :data:`REVISIONS`) for a HumanEval row."""
    last = f"Revise your answer: {REVISIONS[revision]}. Reply with the complete function."
    messages = ({"role": "user", "content": _row_text(row, FILES["humaneval"])},
                {"role": "assistant", "content": _python(row["prompt"] + row["canonical_solution"])},
                {"role": "user", "content": last})
    return Prompt(f"{row['task_id']}:{revision}", revision, last, messages)


def _gsm8k_cot() -> list[Prompt]:
    """The ``gsm8k-cot`` prompts: each GSM8K question after the eight chain-of-thought exemplars as chat turns,
    with the ids of ``gsm8k`` (the row index), so both score against the same rows."""
    exemplars = (resources.files("adaspec") / "data" / COT_EXEMPLARS).read_text(encoding="utf-8")  # the format's,
    shots: list[dict] = []  # not ADASPEC_DATA's (and readable from a zipped install)
    for ex in (json.loads(line) for line in exemplars.splitlines() if line.strip()):
        shots += [{"role": "user", "content": f"Q: {ex['question']}"},
                  {"role": "assistant", "content": f"A: {ex['answer']}"}]
    prompts = []
    for i, row in enumerate(read_rows(data_dir() / FILES["gsm8k"])):
        last = f"Q: {row['question']}"
        prompts.append(Prompt(str(i), "gsm8k-cot", last, (*shots, {"role": "user", "content": last})))
    return prompts


def _built(base: str) -> list[Prompt]:
    """The prompts of a workload built from the shipped data: ``code-edit`` or ``multi-turn`` (one per HumanEval
    task), ``gsm8k-cot`` (one per GSM8K row) or ``agentic`` (sessions, :mod:`adaspec.agentic`)."""
    if base == "gsm8k-cot":
        return _gsm8k_cot()
    if base == "agentic":

        return agentic_prompts()
    rows = read_rows(data_dir() / FILES["humaneval"])
    if base == "code-edit":
        prompts = []
        for i, row in enumerate(rows):
            try:
                prompts.append(_code_edit(row, EDITS[i % len(EDITS)]))
            except AdaspecError:  # fix-bug where no bug can be planted: add type hints instead
                prompts.append(_code_edit(row, "type-hints"))
        return prompts
    kinds = list(REVISIONS)
    return [_multi_turn(row, kinds[i % len(kinds)]) for i, row in enumerate(rows)]


BUILT = ("code-edit", "multi-turn", "gsm8k-cot", "agentic")
NAMES = (*FILES, *ALIASES, *BUILT)


def load_workload(name: str, limit: int | None = None) -> list[Prompt]:
    """Prompts of a workload (see the module docstring), at most ``limit`` per category, in file order.

    Raises:
        AdaspecError: an unknown name that is not a JSONL file (the message lists the names), a category with no
            prompts (the message lists the categories), or a missing data file.
    """
    base, _, category = ALIASES.get(name, name).partition(":")
    if base in BUILT:
        prompts = _built(base)
    elif base in FILES:
        path = data_dir() / FILES[base]
        prompts = [_prompt(row, i, base, path) for i, row in enumerate(read_rows(path))]
    else:
        path, category = Path(name), ""
        if not path.is_file():
            raise AdaspecError(f"unknown workload {name!r}: not one of {', '.join(sorted(NAMES))} "
                               "(or NAME:<category>) and not a JSONL file")
        prompts = [_prompt(row, i, path.stem, path) for i, row in enumerate(read_rows(path))]
    if category:
        found = sorted({p.category for p in prompts})
        prompts = [p for p in prompts if p.category == category]
        if not prompts:
            raise AdaspecError(f"workload {base!r} has no category {category!r}: choose one of {', '.join(found)}")
    if limit is not None:
        kept, seen = [], {}
        for p in prompts:
            seen[p.category] = seen.get(p.category, 0) + 1
            if seen[p.category] <= limit:
                kept.append(p)
        prompts = kept
    if not prompts:
        raise AdaspecError(f"workload {name!r} has no prompts")
    return prompts


def _prompt(row: dict, index: int, label: str, path: Path) -> Prompt:
    pid = str(row.get("question_id", row.get("task_id", row.get("id", index))))
    if "messages" in row:
        messages = _messages(row["messages"], f"{path}, row {index + 1}")
        return Prompt(pid, row.get("category", label), messages[-1]["content"], messages,
                      step=row.get("step") if isinstance(row.get("step"), int) else None)
    return Prompt(pid, row.get("category", label), _row_text(row, str(path)))


def _messages(messages, where: str) -> tuple[dict, ...]:
    """A JSONL row's OpenAI-style ``messages``: a non-empty list of ``{"role", "content"}`` with string values,
    ending with a user turn.

    Raises:
        AdaspecError: anything else (names the row and what is wrong).
    """
    if not isinstance(messages, list) or not messages:
        raise AdaspecError(f"{where}: 'messages' must be a non-empty list of {{\"role\", \"content\"}} objects")
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise AdaspecError(f"{where}: message {i + 1} needs a string 'role' and a string 'content', got {m!r}")
    if messages[-1]["role"] != "user":
        raise AdaspecError(f"{where}: the last message must be the user's turn, not {messages[-1]['role']!r}")
    return tuple({"role": m["role"], "content": m["content"]} for m in messages)
