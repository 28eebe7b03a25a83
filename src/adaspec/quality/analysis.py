"""The paired analysis of scored rows (:func:`analyse`): accuracy, the difference to plain decoding, identity with
the reference method, divergences and their margins, speed; per machine where the rows ran on several."""

from __future__ import annotations

from collections import defaultdict

from adaspec.compare import parse_method
from adaspec.errors import AdaspecError
from adaspec.quality.gsm8k import is_correct, reference_answer
from adaspec.quality.scoring import GSM8K_TASKS, STRUCTURED, text_hash, task_problems
from adaspec.quality.stats import paired_difference, wilson_interval


def analyse(task: str, rows: list[dict], scores: dict[tuple[str, str], bool], threshold: float) -> dict[str, dict]:
    """Per method: accuracy, interval, paired comparison with plain decoding, identity with the method's reference,
    divergences (first position, margins, whether both answers were cut by ``max_new_tokens``), the share of
    answers cut by ``max_new_tokens`` or the context window (``truncated``: finish reason ``length``) and decoding speed (against plain decoding on the same
    prompts). For GSM8K also ``stated``: the same accuracy and paired comparison scoring only the answer the text
    states (:func:`~adaspec.quality.gsm8k.stated_answer`, no last-number fallback), which an answer cut mid-way
    through its reasoning seldom has.

    Each method is counted on the prompts where it, ``plain`` and its reference all finished, so a method run on
    fewer prompts (say, the lossy rules on a subset) is still compared like with like."""
    by_prompt: dict[str, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        by_prompt[r["prompt_id"]][r["method"]] = r
    methods = sorted({r["method"] for r in rows}, key=lambda m: (m != "plain", "+" in m, m))
    if "plain" not in methods:
        raise AdaspecError(f"{task}: no plain-decoding rows to compare with")

    def correct(r: dict) -> bool:
        return scores[(r["prompt_id"], text_hash(r["text"]))]

    def cut(r: dict) -> bool:
        return r.get("finish_reason") == "length"

    references = {pid: reference_answer(row["answer"]) for pid, row in task_problems(task).items()} \
        if task in GSM8K_TASKS else {}

    def stated(r: dict) -> bool:
        return is_correct(r["text"], references[r["prompt_id"]], stated_only=True)

    out: dict[str, dict] = {}
    for m in methods:
        spec = parse_method(m, "draft")
        ref = spec.reference if spec.reference in methods else "plain"
        prompts = sorted(p for p, ms in by_prompt.items() if {m, ref, "plain"} <= ms.keys())
        rs = [by_prompt[p][m] for p in prompts]
        plains = [by_prompt[p]["plain"] for p in prompts]
        ok, plain_ok = [correct(r) for r in rs], [correct(r) for r in plains]
        divergences = []
        for p in prompts:
            a, b = by_prompt[p][ref], by_prompt[p][m]
            if a["token_ids"] == b["token_ids"]:
                continue
            d = next((i for i, (x, y) in enumerate(zip(a["token_ids"], b["token_ids"])) if x != y),
                     min(len(a["token_ids"]), len(b["token_ids"])))
            divergences.append({"prompt_id": p, "position": d, "ref_margin": _at(a.get("margins"), d),
                                "margin": _at(b.get("margins"), d), "same_score": correct(a) == correct(b),
                                "both_truncated": cut(a) and cut(b)})
        n, k = len(ok), sum(ok)
        # A strict method claims bit-exactness: any divergence from plain+strict is a bug. Another lossless method
        # may flip a near-tie (numerics), not a pick with a clear margin.
        lossless = spec.lossy is None
        large = [dv for dv in divergences if lossless and (
            spec.strict and ref == "plain+strict" or dv["ref_margin"] is not None and dv["ref_margin"] > threshold)]
        tps, plain_tps = _tokens_per_s(rs), _tokens_per_s(plains)
        out[m] = {"method": m, "reference": ref, "lossy": spec.lossy, "strict": spec.strict, "n": n,
                  "correct": k, "accuracy": k / n if n else float("nan"), "ci95": wilson_interval(k, n),
                  "vs_plain": paired_difference(plain_ok, ok),
                  "identical": (n - len(divergences)) / n if n else float("nan"), "divergences": divergences,
                  "large_margin_divergences": large, "tokens_per_s": tps,
                  "speedup": _speedup(tps, plain_tps),
                  "truncated": sum(map(cut, rs)) / n if n else float("nan")}
        machines = _by_machine(prompts, by_prompt, m, ref, {dv["prompt_id"] for dv in divergences})
        if len({cpu for label in machines for cpu in label.split(" / ")}) > 1:
            out[m]["machines"] = machines
        if task == STRUCTURED:  # schema validity and the mean share of expected fields exactly right
            valid = [bool(r.get("valid")) for r in rs]
            out[m]["structured"] = {"valid": sum(valid) / n if n else float("nan"),
                                    "valid_ci95": wilson_interval(sum(valid), n),
                                    "exact_fields": sum(r.get("exact") or 0.0 for r in rs) / n if n else float("nan")}
        if references:
            sk = [stated(r) for r in rs]
            out[m]["stated"] = {"correct": sum(sk), "accuracy": sum(sk) / n if n else float("nan"),
                                "ci95": wilson_interval(sum(sk), n),
                                "vs_plain": paired_difference([stated(r) for r in plains], sk)}
    return out


def _by_machine(prompts: list[str], by_prompt: dict[str, dict[str, dict]], method: str, ref: str,
                diverged: set[str]) -> dict[str, dict]:
    """Per CPU label (the rows' ``cpu``, "not recorded" for rows written before they carried one; ``"A / B"`` when a
    prompt's method and plain rows ran on different machines): prompts, identity with the reference and speedup
    over plain decoding on that machine's prompts. A results file resumed on another machine mixes kernels (identity
    differs) and speeds (a pooled speedup means nothing), so the report splits them."""
    groups: dict[str, list[str]] = defaultdict(list)
    for p in prompts:
        cpus = dict.fromkeys(by_prompt[p][x].get("cpu") or "not recorded" for x in ("plain", ref, method))
        groups[" / ".join(cpus)].append(p)
    out = {}
    for cpu, ps in groups.items():
        tps, plain_tps = (_tokens_per_s([by_prompt[p][x] for p in ps]) for x in (method, "plain"))
        mixed = " / " in cpu  # a speed on one machine over a speed on another is no speedup
        out[cpu] = {"n": len(ps), "identical": sum(p not in diverged for p in ps) / len(ps),
                    "speedup": float("nan") if mixed else _speedup(tps, plain_tps)}
    return out


def _speedup(tps: float, plain_tps: float) -> float:
    """Decode tokens/s over plain decoding's; NaN without a plain speed."""
    return tps / plain_tps if plain_tps == plain_tps and plain_tps > 0 else float("nan")


def _tokens_per_s(rows: list[dict]) -> float:
    """Decode tokens/s over rows (Σ decode_tokens / Σ decode_ms); NaN without timing."""
    ms = sum(r.get("decode_ms") or 0.0 for r in rows)
    return sum(r.get("decode_tokens") or 0 for r in rows) / (ms / 1e3) if ms > 0 else float("nan")


def _at(values: list | None, i: int) -> float | None:
    return values[i] if values is not None and i < len(values) else None
