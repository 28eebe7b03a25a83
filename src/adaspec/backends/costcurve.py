"""The verification cost curve t_v(n): measured on a backend, and read between and beyond its measured widths.

Verifying K drafts runs the target once over n = K + 1 tokens. How that forward's time grows with n decides how
long a draft pays: nearly flat on memory-bound hardware (a GPU, a big model on few cores), steeper where compute
binds (llama.cpp on 2 AVX2 cores: 65 ms for n = 1, 99 ms for n = 4, 157 ms for n = 8). The goodput controller
learns the curve from its own steps, but it only ever sees the widths it has run; :func:`measure_verify_curve`
times a handful of widths up front (in the engine's warm-up) so that it knows the curve's shape from the start.
"""

from __future__ import annotations

import bisect
import statistics
import time
from collections.abc import Mapping, Sequence

import torch

from adaspec.backends.base import Backend

DEFAULT_WIDTHS = (1, 2, 3, 4, 5, 6, 7, 9)  # n = K + 1 up to the goodput controller's default k_max = 8


def interpolate(points: Mapping[int, float], n: float) -> float:
    """Value of the piecewise-linear curve through ``points`` ({n: ms}) at ``n``.

    Between two measured widths: the straight line between them. Beyond the largest (or below the smallest): the
    slope of the last (first) segment, floored at 5% of the smallest value. One point: flat.
    """
    xs = sorted(points)
    if n in points:
        return float(points[n])
    ys = [float(points[x]) for x in xs]
    if len(xs) == 1:
        return ys[0]
    i = bisect.bisect_left(xs, n)
    lo, hi = (0, 1) if i == 0 else (len(xs) - 2, len(xs) - 1) if i == len(xs) else (i - 1, i)
    slope = (ys[hi] - ys[lo]) / (xs[hi] - xs[lo])
    return max(ys[lo] + slope * (n - xs[lo]), 0.05 * min(ys))


def measure_verify_curve(backend: Backend, widths: Sequence[int] = DEFAULT_WIDTHS, context_len: int = 0,
                         repeats: int = 3, filler: Sequence[int] = (1, 2, 3, 4, 5, 6, 7, 8)) -> dict[int, float]:
    """Time one verification-like forward of n tokens for each n in ``widths``; return ``{n: median ms}``.

    Each sample is ``forward(n tokens, num_logits=n)`` + argmax over the ``[n, V]`` logits + ``truncate`` back +
    ``synchronize``, as a verification step does; widths run in rotating order ``repeats`` times. The cache is
    first extended to ``context_len`` tokens with ``filler`` ids (cycled) if it holds fewer, so the curve is
    measured at ``max(backend.seq_len, context_len)`` tokens of context; afterwards the cache holds exactly what it
    held before. Cost: ``len(widths) * repeats`` forwards of at most ``max(widths)`` tokens.
    """
    widths = sorted({int(n) for n in widths})
    if not widths or widths[0] < 1 or repeats < 1:
        raise ValueError(f"need widths >= 1 and repeats >= 1, got {widths}, {repeats}")
    filler = [int(t) % backend.vocab_size for t in filler]
    start_len = backend.seq_len
    base = max(start_len, context_len)
    if base + widths[-1] > backend.max_context:
        raise ValueError(f"{backend.name}: measuring at {base} + {widths[-1]} tokens exceeds its context window")

    def tokens(count: int, at: int) -> list[int]:
        return [filler[(at + i) % len(filler)] for i in range(count)]

    samples: dict[int, list[float]] = {n: [] for n in widths}
    with torch.inference_mode():
        if base > start_len:
            backend.forward(tokens(base - start_len, start_len), 1)
        for r in range(repeats):
            for n in widths[r % len(widths):] + widths[:r % len(widths)]:
                t = time.perf_counter()
                backend.forward(tokens(n, base), n).argmax(dim=-1)
                backend.truncate(base)
                backend.synchronize()
                samples[n].append((time.perf_counter() - t) * 1e3)
        backend.truncate(start_len)
    return {n: statistics.median(s) for n, s in samples.items()}


def measure_draft_costs(backend: Backend, feed_tokens: int = 64, repeats: int = 3,
                        filler: Sequence[int] = (1, 2, 3, 4, 5, 6, 7, 8)) -> tuple[float, float]:
    """A draft model's two costs, measured on its ``backend``: ``(draft_ms, feed_ms)``, both ms per token.

    ``draft_ms`` is one drafting step (a one-token forward plus the argmax over its ``[1, V]`` logits) at
    ``feed_tokens`` tokens of context; ``feed_ms`` is one forward of ``feed_tokens`` tokens (a catch-up, such as the
    prompt a lazily prefilled draft model feeds at its first proposal) divided by ``feed_tokens``. Medians of
    ``repeats`` samples, measured on top of what the cache holds; afterwards it holds exactly that again.
    The goodput controller prices a draft model's first proposal from these before paying for it
    (:meth:`~adaspec.controllers.goodput.GoodputController.seed_draft_costs`). ``draft_ms`` is a lower bound of a
    drafting step in the engine, which also turns logits into a distribution, applies the request's controls and
    asks the stop rule; the controller's own steps replace both values once it has measured them.

    Raises:
        ValueError: ``feed_tokens`` or ``repeats`` below 1, or no room for ``feed_tokens + 1`` more tokens in the
            backend's context window.
    """
    if feed_tokens < 1 or repeats < 1:
        raise ValueError(f"need feed_tokens >= 1 and repeats >= 1, got {feed_tokens}, {repeats}")
    start_len = backend.seq_len
    if start_len + feed_tokens + 1 > backend.max_context:
        raise ValueError(f"{backend.name}: measuring at {start_len} + {feed_tokens + 1} tokens exceeds its context "
                         "window")
    filler = [int(t) % backend.vocab_size for t in filler]
    tokens = [filler[i % len(filler)] for i in range(feed_tokens + 1)]
    feeds, steps = [], []
    with torch.inference_mode():
        for _ in range(repeats):
            t = time.perf_counter()
            backend.forward(tokens[:feed_tokens], 1)
            backend.synchronize()
            feeds.append((time.perf_counter() - t) * 1e3 / feed_tokens)
            t = time.perf_counter()
            backend.forward(tokens[feed_tokens:], 1).argmax(dim=-1)
            backend.synchronize()
            steps.append((time.perf_counter() - t) * 1e3)
            backend.truncate(start_len)
    return statistics.median(steps), statistics.median(feeds)
