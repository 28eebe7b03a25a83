"""The scale-out loop's results file: one JSON line per (phase, engine configuration, load level), written as soon
as it is measured, so a killed or failed run keeps what it measured and resumes where it stopped.

Kinds: ``scaleout`` (a measured level; the fields of :func:`adaspec.bench.endpoint_load.summarise` plus ``phase``,
``engine``, ``config``, ``method``, ``k``, ``load``, ``concurrency``, ``rate``), ``fault`` (an engine that failed to
start, exited or answered with errors: the message and the log's tail; never counted as done), ``check``
(acceptance read two ways, :mod:`adaspec.engines.acceptance`), ``advice`` and ``profile``. A line cut by a kill is
skipped when reading.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path


def key(**fields) -> str:
    """A short stable key of ``fields`` (JSON, sorted keys)."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Results:
    """Append-only JSONL of the loop (see the module docstring)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def rows(self, kind: str | None = None) -> list[dict]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and (kind is None or row.get("kind") == kind):
                out.append(row)
        return out

    def done(self) -> set[str]:
        """Keys of the measured levels (faults are not done: they are measured again)."""
        return {r["key"] for r in self.rows("scaleout") if "key" in r}

    def write(self, row: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({**row, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n")
