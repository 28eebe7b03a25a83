"""The fitted cost model applied to a sweep's records: fit one setting's micro rows, price the calibrated drafter,
and predict a measured point's speedup (what ``adaspec bench`` stores and ``adaspec map`` scores)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from adaspec.bench.costmodel import FittedCostModel
from adaspec.bench.micro import verify_samples
from adaspec.errors import ConfigError


def is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def resolve_cost(cost: str | None, model: FittedCostModel, context: float) -> float:
    """The calibrated drafter's per-token cost in ms: a number, ``ratio:C`` (C × a plain target step at this
    context), or a draft model's fitted per-token time at this context."""
    if cost is None:
        return 0.0
    if is_number(cost):
        return float(cost)
    if cost.startswith("ratio:"):
        return float(cost.split(":", 1)[1]) * model.verify_ms(1, context)
    return model.draft_ms(cost, context)


def fit_cost_model(micro_rows: list[dict], plain_rows: Sequence[dict] = ()) -> FittedCostModel:
    """Fit a :class:`FittedCostModel` to one setting's micro rows (target and draft forwards). The per-step overhead
    is the median non-forward time of the setting's plain runs (``step_other_ms``), else an ``overhead`` micro row,
    else 0."""
    target_rows = [r for r in micro_rows if r.get("role") == "target"]
    verify = verify_samples(target_rows)
    draft = [(r["model"], r["context"], r["ms"]) for r in micro_rows
             if r.get("role") == "draft" and r.get("measure") == "forward"]
    overhead = [r["step_other_ms"] for r in plain_rows if r.get("step_other_ms") is not None]
    overhead = overhead or [r["ms"] for r in target_rows if r.get("measure") == "overhead"]
    return FittedCostModel.fit(verify, draft, statistics.median(overhead) if overhead else 0.0)


def drafter_cost_key(row: dict):
    """What :meth:`FittedCostModel.draft_ms` needs for a point: ms for calibrated, None for n-gram lookup
    (``ngram``, ``ngram-tree``), else the spec."""
    if row["drafter"] == "calibrated":
        return float(row["cost_ms"] or 0.0)
    if row["drafter"] in ("ngram", "ngram-tree"):
        return None
    return row["drafter"]


def predict_point(model: FittedCostModel, row: dict) -> float:
    """Cost-model speedup for a measured point, from its measured α (per position), mean draft length, share of
    non-drafting steps and mean context; NaN for a point that verified token trees (the closed form is a chain's:
    :func:`adaspec.bench.predicted.replay_steps` prices trees step by step)."""
    if row.get("tree_steps"):
        return math.nan
    try:
        d = drafter_cost_key(row)
        if d is not None and not isinstance(d, float) and d not in model.draft:
            return math.nan
        k = row["mean_drafted"] if row["speculation_steps"] else row["k"]
        return model.speedup(row["alpha_l"], k, row["mean_context"], d, row["plain_fraction"])
    except (KeyError, ConfigError):
        return math.nan
