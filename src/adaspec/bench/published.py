"""Published speedups (with their τ) and the roofline model's predictions of them, to validate
:mod:`adaspec.bench.hardware` against measurements made elsewhere."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

from adaspec.bench.hardware import HardwareProfile, profile
from adaspec.models.synthetic import SHAPES


@dataclass(frozen=True)
class PublishedPoint:
    """One published speedup measurement to predict.

    Attributes:
        source: paper/leaderboard and table.
        hardware: a :data:`~adaspec.bench.hardware.PROFILES` key.
        target, draft: :data:`SHAPES` keys (``draft`` None for a lookup drafter, prompt lookup decoding).
        method: what was measured (e.g. "SpS", "PLD").
        k: draft tokens per step (the method's setting).
        tau: published mean accepted tokens per step (τ, tokens emitted per target forward).
        speedup: published speedup over plain decoding.
        context: a typical context length of the benchmark, tokens.
        dtype: the weights' dtype (a :data:`~adaspec.bench.hardware.BYTES_PER_PARAM` key).
        layer_ms: host time per decoder layer of the engine measured (0 for CUDA graphs, as vLLM captures them);
            None = the profile's (eager PyTorch).
    """

    source: str
    hardware: str
    target: str
    draft: str | None
    method: str
    k: int
    tau: float
    speedup: float
    context: int = 512
    dtype: str = "float16"
    layer_ms: float | None = None


SPEC_BENCH = ("Spec-Bench leaderboard (Xia et al. 2024, github.com/hemingkx/Spec-Bench Leaderboard.md): greedy, "
              "FP16, batch 1, PyTorch 2.0.1, HF transformers eager; SpS = HF assisted generation (5 draft tokens "
              "by default) with vicuna-68m; PLD = prompt lookup, 10 candidate tokens")


VLLM_H100 = ("T. Ruiz, \"Up to 3.55x faster: contributing speculative decoding with draft models to vLLM V1\" (blog, "
             "Jan 2026; logs in github.com/tomasruizt/vllm-scripts results/logs-2026-01-23, concurrency 1): vLLM V1 "
             "with CUDA graphs, one NVIDIA H100 96GB, Qwen3-32B bf16, temperature 0, 256 output tokens; speedup = "
             "plain mean TPOT / speculative mean TPOT, τ = its \"Acceptance length\"")


_VLLM_H100_ROWS = (  # dataset, plain mean TPOT (ms), draft, K, acceptance length τ, speculative mean TPOT (ms)
    ("MT-Bench", 34.17, "1.7B", 2, 2.35, 17.86), ("MT-Bench", 34.17, "1.7B", 4, 3.15, 15.24),
    ("MT-Bench", 34.17, "1.7B", 6, 3.58, 15.18), ("MT-Bench", 34.17, "4B", 2, 2.47, 19.28),
    ("MT-Bench", 34.17, "4B", 4, 3.42, 17.38), ("MT-Bench", 34.17, "4B", 6, 4.05, 17.65),
    ("InstructCoder", 33.97, "1.7B", 2, 2.24, 18.73), ("InstructCoder", 33.97, "1.7B", 4, 2.85, 16.98),
    ("InstructCoder", 33.97, "1.7B", 6, 3.17, 17.18), ("InstructCoder", 33.97, "4B", 2, 2.35, 20.29),
    ("InstructCoder", 33.97, "4B", 4, 3.16, 18.72), ("InstructCoder", 33.97, "4B", 6, 3.60, 19.88),
)


PUBLISHED: tuple[PublishedPoint, ...] = (
    PublishedPoint(SPEC_BENCH + ", RTX 3090 table", "rtx-3090", "vicuna-7b", "vicuna-68m", "SpS", 5, 2.29, 1.83),
    PublishedPoint(SPEC_BENCH + ", RTX 3090 table", "rtx-3090", "vicuna-7b", None, "PLD", 10, 1.74, 1.55),
    PublishedPoint(SPEC_BENCH + ", A100 table", "a100-80gb", "vicuna-7b", "vicuna-68m", "SpS", 5, 2.28, 1.49),
    PublishedPoint(SPEC_BENCH + ", A100 table", "a100-80gb", "vicuna-7b", None, "PLD", 10, 1.73, 1.59),
    PublishedPoint(SPEC_BENCH + ", A100 table", "a100-80gb", "vicuna-13b", "vicuna-68m", "SpS", 5, 2.18, 1.49),
    PublishedPoint(SPEC_BENCH + ", A100 table", "a100-80gb", "vicuna-13b", None, "PLD", 10, 1.68, 1.48),
    PublishedPoint(SPEC_BENCH + ", A100 table", "a100-80gb", "vicuna-33b", "vicuna-68m", "SpS", 5, 2.01, 1.61),
    PublishedPoint(SPEC_BENCH + ", A100 table", "a100-80gb", "vicuna-33b", None, "PLD", 10, 1.55, 1.42),
    *(PublishedPoint(VLLM_H100, "h100-sxm", "qwen3-32b", f"qwen3-{draft.lower()}",
                     f"{data}, draft {draft}", k, tau, plain_tpot / tpot, context=256, dtype="bfloat16", layer_ms=0.0)
      for data, plain_tpot, draft, k, tau, tpot in _VLLM_H100_ROWS),
)
"""Published speedups with their τ, so a prediction needs no α: speedup = τ T(1) / (K T_d + T(K + 1))."""


def predict_published(p: PublishedPoint, prof: HardwareProfile | None = None, *, lookup_ms: float = 0.1) -> float:
    """Predicted speedup of a published point on its hardware profile (or ``prof``): the published τ over the
    predicted step-time ratio, speedup = τ T(1, L) / (K T_d(L) + T(K + 1, L))."""
    prof = prof or profile(p.hardware, layer_ms=p.layer_ms)
    t = SHAPES[p.target]
    plain = prof.forward_time_ms(t, 1, p.context, dtype=p.dtype)
    draft = lookup_ms if p.draft is None else prof.forward_time_ms(SHAPES[p.draft], 1, p.context, dtype=p.dtype)
    step = p.k * draft + prof.forward_time_ms(t, p.k + 1, p.context, dtype=p.dtype)
    return p.tau * plain / step


def validate_published(points=PUBLISHED, **overrides) -> list[dict]:
    """Each published point with its prediction and relative error (``overrides`` go to every profile)."""
    out = []
    for p in points:
        given = {k: v for k, v in overrides.items() if v is not None}  # an unset override keeps the point's own
        pred = predict_published(p, profile(p.hardware, **{"layer_ms": p.layer_ms, **given}))
        out.append({**asdict(p), "predicted": pred, "error": (pred - p.speedup) / p.speedup})
    return out


def median_abs_error(rows: list[dict]) -> float:
    """Median of ``|error|`` over :func:`validate_published` rows (NaN errors left out; NaN when none)."""
    errs = [abs(r["error"]) for r in rows if not math.isnan(r["error"])]
    return statistics.median(errs) if errs else math.nan
