"""A sweep's results file (JSONL): reading it, each record's invocation, and a point's speedups against its plain
runs. Record kinds and keys are described in :mod:`adaspec.bench.sweep`."""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Sequence

from adaspec.bench.grid import Setting
from adaspec.compare.results import read_results  # noqa: F401 (re-exported: the sweep's results are read as compare's)


def record_hash(obj) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def same_setting(row: dict, setting: Setting) -> bool:
    return all(row.get(k) == v for k, v in setting.__dict__.items())


def tag_runs(rows: list[dict]) -> list[dict]:
    """Give each record (in file order) the key of the ``meta`` record before it, i.e. the ``adaspec bench``
    invocation that measured it, unless it has a ``run`` already. Returns ``rows``."""
    run = None
    for r in rows:
        if r.get("kind") == "meta":
            run = r.get("key")
        else:
            r.setdefault("run", run)
    return rows


def apply_baseline(row: dict, plains: Sequence[dict]) -> dict:
    """Set a point's speedups from its group's plain runs *of the same invocation* (a machine's speed drifts
    between sessions: only runs minutes apart compare): the median of them, so one plain run slowed by another
    program does not skew the points measured after it. ``speedup`` is the decode speedup (TPOT ratio);
    ``speedup_e2e`` adds the cold prefill (target, and draft model) for the run's length."""
    tpot = statistics.median(p["tpot_ms"] for p in plains)
    decode = statistics.median(p["decode_ms"] for p in plains)
    row["plain_tpot_ms"] = tpot
    row["plain_tokens_per_s"] = 1e3 / tpot if tpot > 0 else 0.0
    row["plain_runs"] = len(plains)
    row["speedup"] = tpot / row["tpot_ms"] if row["tpot_ms"] > 0 else math.nan
    spec_e2e = row["ttft_ms"] + row["draft_prefill_ms"] + row["decode_ms"]
    row["speedup_e2e"] = (row["ttft_ms"] + decode) / spec_e2e if spec_e2e > 0 else math.nan
    row["tokens_per_s"] = row["new_tokens"] / (spec_e2e / 1e3) if spec_e2e > 0 else 0.0
    return row
