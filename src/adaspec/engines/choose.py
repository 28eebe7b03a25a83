"""One speculative configuration per engine from the measured configurations (``adaspec advise`` across configs).

Input: the derivation phase's ``scaleout`` rows of one engine (every tried configuration at every concurrency, ``off``
included). For each speculative configuration and concurrency, :func:`adaspec.bench.advise.advise` pairs it with ``off``
at that concurrency and fits Leviathan et al.'s model (α from τ and K̄, the cost c of a draft token from the measured
speedup). The speedup of a (method, K) at a concurrency (:func:`predict`) is the measured one where that K was tried
there; between two tried Ks, the two fits' predictions weighted by distance in K; beyond them, the nearest tried K's fit
(the least extrapolation). Over the concurrencies, each (method, K)'s predictions are smoothed to the nearest
non-increasing sequence (:func:`nonincreasing`). A prediction counts as a gain only where it clears the gain margin of
the measurements it rests on (:func:`adaspec.bench.advise.gain_margin`: 1.03×, or one standard error of the measured
speedup over paired prompts). llama-server takes one ``--spec-draft-n-max`` for all load, so one (method, K) must serve
every concurrency; where it is not a gain from some concurrency on (:func:`losing_from`), the advice is to serve that
load without speculation. The single (method, K) is the one with the highest geometric mean of what the advice would
deliver over the measured concurrencies (its prediction below that point, 1 from it on; a K > 0 must gain somewhere).
vLLM 0.32 also takes a K per batch size (``num_speculative_tokens_per_batch_size``): per method, the best K at each
measured concurrency (0 where nothing clears the margin) as ranges (:func:`adaspec.bench.advise.ranges`), chosen over
the single K when its geometric mean is higher. A method without acceptance counters (no τ) is scored with the measured
speedups of the Ks tried.
"""

from __future__ import annotations

import functools
import math

from adaspec.bench.advise import advise, engine_config, gain_margin, min_k, predicted_speedup, ranges
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


def measured_levels(rows: list[dict], engine: str, max_k: int = 8) -> dict[tuple[str, int], list[dict]]:
    """Per (method, concurrency): the advice entry of every configuration of that method measured cleanly with
    ``off`` there, each with its ``config`` (label) and ``k_tried``, in order of K."""
    off = EngineConfig(engine).label
    labels = sorted({(r["method"], r["k"], r["config"]) for r in rows if r.get("method") not in (None, "off")})
    out: dict[tuple[str, int], list[dict]] = {}
    for method, k, label in labels:
        try:
            levels = advise(as_endpoint_rows(rows, label, off), max_k=max_k)["levels"]
        except AdaspecError:
            continue  # this configuration has no level measured cleanly with off
        for e in levels:
            out.setdefault((method, e["concurrency"]), []).append({**e, "config": label, "k_tried": k})
    return {key: sorted(es, key=lambda e: e["k_tried"]) for key, es in out.items()}


def predict(entries: list[dict], k: int) -> tuple[float, float] | None:
    """(predicted speedup, gain margin) of K at one concurrency from that level's measured configurations of one
    method (``entries``, from :func:`measured_levels`): K = 0 is (1, 1); a K that was tried, its measured speedup and
    its own margin; a K between two tried ones, the two fits' predictions weighted by distance in K and the larger
    of their margins; beyond the tried Ks, the nearest one's fit. None where nothing fitted is near (a method
    without acceptance counters, at a K it did not try)."""
    if k == 0:
        return 1.0, 1.0
    exact = [e for e in entries if e["k_tried"] == k]
    if exact:
        return exact[0]["speedup"], gain_margin(exact[0])
    fitted = [e for e in entries if e.get("basis") == "fitted"]
    lo = max((e for e in fitted if e["k_tried"] < k), key=lambda e: e["k_tried"], default=None)
    hi = min((e for e in fitted if e["k_tried"] > k), key=lambda e: e["k_tried"], default=None)
    if lo is None and hi is None:
        return None
    if lo is None or hi is None:
        e = lo or hi
        return predicted_speedup(e["alpha"], e["cost"], k), gain_margin(e)
    w = (k - lo["k_tried"]) / (hi["k_tried"] - lo["k_tried"])
    return ((1 - w) * predicted_speedup(lo["alpha"], lo["cost"], k) + w * predicted_speedup(hi["alpha"], hi["cost"], k),
            max(gain_margin(lo), gain_margin(hi)))


def choose(rows: list[dict], engine: str, max_k: int = 8) -> dict:
    """The advised configuration for ``engine`` (see the module docstring). Returns ``config`` (an
    :class:`EngineConfig`), ``label``, ``score`` (geometric mean of the predicted speedup the advice delivers),
    ``per_level`` (concurrency → predicted speedup of the configuration), ``margins`` (concurrency → the gain margin
    its prediction had to clear, where it speculates), ``off_from`` (the concurrency from which the advice is to
    serve without speculation, or None), ``flags`` (the engine's command line from
    :func:`adaspec.bench.advise.engine_config`), ``single`` (the best single K's label) and ``fallback`` (that
    single K's own label, score, per_level, margins, off_from and flags where the advice is a vLLM schedule, for an
    engine that refuses it; else None), ``fits`` (per method and concurrency, the fastest measured entry) and
    ``best_tried`` (concurrency → the fastest measured label and its speedup).

    Raises:
        AdaspecError: no speculative configuration was measured cleanly against ``off``.
    """
    measured = measured_levels(rows, engine, max_k)
    if not measured:
        raise AdaspecError(f"{engine}: no speculative configuration was measured without failures against off")
    f = {key: max(es, key=lambda e: e["speedup"]) for key, es in measured.items()}
    levels = sorted({c for _, c in measured})

    @functools.cache
    def at(method: str, k: int) -> dict[int, tuple[float, float, bool] | None]:
        """Per concurrency: (speedup smoothed over load, gain margin, gain: the smoothed speedup clears the
        margin), or None where nothing predicts K there (smoothed over the levels that have a prediction)."""
        if method == "off":
            return {c: (1.0, 1.0, False) for c in levels}
        got = {c: predict(measured.get((method, c), []), k) for c in levels}
        known = [c for c in levels if got[c] is not None]
        smooth = dict(zip(known, nonincreasing([got[c][0] for c in known])))
        return {c: None if got[c] is None else
                (smooth[c], got[c][1], k > 0 and smooth[c] >= got[c][1]) for c in levels}

    scored = []  # (score, method, K, schedule, per-level predictions, off_from)
    for method, k in [("off", 0)] + [(m, k) for m in sorted({m for m, _ in f}) for k in range(min_k(engine, m),
                                                                                           max_k + 1)]:
        got = at(method, k)
        if None in got.values():
            continue
        preds = {c: p for c, (p, _, _) in got.items()}
        gains = {c: gain for c, (_, _, gain) in got.items()}
        if k > 0 and not any(gains.values()):
            continue
        # one K for every load: where it is no gain from some concurrency on, that load is served without speculation
        # (a second instance, or fewer slots), so the advice delivers 1 there
        off_from = losing_from(levels, gains) if k else None
        delivered = [1.0 if off_from is not None and c >= off_from else p for c, p in preds.items()]
        scored.append((_geomean(delivered), method, k, (), preds, off_from))
    single = max(scored, key=lambda s: (s[0], -s[2]))
    best = single
    if engine == "vllm":  # vLLM 0.32 takes a K per batch size: the best K at each measured concurrency
        for method in sorted({m for m, _ in f}):
            per = {}
            for c in levels:  # the best of the Ks that clear their own margin there, else 0
                options = {k: at(method, k)[c] for k in range(min_k(engine, method), max_k + 1)}
                gaining = [(k, got[0]) for k, got in options.items() if got is not None and got[2]]
                per[c] = max(gaining, key=lambda kp: (kp[1], -kp[0]), default=(0, 1.0))
            k_max = max(k for k, _ in per.values())
            if k_max == 0 or len({k for k, _ in per.values()}) == 1:
                continue  # off everywhere, or one K everywhere (already a single-K candidate)
            table = ranges([{"concurrency": c, "k": per[c][0]} for c in levels], k_max)
            preds = {c: p for c, (_, p) in per.items()}
            cand = (_geomean(preds.values()), method, k_max, tuple(tuple(r) for r in table), preds, None)
            if cand[0] > best[0]:
                best = cand

    def summary(cand: tuple) -> dict:
        score, method, k, schedule, preds, off_from = cand
        cfg = EngineConfig(engine, method, k, schedule)
        k_at = {c: (_k_at(schedule, c) if schedule else k) for c in levels}
        advice = {"levels": [{"concurrency": c, "k": k_at[c], "k_measured": float(k or 1)} for c in levels]}
        flags = engine_config(engine, advice, model="MODEL", method="draft" if method == "draft" else "ngram",
                              draft="DRAFT")["command"]
        if off_from is not None:
            flags += (f"  # up to {levels[levels.index(off_from) - 1]} concurrent requests; from {off_from} on, "
                      "serve without speculation (no gain predicted there beyond the measured noise)")
        return {"config": cfg, "label": cfg.label, "score": round(score, 4),
                "per_level": {c: round(p, 4) for c, p in preds.items()},
                "margins": {c: round(at(method, k_at[c])[c][1], 4) for c in levels if k_at[c] > 0},
                "off_from": off_from, "flags": flags}

    best_tried = {}
    for c in levels:
        b = max((e for (m, cc), e in f.items() if cc == c), key=lambda e: e["speedup"])
        best_tried[c] = {"label": b["config"], "speedup": b["speedup"]} if b["speedup"] > 1 else {
            "label": EngineConfig(engine).label, "speedup": 1.0}
    fallback = {k: v for k, v in summary(single).items() if k != "config"} if best is not single else None
    return {**summary(best), "single": EngineConfig(engine, single[1], single[2]).label,
            "fallback": fallback, "fits": {f"{m}@{c}": e for (m, c), e in sorted(f.items())},
            "best_tried": best_tried}


def losing_from(levels: list[int], gains: dict[int, bool]) -> int | None:
    """The lowest concurrency from which no higher measured level gains (``gains[c]``: the prediction clears that
    level's margin), when some lower level does; None otherwise (a dip between gains is not a reason to split the
    load)."""
    trailing = []
    for c in reversed(levels):
        if gains[c]:
            break
        trailing.insert(0, c)
    return trailing[0] if trailing and trailing[0] != levels[0] else None


def nonincreasing(values: list[float]) -> list[float]:
    """The non-increasing sequence nearest to ``values`` in log space (pool adjacent violators, equal weights: each
    run of levels that rises is replaced by its geometric mean). The gain of speculation on one server does not rise
    with its load: the wider the batch's forward, the less verification width is free (Liu et al. 2024, SmartSpec,
    arXiv 2406.14066: the gain shrinks, then turns to a loss, as the request rate and the batch grow). So a level
    that measured more than a lower one is read with it as one noisy measurement of a common gain: the higher level
    drops and the lower one rises to their geometric mean."""
    blocks: list[list[float]] = []  # [sum of logs, count]
    for v in values:
        blocks.append([math.log(max(v, 1e-9)), 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            total, n = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += n
    out: list[float] = []
    for total, n in blocks:  # a block of one keeps its value exactly (a speedup at a margin stays at it)
        out += [values[len(out)]] if n == 1 else [math.exp(total / n)] * n
    return out


def _geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values))


def _k_at(schedule: tuple, c: int) -> int:
    return next(k for a, b, k in schedule if a <= c <= b) if any(a <= c <= b for a, b, _ in schedule) else \
        schedule[-1][2]
