"""Evaluation prompts: HumanEval, GSM8K and Spec-Bench from ``../shared/data``, or any JSONL file.

Workload names: ``humaneval``, ``gsm8k``, ``specbench`` (all categories, first turn) and ``specbench:<category>``;
anything else is read as a JSONL path whose rows carry ``prompt``, ``text``, ``question`` or ``turns``. The data
folder is ``$ADASPEC_DATA``, else the first of ``../shared/data`` beside the current folder or beside the package's
checkout.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from adaspec.errors import AdaspecError

FILES = {"humaneval": "humaneval_dev.jsonl", "gsm8k": "gsm8k_dev.jsonl", "specbench": "spec_bench_questions.jsonl"}


@dataclass(frozen=True)
class Prompt:
    """One evaluation prompt: a stable id, its category (the workload name when it has none), and the user text."""

    id: str
    category: str
    text: str


def data_dir() -> Path:
    """The shared data folder (see module docstring). Raises AdaspecError when none exists."""
    candidates = [os.environ.get("ADASPEC_DATA")] if os.environ.get("ADASPEC_DATA") else []
    candidates += [Path.cwd().parent / "shared" / "data", Path(__file__).resolve().parents[3] / "shared" / "data"]
    for c in candidates:
        if c and Path(c).is_dir():
            return Path(c)
    raise AdaspecError("no evaluation data found: set ADASPEC_DATA to the folder holding humaneval_dev.jsonl etc.")


def _row_text(row: dict, source: str) -> str:
    if "turns" in row:
        return row["turns"][0]
    if "entry_point" in row:  # HumanEval: ask an instruct model to complete the function
        return f"Complete the following Python function. Reply with code only.\n\n```python\n{row['prompt']}```"
    for key in ("prompt", "text", "question"):
        if key in row:
            return row[key]
    raise AdaspecError(f"{source}: a row has none of the fields turns/prompt/text/question")


def load_workload(name: str, limit: int | None = None) -> list[Prompt]:
    """Prompts of a workload (see module docstring), at most ``limit`` of them (per category for Spec-Bench)."""
    base, _, category = name.partition(":")
    if base in FILES:
        path = data_dir() / FILES[base]
        label = base
    else:
        path, label = Path(name), Path(name).stem
        category = ""
        if not path.is_file():
            raise AdaspecError(f"unknown workload {name!r}: not one of {sorted(FILES)} (or specbench:<category>) "
                               "and not a JSONL file")
    prompts: list[Prompt] = []
    per_category: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            row = json.loads(line)
            cat = row.get("category", label)
            if category and cat != category:
                continue
            if limit is not None and per_category.get(cat, 0) >= limit:
                continue
            per_category[cat] = per_category.get(cat, 0) + 1
            pid = str(row.get("question_id", row.get("task_id", row.get("id", i))))
            prompts.append(Prompt(pid, cat, _row_text(row, str(path))))
    if not prompts:
        raise AdaspecError(f"workload {name!r} has no prompts")
    return prompts
