"""The results file of ``adaspec compare``: one JSON line per (workload, prompt, method, temperature, strict),
appended as each finishes, so a rerun skips the rows already there."""

from __future__ import annotations

import json
from pathlib import Path


def result_key(row: dict) -> tuple:
    """What identifies a row: a rerun skips the (workload, prompt, method, temperature, strict) already there."""
    return row["workload"], row["prompt_id"], row["method"], row["temperature"], bool(row.get("strict", False))


def read_results(path: Path) -> list[dict]:
    """Rows of a results file; a truncated last line (killed mid-write) is ignored."""
    if not path.exists():
        return []
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows
