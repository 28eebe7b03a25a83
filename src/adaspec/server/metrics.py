"""Prometheus metrics of the server, named like vLLM's where they mean the same thing.

Every name is ``<namespace>:<name>`` with namespace ``adaspec`` by default (``--metrics-namespace vllm`` makes
existing vLLM dashboards work unchanged). Counters get prometheus-client's ``_total`` suffix on the wire.

Same meaning as vLLM (``vllm:<name>``):

=============================================  =========  ==========================================================
name                                           type       meaning
=============================================  =========  ==========================================================
``num_requests_running``                       gauge      requests generating now (0 to ``--max-batch``)
``num_requests_waiting``                       gauge      requests queued for the model
``prompt_tokens_total``                        counter    prompt tokens prefilled
``generation_tokens_total``                    counter    tokens generated
``request_success_total{finished_reason}``     counter    finished requests by reason (``stop`` / ``length``)
``time_to_first_token_seconds``                histogram  arrival → first generated token (queue time included)
``time_per_output_token_seconds``              histogram  mean time per output token after the first
``e2e_request_latency_seconds``                histogram  arrival → last token
``request_queue_time_seconds``                 histogram  time spent waiting for the model
``spec_decode_num_drafts_total``               counter    speculation steps that drafted at least one token
``spec_decode_num_draft_tokens_total``         counter    draft tokens proposed
``spec_decode_num_accepted_tokens_total``      counter    draft tokens accepted
``spec_decode_num_accepted_tokens_per_pos``    counter    accepted draft tokens by draft position (0 = first)
``iteration_tokens_total``                     histogram  tokens in each batched step's target forward (batched
                                                          server only; vLLM: tokens per engine step)
``prefix_cache_queries_total``                 counter    prompt tokens looked up in the prefix cache (``--max-batch``
                                                          1 with the prefix cache on)
``prefix_cache_hits_total``                    counter    of those, tokens the cache held (not prefilled)
=============================================  =========  ==========================================================

adaspec's own:

* ``requests_total{outcome}``: every request that reached a generation endpoint, by outcome: ``stop``,
  ``length``, ``cancelled`` (client went away), ``timeout``, ``rejected`` (queue full, 503), ``invalid``
  (4xx), ``error`` (5xx);
* ``spec_decode_k``: the draft length K the controller will use next (0 = plain decoding);
* ``spec_decode_active``: 1 while speculation is on (K > 0), 0 when the controller has switched it off;
* ``spec_decode_num_plain_steps_total``: decoding steps that ran without a draft (K = 0);
* ``spec_decode_num_fallbacks_total``: times a request's controller switched speculation off (K > 0 → 0);
* ``spec_decode_decode_seconds_total`` and ``spec_decode_plain_estimate_seconds_total``: decode time spent, and
  what plain decoding of the same tokens would have taken (tokens × measured plain step time);
  ``rate(plain_estimate) / rate(decode)`` is the live speedup estimate;
* ``spec_decode_speedup_estimate``: that ratio for the last finished request.

Per batch size (``--max-batch`` > 1; label ``batch_size`` = rows in the step's forward), so a dashboard can see how
speculation fares as the batch grows:

* ``batch_steps_total`` and ``batch_step_seconds_total``: batched steps, and the wall time of their target forwards;
* ``batch_generation_tokens_total``: tokens the steps emitted (all rows); over ``batch_step_seconds_total`` it is
  the decode throughput at that batch size;
* ``batch_draft_tokens_total`` and ``batch_accepted_tokens_total``: draft tokens proposed and accepted in steps of
  that batch size (their ratio is α by batch size; the batch's K cap shrinks K as the batch grows).

The spec-decode counters carry a ``drafter`` label besides ``model_name``, since requests may choose drafters.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from adaspec.stats import StepRecord

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
                   320.0, 640.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                5.0)

STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)

OUTCOMES = ("stop", "length", "cancelled", "timeout", "rejected", "invalid", "error")


class ServerMetrics:
    """All metrics of one server, in their own registry (so several servers can live in one process)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model_name: str, namespace: str = "adaspec") -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        r = self.registry
        m = ["model_name"]

        def n(name: str) -> str:
            return f"{namespace}:{name}"

        self.running = Gauge(n("num_requests_running"), "Requests generating now.", m, registry=r)
        self.waiting = Gauge(n("num_requests_waiting"), "Requests waiting for the model.", m, registry=r)
        self.prompt_tokens = Counter(n("prompt_tokens"), "Prompt tokens prefilled.", m, registry=r)
        self.generation_tokens = Counter(n("generation_tokens"), "Tokens generated.", m, registry=r)
        self.request_success = Counter(n("request_success"), "Finished requests by finish reason.",
                                       m + ["finished_reason"], registry=r)
        self.requests = Counter(n("requests"), "Requests by outcome.", m + ["outcome"], registry=r)
        self.ttft = Histogram(n("time_to_first_token_seconds"), "Arrival to first token, seconds.", m,
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram(n("time_per_output_token_seconds"), "Mean time per output token after the first.",
                              m, buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram(n("e2e_request_latency_seconds"), "Arrival to last token, seconds.", m,
                             buckets=LATENCY_BUCKETS, registry=r)
        self.queue_time = Histogram(n("request_queue_time_seconds"), "Time waiting for the model, seconds.", m,
                                    buckets=LATENCY_BUCKETS, registry=r)
        d = m + ["drafter"]
        self.drafts = Counter(n("spec_decode_num_drafts"), "Speculation steps that drafted tokens.", d, registry=r)
        self.draft_tokens = Counter(n("spec_decode_num_draft_tokens"), "Draft tokens proposed.", d, registry=r)
        self.accepted_tokens = Counter(n("spec_decode_num_accepted_tokens"), "Draft tokens accepted.", d,
                                       registry=r)
        self.accepted_per_pos = Counter(n("spec_decode_num_accepted_tokens_per_pos"),
                                        "Accepted draft tokens by draft position (0 = first).", d + ["position"],
                                        registry=r)
        self.plain_steps = Counter(n("spec_decode_num_plain_steps"), "Decoding steps without a draft (K = 0).", d,
                                   registry=r)
        self.fallbacks = Counter(n("spec_decode_num_fallbacks"),
                                 "Times a controller switched speculation off within a request.", d, registry=r)
        self.k = Gauge(n("spec_decode_k"), "Draft length K the controller chose for the last step (0 = plain decoding).", m, registry=r)
        self.active = Gauge(n("spec_decode_active"), "1 while speculation is on (K > 0), else 0.", m, registry=r)
        self.decode_seconds = Counter(n("spec_decode_decode_seconds"), "Decode time after the first token.", m,
                                      registry=r)
        self.plain_estimate_seconds = Counter(
            n("spec_decode_plain_estimate_seconds"),
            "Estimated plain-decoding time of the same tokens (tokens x measured plain step time).", m, registry=r)
        self.speedup = Gauge(n("spec_decode_speedup_estimate"), "Speedup estimate of the last finished request.",
                             m, registry=r)
        b = m + ["batch_size"]
        self.iteration_tokens = Histogram(n("iteration_tokens_total"), "Tokens in each batched step's forward.", m,
                                          buckets=(1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 2048),
                                          registry=r)
        self.iteration_seconds = Histogram(n("iteration_seconds"), "Wall time of each batched step (catch-up, "
                                           "drafting, forward, verification), seconds: the gap it puts between "
                                           "a stream's chunks.", m, buckets=STEP_BUCKETS, registry=r)
        self.batch_prefill_tokens = Counter(n("batch_prefill_tokens"), "Prompt tokens prefilled by batched steps.",
                                            m, registry=r)
        self.shared_prefix_tokens = Counter(n("shared_prefix_tokens"), "Prompt tokens a batched row took from "
                                            "another row's cache instead of prefilling them.", m, registry=r)
        self.prefix_queries = Counter(n("prefix_cache_queries"), "Prompt tokens looked up in the prefix cache.", m,
                                      registry=r)
        self.prefix_hits = Counter(n("prefix_cache_hits"), "Prompt tokens the prefix cache held.", m, registry=r)
        self.batch_steps = Counter(n("batch_steps"), "Batched steps by batch size.", b, registry=r)
        self.batch_seconds = Counter(n("batch_step_seconds"), "Target forward time of batched steps, seconds.", b,
                                     registry=r)
        self.batch_tokens = Counter(n("batch_generation_tokens"), "Tokens emitted by batched steps.", b, registry=r)
        self.batch_draft_tokens = Counter(n("batch_draft_tokens"), "Draft tokens proposed, by batch size.", b,
                                          registry=r)
        self.batch_accepted_tokens = Counter(n("batch_accepted_tokens"), "Draft tokens accepted, by batch size.", b,
                                             registry=r)
        # Children with the model label bound, and zero-initialised series so dashboards see them at once.
        for outcome in OUTCOMES:
            self.requests.labels(model_name, outcome)
        for reason in ("stop", "length"):
            self.request_success.labels(model_name, reason)
        for metric in (self.prompt_tokens, self.generation_tokens, self.decode_seconds, self.plain_estimate_seconds,
                       self.batch_prefill_tokens, self.shared_prefix_tokens, self.prefix_queries, self.prefix_hits):
            metric.labels(model_name)

    def _m(self, metric):
        return metric.labels(self.model_name)

    # Live, per step (called from the generation thread) --------------------------------------------------------
    def step(self, step: StepRecord, drafter: str, k: int, previous_k: int | None) -> None:
        """One step of a request: counters, and the K gauges set to ``k`` (the controller's choice for the step);
        a choice of 0 after ``previous_k`` > 0 is a fallback."""
        labels = (self.model_name, drafter or "none")
        if step.drafted > 0:
            self.drafts.labels(*labels).inc()
            self.draft_tokens.labels(*labels).inc(step.drafted)
            self.accepted_tokens.labels(*labels).inc(step.accepted)
            for pos in range(step.accepted):
                self.accepted_per_pos.labels(*labels, str(pos)).inc()
        else:
            self.plain_steps.labels(*labels).inc()
        if step.batch > 0:
            size = str(step.batch)
            self.batch_draft_tokens.labels(self.model_name, size).inc(step.drafted)
            self.batch_accepted_tokens.labels(self.model_name, size).inc(step.accepted)
        if previous_k is not None and previous_k > 0 and k == 0:
            self.fallbacks.labels(*labels).inc()
        self._m(self.k).set(k)
        self._m(self.active).set(1 if k > 0 else 0)

    def batch_step(self, rows: int, tokens: int, forward_s: float, emitted: int, *, step_s: float | None = None,
                   prefill_tokens: int = 0, shared_tokens: int = 0) -> None:
        """One batched step: ``rows`` rows, ``tokens`` tokens in the target forward taking ``forward_s`` seconds,
        ``emitted`` tokens emitted over all rows; the step's wall time ``step_s``, the prompt tokens it prefilled
        and those it took from other rows' caches."""
        size = str(rows)
        self._m(self.iteration_tokens).observe(tokens)
        if step_s is not None:
            self._m(self.iteration_seconds).observe(step_s)
        if prefill_tokens:
            self._m(self.batch_prefill_tokens).inc(prefill_tokens)
        if shared_tokens:
            self._m(self.shared_prefix_tokens).inc(shared_tokens)
        self.batch_steps.labels(self.model_name, size).inc()
        self.batch_seconds.labels(self.model_name, size).inc(forward_s)
        self.batch_tokens.labels(self.model_name, size).inc(emitted)

    def speculation_state(self, next_k: int) -> None:
        self._m(self.k).set(next_k)
        self._m(self.active).set(1 if next_k > 0 else 0)

    # Per request ------------------------------------------------------------------------------------------------
    def queued(self, seconds: float) -> None:
        self._m(self.queue_time).observe(seconds)

    def prefilled(self, prompt_tokens: int) -> None:
        self._m(self.prompt_tokens).inc(prompt_tokens)

    def prefix_cache(self, prompt_tokens: int, cached_tokens: int) -> None:
        self._m(self.prefix_queries).inc(prompt_tokens)
        self._m(self.prefix_hits).inc(cached_tokens)

    def outcome(self, outcome: str) -> None:
        self.requests.labels(self.model_name, outcome).inc()

    def finished(self, *, finish_reason: str, prompt_tokens: int, new_tokens: int, ttft_s: float | None,
                 tpot_s: float | None, e2e_s: float, decode_s: float, plain_estimate_s: float | None) -> None:
        self.request_success.labels(self.model_name, finish_reason).inc()
        self._m(self.generation_tokens).inc(new_tokens)
        if ttft_s is not None:
            self._m(self.ttft).observe(ttft_s)
        if tpot_s is not None:
            self._m(self.tpot).observe(tpot_s)
        self._m(self.e2e).observe(e2e_s)
        if plain_estimate_s is not None and decode_s > 0:
            self._m(self.decode_seconds).inc(decode_s)
            self._m(self.plain_estimate_seconds).inc(plain_estimate_s)
            self._m(self.speedup).set(plain_estimate_s / decode_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
