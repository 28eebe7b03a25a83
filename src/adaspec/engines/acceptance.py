"""What each engine says it accepted, read a second way, to check the counters the benchmark differences.

* **vLLM**: besides the ``/metrics`` counters (:mod:`adaspec.bench.engine_metrics`), the server logs its own
  numbers every stats interval (``vllm/v1/spec_decode/metrics.py``, ``SpecDecodingLogging.log``: "SpecDecoding
  metrics: Mean acceptance length: …, Accepted: N tokens, Drafted: M tokens, Per-position acceptance rate: …").
  Each line covers the interval since the last, so their sums over a server's life must equal the counters'
  totals: :func:`vllm_log_totals` and :func:`check_vllm`. vLLM 0.32 also returns each request's own numbers
  (``metrics.speculative_decoding``: drafted and accepted tokens, steps, a histogram of accepted drafts per step)
  when started with ``--per-request-spec-decode-metrics summary``; summed over a level's requests they must equal
  the level's counter differences, per position included (:func:`check_responses`).
* **llama-server**: each response's ``timings.draft_n`` / ``draft_n_accepted`` (summed by the endpoint bench).
  They count tokens, not speculation steps, so τ and K̄ need the number of drafting steps; with
  ``--spec-type draft-simple --spec-draft-p-min 0`` every step drafts K tokens, so steps = draft_n / K
  (:func:`llama_server_tau`). For n-gram lookup the drafts are shorter than K when the match is, so the step
  count is unknown and τ is left out (the advice then uses the measured speedups of the Ks tried).
"""

from __future__ import annotations

import re

from adaspec.engines.config import EngineConfig

_VLLM_LINE = re.compile(r"SpecDecoding metrics:.*?Accepted: (\d+) tokens, Drafted: (\d+) tokens"
                        r"(?:, Per-position acceptance rate: ([0-9., ]+))?")


def vllm_log_totals(text: str) -> dict:
    """Sums over vLLM's "SpecDecoding metrics" log lines: ``lines``, ``accepted``, ``drafted`` (tokens)."""
    lines = accepted = drafted = 0
    for m in _VLLM_LINE.finditer(text):
        lines += 1
        accepted += int(m.group(1))
        drafted += int(m.group(2))
    return {"lines": lines, "accepted": accepted, "drafted": drafted}


def check_vllm(counters: dict, log_totals: dict) -> dict:
    """Compare the ``/metrics`` counters' totals (``draft_tokens``, ``accepted`` since the server started) with
    the log's sums. ``match`` is True when both counts agree exactly."""
    c_drafted, c_accepted = int(counters.get("draft_tokens", 0)), int(counters.get("accepted", 0))
    return {"counters": {"drafted": c_drafted, "accepted": c_accepted},
            "log": {"drafted": log_totals["drafted"], "accepted": log_totals["accepted"],
                    "lines": log_totals["lines"]},
            "match": (c_drafted, c_accepted) == (log_totals["drafted"], log_totals["accepted"])}


def llama_server_tau(spec: dict, cfg: EngineConfig) -> dict:
    """``spec`` (an endpoint row's acceptance, summed from llama-server's ``timings``) with τ, K̄ and the step count
    added where they are known: the draft-model method at ``--spec-draft-p-min 0`` drafts K tokens every step."""
    if cfg.method != "draft" or spec.get("source") != "responses" or not spec.get("draft_tokens"):
        return spec
    drafts = spec["draft_tokens"] / cfg.k
    return {**spec, "drafts": round(drafts, 3), "mean_draft_length": float(cfg.k),
            "mean_acceptance_length": 1.0 + spec["accepted"] / drafts,
            "note": spec.get("note", "") + f"; steps = draft_n / K (draft-simple drafts K = {cfg.k} tokens a step)"}


def check_responses(spec: dict, responses: dict) -> dict:
    """Counter differences of one level (``spec`` from :func:`adaspec.bench.engine_metrics.spec_stats`) against
    the sums of its requests' own numbers (``responses``: a row's ``response_timings``). Compared: drafts (steps),
    draft tokens, accepted tokens and accepted tokens per position, where both sides have them. ``match`` is True
    when every compared count is equal."""
    compared = {}
    for field, theirs in (("drafts", "drafts"), ("draft_tokens", "draft_tokens"), ("accepted", "accepted")):
        if spec.get(field) is not None and responses.get(theirs) is not None:
            compared[field] = [int(spec[field]), int(responses[theirs])]
    per_pos = spec.get("acceptance_per_pos")
    if per_pos is not None and spec.get("drafts") and responses.get("accepted_per_pos") is not None:
        counters = [round(p * spec["drafts"]) for p in per_pos]
        theirs = list(responses["accepted_per_pos"])
        width = max(len(counters), len(theirs))
        compared["accepted_per_pos"] = [counters + [0] * (width - len(counters)), theirs + [0] * (width - len(theirs))]
    return {"compared": compared, "match": bool(compared) and all(a == b for a, b in compared.values())}
