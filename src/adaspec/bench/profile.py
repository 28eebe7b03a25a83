"""``adaspec profile``: measure a small sample of a workload and advise whether and how to speculate.

1. Micro-measure the target's verify cost and each draft model's per-token cost at the sample's typical context
   (prompt + half the output), as :mod:`adaspec.bench.micro` does.
2. Run each candidate drafter with a probe draft length (K = 4, fixed) on every sampled prompt, interleaved with
   plain decoding, to measure its acceptance α (per position), how often it drafts at all, and the speedup it got.
3. Predict speedup(α, K) for K = 1..8 with the cost model, take the best (drafter, K), and bootstrap the prompts
   for a 95% confidence interval of its speedup.
4. Recommend: speculate when the whole interval is above 1 + MARGIN (the interval is over prompts; the margin
   covers the cost model's own error); do not when it is below 1 or no K beats plain decoding; otherwise speculate
   with the goodput controller, which falls back to plain decoding when speculation stops paying. A "no" names,
   for every candidate, the acceptance it would need at K = 1 or why none would do.
5. Confirm (``confirm_tokens`` > 0): run the recommended configuration as it will run (its controller, the
   workload's answer length ``confirm_tokens``, stopping at EOS) on the sampled prompts, each interleaved with
   plain decoding, as ``adaspec compare`` does. The expected speedup and its 95 % interval are then the measured
   per-prompt decode speedups (mean, Student's t interval over prompts), and the decision is taken again on them; the cost
   model's prediction stays in the output (``model_speedup``). Why this step exists: the probe of step 2 runs a
   fixed K = 4 for ``max_new_tokens`` (48) tokens and the cost model extrapolates it, which predicted 1.55× where
   ``compare`` at 128 tokens measured 1.17× (issue 17): short probes see the start of an answer (prompt lookup
   matches the restated code there), ignore EOS and the controller's own exploration.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence

from adaspec.backends.gguf import GgufBackend
from adaspec.backends.prefix_cache import PrefixCacheBackend
from adaspec.bench.costmodel import FittedCostModel, leviathan_alpha
from adaspec.bench.micro import measure_backend, measure_overhead
from adaspec.bench.prompts import hf_builder
from adaspec.bench.loading import prefill_draft
from adaspec.bench.metrics import decode_tpot_ms
from adaspec.errors import AdaspecError
from adaspec.quality.stats import mean_interval

PROBE_K = 4
K_RANGE = range(1, 9)
MARGIN = 0.05  # "enable" needs the 95 % interval above 1 + MARGIN (the cost model's typical error); else "marginal"


def _sample(prompts: list, n: int) -> list:
    """``n`` prompts spread evenly over the workload (all of them when it has fewer)."""
    if len(prompts) <= n:
        return prompts
    step = len(prompts) / n
    return [prompts[int(i * step)] for i in range(n)]


def _load_drafter(spec: str, target, dtype: str | None, loader: Callable | None, backend: str = "auto",
                  device: str = "cpu"):
    from adaspec.api import make_drafter
    from adaspec.spec_setting import builtin_drafter
    from adaspec.drafters.model import ModelDrafter

    if loader is None or builtin_drafter(spec):
        return make_drafter(spec, target, dtype=dtype, backend=backend, device=device)
    return ModelDrafter(loader(spec, dtype).backend)


def profile_workload(workload: str, *, target: str, drafts: list[str], sample: int = 3, max_new_tokens: int = 48,
                     temperature: float = 0.0, dtype: str | None = None, threads: int | None = None, seed: int = 0,
                     loader: Callable | None = None, bootstrap: int = 2000, backend: str = "auto",
                     device: str = "auto", confirm_tokens: int = 128) -> dict:
    """Measure and advise (see the module docstring). Returns a JSON-ready dict. ``backend``/``device``/``dtype``
    choose where the models run as in :func:`adaspec.api.load`.

    Raises:
        AdaspecError: unknown workload, or no usable drafter.
        ConfigError: a synthetic (random-weight) target or draft: acceptance on a workload needs real text.
    """
    from adaspec.api import SpeculativeLM, load_model, set_threads
    from adaspec.models.synthetic import refuse_synthetic

    for spec in (target, *drafts):
        refuse_synthetic(spec, "adaspec profile")
    from adaspec.backends.select import resolve_device
    from adaspec.controllers import make_controller
    from adaspec.drafters.model import ModelDrafter
    from adaspec.drafters.suffix import with_own_cache
    from adaspec.engine import GenerationConfig, SpeculativeEngine
    from adaspec.workloads import load_workload

    n_threads = set_threads(threads)
    prompts = _sample(load_workload(workload), sample)
    device = resolve_device(device)
    tgt = loader(target, dtype) if loader else load_model(target, backend=backend, dtype=dtype, device=device)
    tok = tgt.tokenizer if hasattr(tgt.tokenizer, "decode") else None
    lm = SpeculativeLM(tgt, None, make_controller("fixed", 0))
    if getattr(tgt.tokenizer, "chat_template", None):
        encoded = [lm.encode(p.model_input()) for p in prompts]
    else:
        encoded = [tgt.tokenizer(p.as_text(), add_special_tokens=False)["input_ids"] for p in prompts]
    drafters = {d: _load_drafter(d, tgt, dtype, loader, backend, device) for d in drafts if d.lower() != "none"}
    if not drafters:
        raise AdaspecError("give at least one candidate drafter")
    # Every run of a prompt reuses its prompt cache (plain and speculative alike): prefill once per prompt.
    target_backend = PrefixCacheBackend(tgt.backend)
    for d in drafters.values():
        if isinstance(d, ModelDrafter):
            d.backend = PrefixCacheBackend(d.backend)

    # 1. Costs at the typical context.
    context = int(statistics.median(len(e) for e in encoded)) + max_new_tokens // 2
    widths = [k + 1 for k in (0, 1, 2, 3, 4, 5, 7)]
    padding = hf_builder(tgt.tokenizer).padding_ids(context + max(widths) + 1)
    micro = measure_backend(target_backend, padding, [context], widths, 3)
    draft_rows = []
    for name, d in drafters.items():
        if isinstance(d, ModelDrafter):
            draft_rows += [(name, r["context"], r["ms"]) for r in measure_backend(d.backend, padding, [context], [1], 3)
                           if r["measure"] == "forward"]
    plain = SpeculativeEngine(target_backend, None, None, tokenizer=tok)
    plain.warmup()
    overhead = measure_overhead(plain, encoded[0])
    model = FittedCostModel.fit([(r["n"], r["context"], r["ms"]) for r in micro if r["measure"] == "forward"],
                                draft_rows,
                          overhead)

    # 2. Probe runs, interleaved with plain decoding.
    cfg = GenerationConfig(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, ignore_eos=True)
    per: dict[str, list[dict]] = {d: [] for d in drafters}
    for ids in encoded:
        base = plain.generate(ids, cfg).stats
        base_tpot = decode_tpot_ms(base)
        for d in drafters.values():  # the draft model's prefill stays out of the timed probe (like the target's)
            if isinstance(d, ModelDrafter):
                prefill_draft(d, ids)
        for name, d in drafters.items():
            s = SpeculativeEngine(target_backend, d, make_controller("fixed", PROBE_K), tokenizer=tok).generate(
                ids, cfg).stats
            spec = [st for st in s.steps if st.drafted > 0]
            per[name].append({"accepted": s.accepted_tokens,
                              "rejections": sum(1 for st in spec if st.accepted < st.drafted),
                              "drafted": s.draft_tokens, "spec_steps": len(spec), "steps": len(s.steps),
                              "speedup": base_tpot / decode_tpot_ms(s) if decode_tpot_ms(s) else 0.0})

    # 3. Predictions and intervals.
    rng = random.Random(seed)
    candidates = []
    for name, runs in per.items():
        cost = name if name in model.draft else (None if name == "ngram" else 0.0)
        alpha, k_eff, p_plain = _pool(runs)
        best_k, best = _best(model, alpha, context, cost, p_plain, k_eff)
        boots = []
        for _ in range(bootstrap):
            a, ke, pp = _pool([rng.choice(runs) for _ in runs])
            kk = min(best_k, ke * best_k / PROBE_K) if cost is None else best_k  # as _best computes the point
            boots.append(model.speedup(a, kk, context, cost, pp))
        boots.sort()
        candidates.append({
            "drafter": name, "alpha": round(alpha, 4),
            "alpha_per_prompt": [round(leviathan_alpha(r["accepted"], r["rejections"]), 3) for r in runs],
            "drafting_steps_share": round(1 - p_plain, 3), "best_k": best_k,
            "predicted_speedup": round(best, 3),
            "ci95": [round(boots[int(0.025 * len(boots))], 3), round(boots[int(0.975 * len(boots)) - 1], 3)],
            "measured_speedup_probe_k": round(statistics.fmean(r["speedup"] for r in runs), 3),
            "draft_ms_per_token": round(model.draft_ms(cost, context), 2)})
    best = max(candidates, key=lambda c: c["predicted_speedup"])

    # 4. Decision. The interval covers the prompts' spread, not the cost model's own error (median 3-11 % against
    # measured points on the CPUs documented in docs/boundary-cpu.md): "yes" needs the interval clear of 1 by MARGIN.
    enable = decide(best["best_k"], best["ci95"])
    spread = max(best["alpha_per_prompt"]) - min(best["alpha_per_prompt"])
    controller = "goodput" if enable == "marginal" or spread > 0.15 or best["drafter"] == "ngram" else "fixed"
    k = best["best_k"]
    plain_ms = model.plain_step_ms(context)
    category = prompts[0].category
    if enable == "no":
        reason = "; ".join(_why_not(model, c, context, category, plain_ms) for c in candidates)
    else:
        reason = (f"acceptance {best['alpha']:.2f} on {category}; verify({k + 1}) costs "
                  f"{model.verify_ms(k + 1, context) / model.verify_ms(1, context):.2f}× a single step here; a draft "
                  f"token costs {best['draft_ms_per_token'] / plain_ms:.2f} steps")
    expected, ci, confirmed = best["predicted_speedup"], best["ci95"], None
    if enable != "no" and confirm_tokens > 0:
        controller_obj = (lambda: make_controller("goodput", None)) if controller == "goodput" else (
            lambda: make_controller("fixed", k))
        curve = {r["n"]: r["ms"] for r in micro if r["measure"] == "forward" and r["context"] == context}
        # a fresh suffix cache: the probes' answers to these very prompts would draft the confirmation's
        confirmed = _confirm(plain, target_backend, with_own_cache(drafters[best["drafter"]]), controller_obj,
                             encoded, tok,
                             GenerationConfig(max_new_tokens=confirm_tokens, temperature=temperature, seed=seed),
                             curve, context)
        if confirmed:
            expected = round(statistics.fmean(confirmed), 3)
            ci = [round(x, 3) for x in mean_interval(confirmed)]
            enable = decide(k, ci)
        else:  # no answer had two tokens: nothing to time, the model's prediction stands
            confirmed = None
    return {
        "workload": workload, "sample": len(prompts), "prompt_ids": [p.id for p in prompts],
        "context_tokens": context, "max_new_tokens": max_new_tokens,
        "temperature": temperature, "target": tgt.name,
        "dtype": "gguf" if isinstance(tgt.backend, GgufBackend) else dtype or "bfloat16", "threads": n_threads,
        "enable": enable, "expected_speedup": expected, "ci95": ci,
        "basis": (f"measured: the recommended configuration, {confirm_tokens} tokens, per-prompt decode speedups"
                  if confirmed else "cost model (probe at K = 4)"),
        "model_speedup": best["predicted_speedup"], "model_ci95": best["ci95"],
        "confirmed_speedups": [round(x, 3) for x in confirmed] if confirmed else None,
        "recommended": {"drafter": best["drafter"] if enable != "no" else "none",
                        "controller": controller if enable != "no" else "fixed", "k": k if enable != "no" else 0},
        "reason": reason,
        "costs": {"plain_step_ms": round(plain_ms, 2),
                  "verify_ratio": {str(n): round(model.verify_ms(n, context) / model.verify_ms(1, context), 3)
                                   for n in widths}},
        "candidates": candidates,
    }


def _confirm(plain, target_backend, drafter, controller, encoded: list[list[int]], tok, cfg, curve: dict,
             context: int) -> list[float]:
    """Per prompt: plain decoding, then the recommended configuration on the same prompt cache; the ratio of
    their decode times per token (the draft model's prompt prefill counted, as in ``adaspec compare``). Each fresh
    controller gets the verification curve measured in step 1, as an engine's warm-up calibration gives it."""
    from adaspec.engine import SpeculativeEngine

    out = []
    for ids in encoded:
        base = plain.generate(ids, cfg).stats
        ctrl = controller()
        if curve:
            ctrl.seed_verify_costs(curve, context)
        spec = SpeculativeEngine(target_backend, drafter, ctrl, tokenizer=tok).generate(ids, cfg).stats
        b, t = _decode_ms_per_token(base), _decode_ms_per_token(spec)
        if b and t:
            out.append(b / t)
    return out


def _decode_ms_per_token(stats) -> float | None:
    """(total − TTFT) / (tokens − 1) in ms: the decoding phase, drafter prefill included."""
    return (stats.total_ms - stats.ttft_ms) / (stats.new_tokens - 1) if stats.new_tokens > 1 else None


def decide(best_k: int, ci95: Sequence[float]) -> str:
    """``"yes"``, ``"no"`` or ``"marginal"`` for the best candidate's K and 95 % interval of predicted speedup."""
    lo, hi = ci95
    if best_k == 0 or hi < 1.0:
        return "no"
    return "yes" if lo > 1.0 + MARGIN else "marginal"


def _why_not(model: FittedCostModel, c: dict, context: int, category: str, plain_ms: float) -> str:
    """Why candidate ``c`` does not pay: its acceptance is below what K = 1 needs, or no acceptance would do."""
    cost = c["drafter"] if c["drafter"] in model.draft else (None if c["drafter"] == "ngram" else 0.0)
    need = model.min_alpha(1, context, cost)
    draft = c["draft_ms_per_token"] / plain_ms
    if need == need and c["alpha"] >= need:  # enough acceptance, yet no K's predicted speedup clears 1
        lo, hi = c["ci95"]
        return (f"{c['drafter']}: acceptance {c['alpha']:.2f} on {category} meets the {need:.2f} K = 1 needs, but "
                f"it drafts on {c['drafting_steps_share']:.0%} of steps and its predicted speedup is "
                f"{c['predicted_speedup']:.2f} (95 % interval {lo:.2f}-{hi:.2f})")
    if need == need:
        return (f"{c['drafter']}: acceptance {c['alpha']:.2f} on {category} is below the {need:.2f} that even K = 1 "
                f"needs here (a draft token costs {draft:.2f} of a {plain_ms:.0f} ms target step)")
    return (f"{c['drafter']}: cannot pay at any acceptance (a draft token costs {draft:.2f} of a {plain_ms:.0f} ms "
            f"step and verify(2) {model.verify_ms(2, context) / model.verify_ms(1, context):.2f} steps)")


def _pool(runs: list[dict]) -> tuple[float, float, float]:
    """Pooled α (per position), mean draft length per drafting step, share of steps that drafted nothing."""
    acc = sum(r["accepted"] for r in runs)
    alpha = leviathan_alpha(acc, sum(r["rejections"] for r in runs))
    spec = sum(r["spec_steps"] for r in runs)
    steps = sum(r["steps"] for r in runs)
    k_eff = sum(r["drafted"] for r in runs) / spec if spec else 0.0
    return alpha, k_eff, 1 - spec / steps if steps else 1.0


def _best(model: FittedCostModel, alpha: float, context: int, cost, p_plain: float, k_eff: float) -> tuple[int, float]:
    """Best K in 1..8 (n-gram drafts are capped by how much the lookup found: K_eff at the probe K)."""
    best = (0, 1.0)
    for k in K_RANGE:
        kk = min(k, k_eff * k / PROBE_K) if cost is None else k
        s = model.speedup(alpha, kk, context, cost, p_plain)
        if s > best[1]:
            best = (k, s)
    return best


def format_advice(a: dict) -> str:
    """Human-readable advice (``a`` as returned by :func:`profile_workload`)."""
    rec = a["recommended"]
    verdict = {"yes": "enable speculation", "no": "do not speculate (plain decoding)",
               "marginal": "marginal: speculate only with the goodput controller (it falls back to plain)"}[a["enable"]]
    lines = [
        f"workload {a['workload']}: {a['sample']} prompts, ~{a['context_tokens']} tokens of context, "
        f"{a['target']} {a['dtype']}, {a['threads']} threads, temperature {a['temperature']:g}",
        f"expected speedup  {a['expected_speedup']:.2f}x  (95% CI {a['ci95'][0]:.2f}-{a['ci95'][1]:.2f}; "
        f"{a.get('basis', 'cost model')})",
        f"advice            {verdict}",
        f"recommended       drafter {rec['drafter']}, controller {rec['controller']}, K = {rec['k']}",
        f"reason            {a['reason']}",
        "",
        "drafter                          alpha  best K  predicted  95% CI        measured at K=4",
    ]
    for c in a["candidates"]:
        lines.append(f"{c['drafter'][:32]:<32} {c['alpha']:.2f}   {c['best_k']:>5}   {c['predicted_speedup']:.2f}x"
                     f"      {c['ci95'][0]:.2f}-{c['ci95'][1]:.2f}     {c['measured_speedup_probe_k']:.2f}x")
    return "\n".join(lines)
