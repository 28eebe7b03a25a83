"""What ``adaspec map`` concludes for each hardware setting of a results file: its fitted cost model scored on
the measured points, the operating points the maps are drawn at, and the boundaries the report states (minimum α
per K, best K per context bucket, the contexts where speculation pays)."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from adaspec.bench.costmodel import FittedCostModel, relative_errors
from adaspec.bench.predict import fit_cost_model, predict_point
from adaspec.bench.results import apply_baseline, tag_runs


SETTING_KEYS = ("target", "dtype", "threads", "backend", "batch")

BUCKETS = [("under 2K", 256, 2048), ("2K–8K", 2048, 8192), ("beyond 8K", 8192, 32768)]

RULES = {"alpha_pays": 0.7, "alpha_loses": 0.4, "k": {"under 2K": (4, 8), "2K–8K": (3, 5), "beyond 8K": (2, 3)},
         "size_ratio": (1 / 20, 1 / 10)}


@dataclass
class SettingAnalysis:
    """Everything the report says about one hardware setting."""

    setting: dict
    model: FittedCostModel
    points: list[dict]
    plains: list[dict]
    micro: list[dict]
    memory: dict | None
    errors: list[float] = field(default_factory=list)
    reference_alpha: float = 0.8
    reference_alpha_source: str = "a typical value"
    draft_cost: object = None  # what FittedCostModel.draft_ms takes for the maps' drafter
    draft_label: str = ""
    map_context: int = 256
    context_alpha: float = 0.8

    @property
    def label(self) -> str:
        s = self.setting
        return f"{s['target']}, {s['dtype']}, {_threads(s['threads'])}, {s['backend']}"

    @property
    def short(self) -> str:
        """``bfloat16, 2 threads`` (PyTorch) or ``llama.cpp GGUF, 2 threads`` / ``ik_llama.cpp GGUF, ...``, for titles
        and the overview."""
        from adaspec.backends.select import RUNTIME_LABELS

        s = self.setting
        kind = s["dtype"] if s["backend"] == "torch" else f"{RUNTIME_LABELS.get(s['backend'], s['backend'])} GGUF"
        return f"{kind}, {_threads(s['threads'])}"

    @property
    def slug(self) -> str:
        s = self.setting
        return f"{s['dtype']}-t{s['threads']}-{s['backend']}"

    @property
    def k_range(self) -> list[int]:
        """Draft lengths whose verify width was measured."""
        return list(range(1, max(self.model.k_max, 1) + 1))

    @property
    def median_error(self) -> float:
        return statistics.median(self.errors) if self.errors else math.nan


def _threads(n: int) -> str:
    return f"{n} thread{'s' if n != 1 else ''}"


def _setting(row: dict) -> tuple:
    return tuple(row.get(k) for k in SETTING_KEYS)


def analyse(rows: list[dict]) -> list[SettingAnalysis]:
    """Group records by setting, fit each cost model and choose the maps' operating points."""
    by: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in tag_runs(rows):
        if r.get("kind") in ("point", "plain", "micro", "memory"):
            by[_setting(r)][r["kind"]].append(r)
    out = []
    for key, kinds in by.items():
        if (dict(zip(SETTING_KEYS, key)).get("batch") or 1) > 1:
            continue  # the batch section (adaspec.bench.batchmap)
        micro = kinds["micro"]
        if not any(r.get("role") == "target" and r.get("measure") == "forward" and r["n"] == 1 for r in micro):
            continue  # no cost model without plain-step micro-measurements
        model = fit_cost_model(micro, kinds["plain"])
        groups: dict[tuple, list[dict]] = defaultdict(list)
        for p in kinds["plain"]:
            groups[p.get("group"), p.get("run")].append(p)
        for p in kinds["point"]:  # against all of its group's plain runs in the same invocation
            plains = groups.get((p.get("group"), p.get("run")))
            if plains and "decode_ms" in plains[0]:
                apply_baseline(p, plains)
        points = [p for p in kinds["point"] if not _bad(p)]
        a = SettingAnalysis(dict(zip(SETTING_KEYS, key)), model, points, kinds["plain"], micro,
                            kinds["memory"][-1] if kinds["memory"] else None)
        for p in points:
            p["predicted_speedup"] = predict_point(model, p)
        a.errors = relative_errors((p["predicted_speedup"], p["speedup"]) for p in points)
        _choose_operating_points(a)
        out.append(a)
    return sorted(out, key=lambda a: (a.setting["backend"] != "torch", a.setting["dtype"], a.setting["threads"]))


def _bad(p: dict) -> bool:
    return not p.get("tpot_ms") or p.get("speedup") is None or math.isnan(p.get("speedup", math.nan))


def _choose_operating_points(a: SettingAnalysis) -> None:
    """The drafter cost, α and context the maps are drawn at: the real draft model when one was measured (its
    fitted per-token cost, its measured greedy α), else the calibrated points' cost and dials."""
    model_drafts = sorted(a.model.draft)
    real = [p for p in a.points if p["drafter"] in a.model.draft and p["temperature"] == 0
            and p["controller"] == "fixed" and p["speculation_steps"] and not p.get("tree_steps")]
    calibrated = [p for p in a.points if p["drafter"] == "calibrated"]
    if model_drafts:
        a.draft_cost, a.draft_label = model_drafts[0], f"draft model {model_drafts[0]}"
    elif calibrated:
        cost = statistics.median(p["cost_ms"] for p in calibrated)
        a.draft_cost, a.draft_label = cost, f"a drafter costing {cost:.0f} ms/token"
    else:
        a.draft_cost, a.draft_label = None, "n-gram lookup (free drafting)"
    if real:
        acc = sum(p["accepted_tokens"] for p in real)
        trials = acc + sum(p.get("rejections", 0) for p in real)
        a.reference_alpha = (acc + 1) / (trials + 2)  # Laplace: a short run with no rejection is not α = 1
        a.reference_alpha_source = (f"the measured greedy acceptance of {real[0]['drafter']} on "
                                    f"{real[0]['workload']}")
    contexts = sorted({r["context"] for r in a.micro if r.get("measure") == "forward"})
    ak = [p for p in calibrated if p["sweep"] == "alpha-k"] or calibrated
    a.map_context = min((p["context"] for p in ak), default=contexts[0] if contexts else 256)
    ck = [p for p in calibrated if p["sweep"] == "context-k"]
    a.context_alpha = ck[0]["alpha_dial"] if ck else a.reference_alpha


def point_label(p: dict) -> str:
    if p["drafter"] == "calibrated":
        return f"calibrated α={p['alpha_dial']:g} K={p['k']}"
    name = "0.5B" if "0.5b" in p["drafter"] else p["drafter"]
    return f"{name} {p['controller']}:{p['k']}{tree_label(p)} T={p['temperature']:g}"


def tree_label(p: dict) -> str:
    """`` tree 8`` (a full-width tree of at most 8 nodes every step), `` tree goodput:8`` (the chain-or-tree
    chooser) or ``""`` (chains)."""
    if not p.get("tree"):
        return ""
    return f" tree {p['tree']}" if p.get("tree_choice") == "always" else f" tree {p.get('tree_choice')}:{p['tree']}"


def tree_rows(points: list[dict]) -> list[dict]:
    """Each tree point beside the chain point of the same drafter, controller, K, context, temperature and prompt
    (whichever sweep measured it: points shared by sweeps are measured once): ``{"chain", "tree"}`` pairs, chains
    None where no sweep measured one."""
    def key(p):
        return tuple(p.get(k) for k in ("drafter", "controller", "k", "context", "temperature", "prompt_index",
                                        "max_new_tokens", "workload", "seed"))
    trees = [p for p in points if p.get("tree")]
    chains = {key(p): p for p in points if not p.get("tree")} if trees else {}
    return [{"chain": chains.get(key(p)), "tree": p} for p in trees]


def time_split_rows(a: SettingAnalysis) -> list[tuple[str, float, float, float, float]]:
    """``(label, draft, verify, other, tokens per step)`` per representative configuration, ms per step."""
    out = []
    plains = [p for p in a.plains if p["context"] == a.map_context and p["temperature"] == 0]
    if plains:
        out.append(("plain", 0.0, statistics.median(p["step_verify_ms"] for p in plains),
                    statistics.median(p["step_other_ms"] for p in plains), 1.0))
    cal = [p for p in a.points if p["drafter"] == "calibrated" and p["context"] == a.map_context]
    if cal:
        alpha = min({p["alpha_dial"] for p in cal}, key=lambda x: abs(x - 0.8))
        for p in sorted((p for p in cal if p["alpha_dial"] == alpha), key=lambda p: p["k"]):
            out.append((f"calibrated α={alpha:g} K={p['k']}", p["step_draft_ms"], p["step_verify_ms"],
                        p["step_other_ms"], p["new_tokens"] / max(p["steps"], 1)))
    for p in a.points:
        if p["drafter"] != "calibrated" and p["context"] == a.map_context and p["temperature"] == 0:
            out.append((point_label(p), p["step_draft_ms"], p["step_verify_ms"], p["step_other_ms"],
                        p["new_tokens"] / max(p["steps"], 1)))
    return out


def findings(a: SettingAnalysis) -> dict:
    """The numbers the report states, from the cost model (checked against the measured points)."""
    m = a.model
    ctx0 = a.map_context + 16
    cal = [p for p in a.points if p["drafter"] == "calibrated" and p["context"] == a.map_context]
    cal_cost = statistics.median(p["cost_ms"] for p in cal) if cal else m.draft_ms(a.draft_cost, ctx0)
    min_alpha = {k: m.min_alpha(k, ctx0, cal_cost) for k in a.k_range}
    evidence = {}
    for k in a.k_range:
        mine = [p for p in cal if p["k"] == k]
        if mine:
            wins = [p["alpha_l"] for p in mine if p["speedup"] >= 1]
            losses = [p["alpha_l"] for p in mine if p["speedup"] < 1]
            evidence[k] = (max(losses) if losses else None, min(wins) if wins else None)
    best_k = {}
    for name, lo, hi in BUCKETS:
        mid = math.sqrt(lo * hi)
        best_k[name] = (mid, *m.best_k(a.reference_alpha, mid, a.draft_cost, a.k_range))
    k_ref, _ = m.best_k(a.reference_alpha, ctx0, a.draft_cost, a.k_range)
    break_even = {k: paying_range(m, a.reference_alpha, k, a.draft_cost) for k in sorted({1, 2, 4, max(k_ref, 1)})
                  if k <= m.k_max}
    c = m.draft_ms(a.draft_cost, ctx0) / m.plain_step_ms(ctx0)
    verify_ratio = {n: m.verify_ms(n, ctx0) / m.verify_ms(1, ctx0) for n in (2, 3, 5, 9)}
    mem = a.memory or {}
    return {"min_alpha": min_alpha, "evidence": evidence, "best_k": best_k, "break_even": break_even,
            "cost_ratio": c, "cal_cost_ms": cal_cost, "cal_cost_ratio": cal_cost / m.plain_step_ms(ctx0),
            "verify_ratio": verify_ratio, "plain_ms": m.plain_step_ms(ctx0), "memory": mem,
            "max_measured_context": max((r["context"] for r in a.micro if r.get("measure") == "forward"), default=0)}


def paying_range(model: FittedCostModel, alpha: float, k: int, drafter, lo: float = 128, hi: float = 131072):
    """``(first, last)`` context lengths (on a log grid from ``lo`` to ``hi``) between which speedup ≥ 1, or None
    when it never pays there."""
    grid = np.geomspace(lo, hi, 97)
    pays = [c for c in grid if model.speedup(alpha, k, c, drafter) >= 1.0]
    return (float(pays[0]), float(pays[-1])) if pays else None
