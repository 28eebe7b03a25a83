"""Scoring completions: HumanEval by execution (:mod:`.sandbox`), GSM8K by final-number match (:mod:`.gsm8k`), the
structured workload by what its rows carry; scores cached by completion text (:func:`score_rows`)."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

from adaspec.compare import read_results
from adaspec.quality.gsm8k import is_correct, reference_answer
from adaspec.quality.sandbox import check_humaneval
from adaspec.workload_data import FILES, data_dir, read_rows

TASKS = ("humaneval", "gsm8k", "gsm8k-cot", "structured")
STRUCTURED = "structured"  # graded at generation (rows carry valid, exact), each prompt under its task's grammar
GSM8K_TASKS = ("gsm8k", "gsm8k-cot")  # scored on the same rows: zero-shot and 8-shot chain of thought


_FENCE = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.S)


def humaneval_completion(text: str, problem: dict) -> str:
    """The completion to run after the task's prompt, from a chat answer: the first fenced code block that defines
    the entry point (else the first block, else the whole answer). A block that defines the function is appended
    after the prompt (its definition replaces the prompt's docstring-only stub, and its imports come along);
    otherwise it is taken as the function's body."""
    blocks = _FENCE.findall(text) or [text]
    name = problem["entry_point"]
    code = next((b for b in blocks if re.search(rf"^\s*def\s+{re.escape(name)}\s*\(", b, re.M)), blocks[0])
    if re.search(rf"^\s*def\s+{re.escape(name)}\s*\(", code, re.M):
        return "\n    pass\n\n" + code
    return code


def task_problems(task: str) -> dict[str, dict]:
    """A task's problems by prompt id (HumanEval's task ids; GSM8K's row numbers, as ``load_workload`` gives them)."""
    rows = list(read_rows(data_dir() / FILES["gsm8k" if task in GSM8K_TASKS else task]))
    if task == "humaneval":
        return {r["task_id"]: r for r in rows}
    return {str(i): r for i, r in enumerate(rows)}


def score_rows(task: str, rows: list[dict], cache_path: Path, *, timeout_s: float = 10.0,
               progress: bool = True) -> dict[tuple[str, str], bool]:
    """Score every row's text; returns ``{(prompt_id, text hash): correct}``. Scores are appended to
    ``cache_path`` (JSONL) and reused, so a rerun executes no completion twice."""
    if task == STRUCTURED:  # graded as generated (adaspec.compare): right = schema-valid with every field exact
        return {(r["prompt_id"], text_hash(r["text"])): bool(r.get("valid")) and r.get("exact") == 1.0 for r in rows}
    problems = task_problems(task)
    cache: dict[tuple[str, str], bool] = {}
    for r in read_results(cache_path):
        if r.get("task") == task:
            cache[(r["prompt_id"], r["hash"])] = r["correct"]
    todo = {}
    for r in rows:
        key = (r["prompt_id"], text_hash(r["text"]))
        if key not in cache:
            todo[key] = r
    if todo:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        with open(cache_path, "a", encoding="utf-8") as f:
            for i, (key, r) in enumerate(todo.items()):
                problem = problems[r["prompt_id"]]
                if task == "humaneval":
                    outcome = check_humaneval(problem, humaneval_completion(r["text"], problem), timeout_s=timeout_s)
                    correct, detail = outcome["passed"], outcome["result"]
                else:
                    correct, detail = is_correct(r["text"], reference_answer(problem["answer"])), ""
                cache[key] = correct
                f.write(json.dumps({"task": task, "prompt_id": key[0], "hash": key[1], "correct": correct,
                                    "detail": detail[:200]}) + "\n")
                f.flush()
                if progress and (i + 1) % 20 == 0:
                    print(f"scored {i + 1}/{len(todo)} {task} completions", file=sys.stderr)
    return cache


def text_hash(text: str) -> str:
    """A completion's key in the score cache: 16 hex digits of its SHA-1."""
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]
