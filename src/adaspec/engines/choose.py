"""One speculative configuration per engine from the measured configurations (``adaspec advise`` across configs).

Input: the derivation phase's ``scaleout`` rows of one engine (every tried configuration at every concurrency,
``off`` included). For each speculative configuration and concurrency, :func:`adaspec.bench.engine_advice.advise`
pairs it with ``off`` at that concurrency and fits Leviathan et al.'s model (α from τ and K̄, the cost c of a draft
token from the measured speedup). Per method the fit of the configuration that measured fastest at that
concurrency is used (the least extrapolation). Neither engine installed here takes a draft length per batch size
(vLLM 0.32's ``SpeculativeConfig`` has no ``num_speculative_tokens_per_batch_size``; llama-server has one
``--spec-draft-n-max``), so one (method, K) must serve every concurrency: the one with the highest geometric mean
of predicted speedups over the measured concurrencies, where a K > 0 must also clear the margin at its best
concurrency. A method without acceptance counters (no τ) is scored with the measured speedups of the Ks tried.
"""

from __future__ import annotations

import math

from adaspec.bench.engine_advice import MARGIN, advise, engine_config, predicted_speedup
from adaspec.engines.config import EngineConfig
from adaspec.errors import AdaspecError


def as_endpoint_rows(rows: list[dict], label: str, off_label: str) -> list[dict]:
    """The rows of configuration ``label`` as the speculative arm and ``off_label``'s as the baseline, shaped as
    ``adaspec bench --endpoint`` writes them (what :func:`advise` reads)."""
    out = []
    for r in rows:
        if r.get("config") in (label, off_label):
            out.append({**r, "kind": "endpoint", "arm": "speculative" if r["config"] == label else "baseline"})
    return out


def fits(rows: list[dict], engine: str, max_k: int = 8) -> dict[tuple[str, int], dict]:
    """Per (method, concurrency): the advice entry of the fastest-measured configuration of that method, plus its
    ``config`` (label) and ``k_tried``."""
    off = EngineConfig(engine).label
    labels = sorted({(r["method"], r["k"], r["config"]) for r in rows if r.get("method") not in (None, "off")})
    best: dict[tuple[str, int], dict] = {}
    for method, k, label in labels:
        try:
            levels = advise(as_endpoint_rows(rows, label, off), max_k=max_k)["levels"]
        except AdaspecError:
            continue  # this configuration has no level measured cleanly with off
        for e in levels:
            key = (method, e["concurrency"])
            if key not in best or e["speedup"] > best[key]["speedup"]:
                best[key] = {**e, "config": label, "k_tried": k}
    return best


def predicted(entry: dict, k: int, tried: dict[int, float]) -> float | None:
    """Predicted speedup of K at one concurrency: the fitted model when the entry has one, else the measured
    speedup of that K when it was tried (``tried`` maps K → speedup), else None."""
    if k == 0:
        return 1.0
    if entry.get("basis") == "fitted":
        return predicted_speedup(entry["alpha"], entry["cost"], k)
    return tried.get(k)


def choose(rows: list[dict], engine: str, max_k: int = 8) -> dict:
    """The advised configuration for ``engine`` (see the module docstring). Returns ``config`` (an
    :class:`EngineConfig`), ``label``, ``score`` (geometric mean predicted speedup), ``per_level`` (concurrency →
    predicted speedup of the advice), ``fits`` (the entries used), ``best_tried`` (concurrency → the fastest
    measured label and its speedup) and ``flags`` (the engine's command line from
    :func:`adaspec.bench.engine_advice.engine_config`).

    Raises:
        AdaspecError: no speculative configuration was measured cleanly against ``off``.
    """
    f = fits(rows, engine, max_k)
    if not f:
        raise AdaspecError(f"{engine}: no speculative configuration was measured without failures against off")
    levels = sorted({c for _, c in f})
    tried: dict[tuple[str, int], dict[int, float]] = {}  # measured speedups of every tried K (methods without a fit)
    for method, k, label in sorted({(r["method"], r["k"], r["config"]) for r in rows if r.get("method") not in (None, "off")}):
        for e in _level_speedups(rows, engine, label):
            tried.setdefault((method, e["concurrency"]), {})[k] = e["speedup"]
    candidates = [("off", 0)] + [(m, k) for m in sorted({m for m, _ in f}) for k in range(1, max_k + 1)]
    scored = []
    for method, k in candidates:
        preds = {}
        for c in levels:
            entry = f.get((method, c), {}) if method != "off" else {}
            p = predicted(entry, k, tried.get((method, c), {})) if (entry or method == "off") else None
            if p is None:
                break
            preds[c] = p
        else:
            if k > 0 and max(preds.values()) < MARGIN:
                continue
            score = math.exp(sum(math.log(max(p, 1e-9)) for p in preds.values()) / len(preds))
            scored.append((score, method, k, preds))
    score, method, k, preds = max(scored, key=lambda s: (s[0], -s[2]))
    cfg = EngineConfig(engine, method, k)
    best_tried = {}
    for c in levels:
        b = max((e for (m, cc), e in f.items() if cc == c), key=lambda e: e["speedup"])
        best_tried[c] = {"label": b["config"], "speedup": b["speedup"]} if b["speedup"] > 1 else {
            "label": EngineConfig(engine).label, "speedup": 1.0}
    advice = {"levels": [{"concurrency": c, "k": k, "k_measured": float(k or 1)} for c in levels]}
    flags = engine_config(engine, advice, model="MODEL", method="draft" if method == "draft" else "ngram",
                          draft="DRAFT") if method != "off" else engine_config(engine, advice, model="MODEL")
    return {"config": cfg, "label": cfg.label, "score": round(score, 4),
            "per_level": {c: round(p, 4) for c, p in preds.items()},
            "fits": {f"{m}@{c}": e for (m, c), e in sorted(f.items())}, "best_tried": best_tried,
            "flags": flags["command"]}


def _level_speedups(rows: list[dict], engine: str, label: str) -> list[dict]:
    try:
        return advise(as_endpoint_rows(rows, label, EngineConfig(engine).label))["levels"]
    except AdaspecError:
        return []
