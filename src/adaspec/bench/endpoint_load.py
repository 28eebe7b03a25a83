"""Load generation against an endpoint (closed loop: a fixed number of clients; open loop: seeded Poisson
arrivals) and the summary of one configuration's requests (throughput, latency percentiles, goodput, acceptance
from the responses)."""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from adaspec.bench.endpoint_client import RequestResult
from adaspec.errors import ConfigError


def closed_loop(call: Callable[[int], RequestResult], n: int, concurrency: int, deadline: float
                ) -> list[RequestResult]:
    """``concurrency`` clients, each sending its next request when its last is answered, ``n`` requests in all
    (fewer if ``deadline``, a ``time.monotonic()`` value, passes)."""
    lock, counter, results = threading.Lock(), iter(range(n)), []

    def client() -> None:
        while time.monotonic() < deadline:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            r = call(i)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def open_loop(call: Callable[[int], RequestResult], n: int, rate: float, seed: int, deadline: float,
              max_inflight: int) -> list[RequestResult]:
    """Poisson arrivals at ``rate`` requests/s (seeded exponential gaps), ``n`` requests, at most ``max_inflight``
    in flight; each result's ``late_s`` is how long it waited for a free client slot after its arrival.

    Raises:
        ConfigError: ``rate`` is not positive.
    """
    if not rate > 0:
        raise ConfigError(f"an open-loop rate must be positive (requests/s), not {rate!r}")
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(rate)
        arrivals.append(t)
    t0 = time.monotonic()

    def timed(i: int) -> RequestResult:
        late = time.monotonic() - (t0 + arrivals[i])
        r = call(i)
        r.late_s = max(late, 0.0)
        return r

    futures = []
    with ThreadPoolExecutor(max_workers=max_inflight) as pool:
        for i, at in enumerate(arrivals):
            wait = t0 + at - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if time.monotonic() >= deadline:
                break
            futures.append(pool.submit(timed, i))
    return [f.result() for f in futures]


def _dist(values: Sequence[float], scale: float = 1e3) -> dict | None:
    """mean / p50 / p95 / p99 of ``values`` (seconds) in ms, or None when empty."""
    if not values:
        return None
    v = sorted(x * scale for x in values)

    def q(p: float) -> float:
        return v[min(len(v) - 1, max(0, round(p * (len(v) - 1))))]

    return {"mean": round(statistics.fmean(v), 3), "p50": round(q(0.5), 3), "p95": round(q(0.95), 3),
            "p99": round(q(0.99), 3)}


def decode_rate(tokens: int, ttft, e2e) -> float | None:
    """One request's decode rate, tokens per unit of ``ttft``/``e2e`` (seconds or ms), after its first token:
    (tokens − 1) / (e2e − TTFT); None for a request of one token or without a decode time."""
    if tokens > 1 and ttft is not None and e2e is not None and e2e > ttft:
        return (tokens - 1) / (e2e - ttft)
    return None


def summarise(results: Sequence[RequestResult], wall_s: float, *, slo_ttft_ms: float | None = None,
              slo_tpot_ms: float | None = None) -> dict:
    """Aggregate one configuration's requests (each field is described in :mod:`adaspec.bench.endpoint`);
    ``wall_s`` is the configuration's wall time in seconds."""
    ok = [r for r in results if r.ok]
    tpots = [(r.e2e_s - r.ttft_s) / (r.tokens - 1) for r in ok if r.tokens > 1]
    itls = [b - a for r in ok for a, b in zip(r.chunks, r.chunks[1:])]
    decode_s = sum(r.e2e_s - r.ttft_s for r in ok if r.tokens > 1)
    decode_tokens = sum(r.tokens - 1 for r in ok if r.tokens > 1)
    tokens = sum(r.tokens for r in ok)
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            errors[r.error or "failed"] = errors.get(r.error or "failed", 0) + 1
    out = {"completed": len(ok), "failed": len(results) - len(ok), "errors": dict(list(errors.items())[:5]),
           "wall_s": round(wall_s, 6), "output_tokens": tokens,
           "tokens_counted": "usage" if ok and all(r.tokens_from_usage for r in ok) else "chunks",
           "throughput_tok_s": round(tokens / wall_s, 3) if wall_s > 0 else None,
           "request_rate": round(len(ok) / wall_s, 4) if wall_s > 0 else None,
           "decode_tok_s": round(decode_tokens / decode_s, 3) if decode_s > 0 else None,
           "ttft_ms": _dist([r.ttft_s for r in ok]), "tpot_ms": _dist(tpots), "itl_ms": _dist(itls),
           "e2e_ms": _dist([r.e2e_s for r in ok]), "late_ms": _dist([r.late_s for r in results])}
    if slo_ttft_ms is not None or slo_tpot_ms is not None:
        def meets(r: RequestResult) -> bool:
            tpot = (r.e2e_s - r.ttft_s) / (r.tokens - 1) if r.tokens > 1 else 0.0
            return ((slo_ttft_ms is None or r.ttft_s * 1e3 <= slo_ttft_ms)
                    and (slo_tpot_ms is None or tpot * 1e3 <= slo_tpot_ms))
        good = sum(1 for r in ok if meets(r))
        out["goodput"] = {"slo_ttft_ms": slo_ttft_ms, "slo_tpot_ms": slo_tpot_ms, "requests": good,
                          "req_s": round(good / wall_s, 4) if wall_s > 0 else None}
    drafted = [r for r in ok if r.draft_n is not None]
    if drafted:
        n = sum(r.draft_n for r in drafted)
        a = sum(r.draft_accepted for r in drafted)
        out["response_timings"] = {"draft_tokens": n, "accepted": a,
                                   "acceptance_rate": round(a / n, 4) if n else None}
        if all(r.draft_steps is not None for r in drafted):  # vLLM's per-request numbers: steps and histogram
            out["response_timings"]["drafts"] = sum(r.draft_steps for r in drafted)
        hists = [r.accept_hist for r in drafted if r.accept_hist]
        if hists and len(hists) == len(drafted):
            # histogram[j] = steps that accepted exactly j draft tokens, so position i was accepted Σ_{j>i} times
            width = max(len(h) for h in hists)
            out["response_timings"]["accepted_per_pos"] = [sum(sum(h[i + 1:]) for h in hists)
                                                          for i in range(width - 1)]
    out["requests_detail"] = [[r.prompt_id, r.ok, r.tokens, _ms(r.ttft_s), _ms(r.e2e_s)] for r in results]
    return out


def _ms(s: float | None) -> float | None:
    return None if s is None else round(s * 1e3, 2)
