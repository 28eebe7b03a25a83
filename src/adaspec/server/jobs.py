"""One request on the generation side, and what it runs on.

* :class:`EngineHandle` is one engine of a speculation setting (built and kept by
  :class:`~adaspec.server.host.ModelHost`).
* :class:`Job` runs ``engine.stream`` (``max_batch`` 1) or receives its row's chunks from the
  :class:`~adaspec.server.batch_runner.BatchRunner`, and hands them to the event loop; setting ``job.cancel``
  (client gone) or passing the deadline stops it after the current step, which frees the slot.
* :class:`ObservedController` wraps an engine's controller to see every step as it happens (live metrics),
  without touching the engine.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from adaspec.backends.prefix_cache import PrefixCacheBackend
from adaspec.controllers import Controller, FixedController, make_controller
from adaspec.drafters import Drafter
from adaspec.engine import GenerationConfig, GenerationResult, SpeculativeEngine, StreamChunk
from adaspec.errors import AdaspecError
from adaspec.server.metrics import ServerMetrics
from adaspec.spec_setting import SpecSetting
from adaspec.stats import GenerationStats, StepRecord, compress_trace

log = logging.getLogger("adaspec.server")


class ObservedController(Controller):
    """Delegates to ``inner`` and reports each step, with the K ``inner`` chose for it, to ``listener``.

    The engine must see ``inner``'s behaviour through it: the hooks the base class defines are forwarded, and
    reading any other attribute (``choose_drafter``, ``calibrate``, ``draft_costs``, ...) gives ``inner``'s own,
    or fails as on ``inner`` (attribute writes and ``isinstance`` see the wrapper). It never asks ``inner`` for a
    decision the engine did not ask for: a goodput controller's decision moves its probe counters, so an extra
    ``next_k()`` per step would change what it does next. The K reported is the controller's choice, not the
    K the step ran at after the engine's clamps (the tokens left, a batch's cap), so a clamp near ``max_tokens``
    is not counted as the controller switching speculation off."""

    def __init__(self, inner: Controller) -> None:
        self.inner = inner
        self.name = inner.name
        self.listener: Callable[[StepRecord, int], None] | None = None
        self.chosen: int | None = None  # what inner.next_k() returned for the step under way

    def __getattr__(self, name: str):
        if name == "inner":  # not set yet (copying, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def next_k(self) -> int:
        self.chosen = self.inner.next_k()
        return self.chosen

    def update(self, step: StepRecord) -> None:
        self.inner.update(step)
        chosen, self.chosen = self.chosen, None
        if self.listener is not None:
            self.listener(step, step.k if chosen is None else chosen)

    def draft_stop(self):
        return self.inner.draft_stop()

    def reset(self) -> None:
        self.inner.reset()

    def set_synced(self, synced, catch_up=None) -> None:
        self.inner.set_synced(synced, catch_up)

    def set_forced(self, n: int) -> None:
        self.inner.set_forced(n)

    def seed_verify_costs(self, curve, context_len: int, *, level_from_steps: bool = True) -> None:
        self.inner.seed_verify_costs(curve, context_len, level_from_steps=level_from_steps)

    def seed_draft_costs(self, costs) -> None:
        self.inner.seed_draft_costs(costs)

    @property
    def planned(self) -> tuple[float, float]:
        return self.inner.planned

    @property
    def routes_drafters(self) -> bool:
        return self.inner.routes_drafters

    def choose_drafter(self, options):
        return self.inner.choose_drafter(options)

    def calibrate(self, backend):
        return self.inner.calibrate(backend)

    def draft_costs(self):
        return self.inner.draft_costs()


@dataclass
class EngineHandle:
    settings: SpecSetting
    engine: SpeculativeEngine
    controller: ObservedController
    drafter_label: str  # the drafter's name in metrics ("none" for plain decoding)
    drafter_for: Callable[[int], Drafter] | None = None  # a batched row's drafter (None: plain decoding)

    def new_controller(self) -> Controller:
        """A fresh controller of this setting (a batched request's own)."""
        if self.settings.plain:
            return FixedController(0)
        return make_controller(self.settings.controller, self.settings.k)


class JobHost(Protocol):
    """What a :class:`Job` reads and updates on its host (:class:`~adaspec.server.host.ModelHost`)."""

    plain_ms: float | None  # a plain decoding step's wall time, ms (None: not measured yet)
    current: Job | None  # the job on the generation thread (``max_batch`` 1)

    def observe_plain_step(self, ms: float) -> None: ...

    def observe_service(self, seconds: float) -> None: ...


@dataclass
class Job:
    """One request on the generation side. Events reach the loop through ``events``: ``("chunk", StreamChunk)``,
    ``("error", exception)``, then always ``("end", None)``; ``on_end`` (if set) runs after the end event is sent,
    on the generation thread."""

    host: JobHost
    handle: EngineHandle
    prompt_ids: list[int]
    config: GenerationConfig
    arrival: float  # time.monotonic() at arrival
    deadline: float  # time.monotonic() after which generation stops
    metrics: ServerMetrics
    loop: asyncio.AbstractEventLoop
    cancel: threading.Event = field(default_factory=threading.Event)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    started: float | None = None
    first_chunk: float | None = None
    finished: float | None = None
    result: GenerationResult | None = None
    error: BaseException | None = None
    outcome: str | None = None
    fallbacks: int = 0
    on_end: Callable[[], None] | None = None
    rid: int | None = None  # the row's request id in the batch (batched mode)
    _prev_k: int | None = None

    def _emit(self, kind: str, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, item))
        except RuntimeError:  # the loop is closed (shutdown)
            pass

    def _on_step(self, step: StepRecord, k: int) -> None:
        """After each step: ``k`` is the draft length the controller chose for it (before the engine's clamps); a
        choice of 0 after one above 0 counts as a fallback."""
        prev = self._prev_k if self._prev_k is not None else k
        if prev > 0 and k == 0:
            self.fallbacks += 1
        self.metrics.step(step, self.handle.drafter_label, k, prev)
        self._prev_k = k
        if step.drafted == 0 and step.batch <= 1:  # the reference for speedup estimates: a plain step alone
            self.host.observe_plain_step(step.total_ms)

    # The pieces of a request's life, shared by run() and the BatchRunner --------------------------------------
    def begin(self) -> None:
        self.started = time.monotonic()
        self.metrics.queued(self.started - self.arrival)

    def stopping(self) -> bool:
        """True (and the outcome set) when the client left or the deadline passed."""
        if self.cancel.is_set():
            self.outcome = "cancelled"
        elif time.monotonic() > self.deadline:
            self.outcome = "timeout"
        else:
            return False
        return True

    def deliver(self, chunk: StreamChunk) -> None:
        if self.first_chunk is None:
            self.first_chunk = time.monotonic()
            self.metrics.prefilled(len(self.prompt_ids))
        if chunk.result is not None:
            self.result = chunk.result
            self.outcome = chunk.result.finish_reason
        self._emit("chunk", chunk)

    def fail(self, error: BaseException) -> None:
        if isinstance(error, AdaspecError):  # e.g. ConfigError / ContextLengthError that slipped past validation
            self.error, self.outcome = error, "invalid"
        else:  # a bug: report it, keep serving
            log.error("generation failed", exc_info=error)
            self.error, self.outcome = error, "error"
        self._emit("error", error)

    def end(self) -> None:
        self.finished = time.monotonic()
        try:
            self._record()
        except Exception:  # metrics must never break the server
            log.exception("recording metrics failed")
        self._emit("end", None)
        if self.on_end is not None:
            self.on_end()

    def run(self) -> None:
        """The generation thread's body (one request at a time): never raises."""
        self.begin()
        self.host.current = self
        self.handle.controller.listener = self._on_step
        try:
            if self.handle.settings.plain:  # a speculative engine's K is set by its steps (no decision asked here)
                self.metrics.speculation_state(0)
            target = self.handle.engine.target
            if isinstance(target, PrefixCacheBackend):  # a prompt reuses the cache of its own key's requests only
                target.owner = self.config.cache_partition
            gen = self.handle.engine.stream(self.prompt_ids, self.config)
            try:
                while not self.stopping():
                    try:
                        chunk = next(gen)
                    except StopIteration:
                        break
                    self.deliver(chunk)
            finally:
                gen.close()
        except Exception as e:
            self.fail(e)
        finally:
            self.handle.controller.listener = None
            self.host.current = None
            self.end()

    def observed_controller(self) -> ObservedController:
        """A fresh controller of this request's setting that reports each step to this job (batched mode)."""
        observed = ObservedController(self.handle.new_controller())
        observed.listener = self._on_step
        return observed

    def _record(self) -> None:
        m = self.metrics
        m.outcome(self.outcome or "error")
        if self.started is not None:
            self.host.observe_service(self.finished - self.started)
        if self.result is None:
            return
        s = self.result.stats
        if isinstance(self.handle.engine.target, PrefixCacheBackend):
            m.prefix_cache(s.prompt_tokens, s.cached_tokens)
        decode_s = sum(st.total_ms for st in s.steps) / 1e3
        m.finished(finish_reason=self.result.finish_reason, prompt_tokens=s.prompt_tokens, new_tokens=s.new_tokens,
                   ttft_s=(self.first_chunk - self.arrival) if self.first_chunk is not None else None,
                   tpot_s=s.tpot_ms / 1e3 if s.new_tokens > 1 else None, e2e_s=self.finished - self.arrival,
                   decode_s=decode_s, plain_estimate_s=self.plain_estimate_ms(s) / 1e3
                   if self.plain_estimate_ms(s) is not None else None)

    def plain_estimate_ms(self, s: GenerationStats) -> float | None:
        if self.host.plain_ms is None:
            return None
        return sum(st.emitted for st in s.steps) * self.host.plain_ms

    @property
    def queue_s(self) -> float:
        return (self.started or time.monotonic()) - self.arrival

    def summary(self) -> dict:
        """This request's speculative statistics, for the response's ``speculation`` field."""
        assert self.result is not None
        return speculation_summary(self.handle.settings, self.handle.drafter_label, self.result.stats,
                                   queue_ms=self.queue_s * 1e3, plain_ms=self.host.plain_ms,
                                   fallbacks=self.fallbacks)


def speculation_summary(settings: SpecSetting, drafter_label: str, s: GenerationStats, *, queue_ms: float,
                        plain_ms: float | None, fallbacks: int) -> dict:
    trace = s.k_trace
    decode_ms = sum(st.total_ms for st in s.steps)
    decode_tokens = sum(st.emitted for st in s.steps)
    speedup = (decode_tokens * plain_ms / decode_ms) if plain_ms and decode_ms > 0 else None
    return {
        "drafter": settings.drafter or "none",
        "drafter_model": drafter_label,
        "controller": settings.controller,
        "k": settings.k,
        "acceptance_rate": round(s.acceptance_rate, 4),
        "mean_accepted_tokens": round(s.mean_accepted_tokens, 4),
        "steps": len(s.steps),
        "speculation_steps": s.speculation_steps,
        "plain_steps": len(s.steps) - s.speculation_steps,
        "draft_tokens": s.draft_tokens,
        "accepted_tokens": s.accepted_tokens,
        "accepted_per_position": list(s.accepted_per_position),
        "k_trace": {
            "compressed": compress_trace(trace),
            "first": trace[0] if trace else None,
            "last": trace[-1] if trace else None,
            "min": min(trace) if trace else None,
            "max": max(trace) if trace else None,
            "mean": round(sum(trace) / len(trace), 3) if trace else None,
            "fallbacks": fallbacks,
        },
        "time_ms": {
            "queue": round(queue_ms, 2),
            "prefill": round(s.prefill_ms, 2),
            "draft": round(s.draft_ms, 2),
            "verify": round(s.verify_ms, 2),
            "other": round(s.other_ms, 2),
            "total": round(s.total_ms, 2),
        },
        "ttft_ms": round(s.ttft_ms, 2),
        "tpot_ms": round(s.tpot_ms, 2),
        "tokens_per_s": round(s.tokens_per_s, 3),
        "plain_step_ms": round(plain_ms, 3) if plain_ms is not None else None,
        "speedup_estimate": round(speedup, 3) if speedup is not None else None,
    }


