"""A sweep run's metrics: from one generation's step records (or a batch's), the decode time per token, acceptance,
time split per step, memory, CPU time and energy, as the records of :mod:`adaspec.bench.sweep` store them."""

from __future__ import annotations

import os
import statistics

from adaspec.bench.costmodel import leviathan_alpha
from adaspec.bench.measure import Meter, rss_bytes


def batch_metrics(results: list, reading, meter: Meter, wall_ms: float, prefill_ms: float) -> dict:
    """Metrics of one batched run (see :meth:`adaspec.bench.sweep.SweepRunner._group_batched`): the batch's decode
    throughput and per-row latency, acceptance over every row."""
    steps = [st for r in results for st in r.stats.steps]
    decode_ms = max(wall_ms - prefill_ms, 1e-9)
    decoded = sum(max(len(r.token_ids) - 1, 0) for r in results)
    new_tokens = sum(len(r.token_ids) for r in results)
    spec = [st for st in steps if st.drafted > 0]
    draft_tokens = sum(r.stats.draft_tokens for r in results)
    accepted = sum(r.stats.accepted_tokens for r in results)
    rejections = sum(1 for st in spec if st.accepted < st.drafted)
    batch_steps = max((len(r.stats.steps) for r in results), default=0)
    n = max(len(steps), 1)
    positions = max((len(r.stats.accepted_per_position) for r in results), default=0)
    return {
        "new_tokens": new_tokens, "steps": batch_steps, "speculation_steps": len(spec),
        "draft_tokens": draft_tokens, "accepted_tokens": accepted,
        "alpha": accepted / draft_tokens if draft_tokens else 0.0,
        "rejections": rejections, "alpha_l": leviathan_alpha(accepted, rejections),
        "tau": (accepted + len(spec)) / len(spec) if spec else 1.0,
        "mean_drafted": draft_tokens / len(spec) if spec else 0.0,
        "plain_fraction": 1 - len(spec) / n if steps else 1.0,
        "accepted_per_position": [sum(r.stats.accepted_per_position[i] for r in results
                                      if i < len(r.stats.accepted_per_position)) for i in range(positions)],
        "mean_context": statistics.fmean(st.context_len for st in steps) if steps else 0.0,
        "decode_ms": decode_ms,
        "tpot_ms": decode_ms / decoded if decoded else 0.0,
        "row_tpot_ms": statistics.fmean(decode_ms / max(len(r.token_ids) - 1, 1) for r in results),
        "decode_tokens_per_s": decoded / (decode_ms / 1e3),
        "batch_tokens_per_s": new_tokens / (wall_ms / 1e3),
        "step_draft_ms": sum(st.draft_ms for st in steps) / n,
        "step_verify_ms": sum(st.verify_ms for st in steps) / n,
        "step_other_ms": sum(st.total_ms - st.draft_ms - st.verify_ms for st in steps) / n,
        "step_total_ms": decode_ms / max(batch_steps - 1, 1),
        "ttft_ms": prefill_ms, "prefill_ms_run": prefill_ms, "total_ms": wall_ms,
        "rss_bytes": rss_bytes(), "peak_rss_bytes": max(r.stats.peak_rss_bytes for r in results),
        "cpu_s_per_token": reading.cpu_s / max(new_tokens, 1),
        "energy_j_per_token": reading.energy_j / max(new_tokens, 1) if reading.energy_j is not None else None,
        "energy_source": meter.energy_source,
        "k_trace": results[0].stats.k_trace if results else [],
        "loadavg_1m": loadavg(),
        "other_cpu": reading.other_cpu,
    }


def decode_tpot_ms(stats) -> float:
    """Decode-phase time per output token: step time / tokens the steps emitted (the prefill excluded)."""
    emitted = sum(st.emitted for st in stats.steps)
    return sum(st.total_ms for st in stats.steps) / emitted if emitted else 0.0


def run_metrics(result, reading, meter: Meter) -> dict:
    """Decode-phase metrics of one generation (steps only; the prefill is measured cold per group)."""
    s = result.stats
    steps = s.steps
    decode_ms = sum(st.total_ms for st in steps)
    emitted = sum(st.emitted for st in steps)
    spec = [st for st in steps if st.drafted > 0]
    rejections = sum(1 for st in spec if st.accepted < st.drafted)
    n = max(len(steps), 1)
    return {
        "new_tokens": s.new_tokens, "steps": len(steps), "speculation_steps": len(spec),
        "draft_tokens": s.draft_tokens, "accepted_tokens": s.accepted_tokens,
        "alpha": s.acceptance_rate,
        "rejections": rejections,
        "alpha_l": leviathan_alpha(s.accepted_tokens, rejections),
        "tau": s.mean_accepted_tokens,
        "mean_drafted": (s.draft_tokens / len(spec)) if spec else 0.0,
        "plain_fraction": 1 - len(spec) / n if steps else 1.0,
        "accepted_per_position": s.accepted_per_position,
        "mean_context": statistics.fmean(st.context_len for st in steps) if steps else s.prompt_tokens,
        "decode_ms": decode_ms,
        "tpot_ms": decode_tpot_ms(s),
        "decode_tokens_per_s": emitted / (decode_ms / 1e3) if decode_ms > 0 else 0.0,
        "step_draft_ms": sum(st.draft_ms for st in steps) / n,
        "step_verify_ms": sum(st.verify_ms for st in steps) / n,
        "step_other_ms": sum(st.total_ms - st.draft_ms - st.verify_ms for st in steps) / n,
        "step_total_ms": decode_ms / n,
        "ttft_ms": s.ttft_ms, "prefill_ms_run": s.prefill_ms, "total_ms": s.total_ms,
        "rss_bytes": rss_bytes(), "peak_rss_bytes": s.peak_rss_bytes,
        "cpu_s_per_token": reading.cpu_s / max(s.new_tokens, 1),
        "energy_j_per_token": reading.energy_j / max(s.new_tokens, 1) if reading.energy_j is not None else None,
        "energy_source": meter.energy_source,
        "k_trace": s.k_trace,
        "tree_steps": sum(1 for st in spec if st.tree),
        "tree_fallback": s.tree_fallback,
        "loadavg_1m": loadavg(),
        "other_cpu": reading.other_cpu,
    }


def loadavg() -> float | None:
    """The 1-minute load average after a run (runnable processes; above the core count means another program
    competed for the CPU during the measurement)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None
