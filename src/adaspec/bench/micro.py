"""Micro-measurements that the cost model is fitted to, taken directly on the backends.

* verify: prefill a real-text context of L tokens once, then time ``forward(n tokens) + argmax + truncate(L)``
  for each n = K + 1, repeated, in rotating order; the context is extended in place to the next L (the cache only
  grows), so the largest context costs one prefill in all.
* draft: the same for a draft model with n = 1 (the cost of one drafted token at context L).
* prefill: the time each extension took (tokens/s of prefill, hence TTFT at any L).
* overhead: a few plain engine steps at the smallest context; o = step time − forward time.

Each measurement is one dict (``kind = "micro"``) with the median and all samples in milliseconds.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch

from adaspec.backends.base import Backend


def _time_forward(backend: Backend, tokens: Sequence[int], context: int) -> float:
    start = time.perf_counter()
    logits = backend.forward(list(tokens), len(tokens))
    logits.argmax(dim=-1)
    backend.truncate(context)
    backend.synchronize()
    return (time.perf_counter() - start) * 1e3


def measure_backend(backend: Backend, ids: Sequence[int], contexts: Sequence[int], widths: Sequence[int],
                    repeats: int, *, on_point: Callable[[], None] | None = None, keep: bool = False) -> list[dict]:
    """Verify/draft timings of ``backend`` at each context in ``contexts`` for each width in ``widths``.

    Args:
        ids: real-text token ids, at least ``max(contexts) + max(widths)`` long.
        on_point: called after each (context, width) measurement (progress).
        keep: leave the cache holding the first ``max(contexts)`` ids (a later prompt sharing them reuses it)
            instead of emptying it.

    Returns:
        Dicts with ``measure`` ("forward" or "prefill"), ``context``, ``n``, ``ms`` (median) and ``samples``;
        prefill rows also carry ``cum_ms``, the prefill time from an empty cache to ``context``.
    """
    contexts = sorted(set(int(c) for c in contexts))
    widths = sorted(set(int(n) for n in widths))
    if len(ids) < contexts[-1] + widths[-1]:
        raise ValueError(f"need {contexts[-1] + widths[-1]} token ids, got {len(ids)}")
    rows: list[dict] = []
    backend.reset()
    with torch.inference_mode():
        done = 0
        cum = 0.0
        for ctx in contexts:
            start = time.perf_counter()
            backend.forward(list(ids[done:ctx]), 1)
            backend.synchronize()
            ms = (time.perf_counter() - start) * 1e3
            cum += ms
            rows.append({"measure": "prefill", "context": ctx, "n": ctx - done, "ms": ms, "cum_ms": cum,
                         "samples": []})
            done = ctx
            for n in widths:  # one untimed run per width: first-call allocations stay out
                _time_forward(backend, ids[ctx:ctx + n], ctx)
            samples: dict[int, list[float]] = {n: [] for n in widths}
            for r in range(repeats):
                order = widths[r % len(widths):] + widths[:r % len(widths)]
                for n in order:
                    samples[n].append(_time_forward(backend, ids[ctx:ctx + n], ctx))
            for n in widths:
                rows.append({"measure": "forward", "context": ctx, "n": n, "ms": statistics.median(samples[n]),
                             "samples": [round(s, 3) for s in samples[n]]})
                if on_point:
                    on_point()
    if not keep:
        backend.reset()
    return rows


def prefill_ms_at(rows: Sequence[dict], context: float) -> float | None:
    """Cold prefill time to ``context`` tokens, interpolated (linearly; extrapolated from the last segment) from
    one model's prefill rows; None without any."""
    pts = sorted((r["context"], r["cum_ms"]) for r in rows if r.get("measure") == "prefill" and "cum_ms" in r)
    if not pts:
        return None
    pts = [(0, 0.0)] + pts
    for (c0, m0), (c1, m1) in zip(pts, pts[1:]):
        if context <= c1:
            return m0 + (m1 - m0) * (context - c0) / (c1 - c0)
    (c0, m0), (c1, m1) = pts[-2], pts[-1]
    return m1 + (m1 - m0) * (context - c1) / (c1 - c0)


def measure_overhead(engine, prompt_ids: Sequence[int], steps: int = 8) -> float:
    """Per-step engine overhead of plain decoding (stop checks, detokenising, controller), ms: mean over ``steps``
    plain steps of step time − (draft + verify) time."""
    from adaspec.engine import GenerationConfig

    result = engine.generate(list(prompt_ids), GenerationConfig(max_new_tokens=steps + 1, ignore_eos=True, seed=0))
    parts = [s.total_ms - s.verify_ms - s.draft_ms for s in result.stats.steps]
    return statistics.median(parts) if parts else 0.0


def verify_samples(rows: Sequence[dict]) -> list[tuple[int, int, float]]:
    """``(n, L, ms)`` triples of a target's micro rows, for :meth:`FittedCostModel.fit`."""
    return [(r["n"], r["context"], r["ms"]) for r in rows if r.get("measure") == "forward"]
