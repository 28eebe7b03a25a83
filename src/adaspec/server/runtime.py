"""What the HTTP layer drives: the loaded model pair, engines per speculation setting, the FIFO queue, and jobs.

* :class:`ModelHost` loads the target once, plus the draft models clients may choose, and keeps one
  :class:`~adaspec.engine.SpeculativeEngine` per speculation setting (drafter, controller, K), all sharing the
  target's backend. One generation runs at a time, on a dedicated thread; the engines never run concurrently.
* :class:`Scheduler` is the bounded FIFO queue in front of that thread (event-loop side only).
* :class:`Job` runs one request's ``engine.stream`` on the generation thread and hands its chunks to the event
  loop; setting ``job.cancel`` (client gone) or passing the deadline stops it after the current step, which frees
  the slot.
* :class:`ObservedController` wraps an engine's controller to see every step as it happens (live metrics),
  without touching the engine.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import statistics
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from adaspec.api import LoadedModel, SpeculativeLM, builtin_drafter, load_model, make_drafter, set_threads
from adaspec.backends.select import resolve_device
from adaspec.controllers import CONTROLLERS, Controller, FixedController, make_controller
from adaspec.defaults import DEFAULT_CONTROLLER
from adaspec.drafters import Drafter
from adaspec.engine import GenerationConfig, GenerationResult, SpeculativeEngine
from adaspec.errors import AdaspecError, ConfigError
from adaspec.server.metrics import ServerMetrics
from adaspec.stats import GenerationStats, StepRecord, compress_trace

log = logging.getLogger("adaspec.server")


# --------------------------------------------------------------------------------------------------------------
# Speculation settings and engines
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpecSettings:
    """A normalised speculation setting: the key of an engine. Plain decoding is always ('none', 'fixed', 0)."""

    drafter: str
    controller: str
    k: int | None

    @property
    def plain(self) -> bool:
        return self.drafter == "none"

    def as_dict(self) -> dict:
        return {"drafter": self.drafter, "controller": self.controller, "k": self.k}


PLAIN = SpecSettings("none", "fixed", 0)


class ObservedController(Controller):
    """Delegates to ``inner`` and reports each step, with the K chosen for the next one, to ``listener``."""

    def __init__(self, inner: Controller) -> None:
        self.inner = inner
        self.name = inner.name
        self.listener: Callable[[StepRecord, int], None] | None = None

    def next_k(self) -> int:
        return self.inner.next_k()

    def update(self, step: StepRecord) -> None:
        self.inner.update(step)
        if self.listener is not None:
            self.listener(step, self.inner.next_k())

    def draft_stop(self):
        return self.inner.draft_stop()

    def reset(self) -> None:
        self.inner.reset()


@dataclass
class EngineHandle:
    settings: SpecSettings
    engine: SpeculativeEngine
    controller: ObservedController
    drafter_label: str  # the drafter's name in metrics ("none" for plain decoding)


class ModelHost:
    """The loaded target, the drafters clients may pick, and engines per setting.

    Args:
        target: the loaded target model.
        default: the server's default speculation setting (what a request without ``speculation`` gets).
        model_drafters: draft models by every name a client may use for them (built from ``target``).
        dtype, device: used to build ``layerskip:N`` drafters.
        max_engines: engines kept (least recently used ones are dropped beyond this; the default and plain
            engines are rebuilt on demand like any other).
    """

    def __init__(self, target: LoadedModel, default: SpecSettings, model_drafters: dict[str, Drafter] | None = None,
                 *, max_engines: int = 32) -> None:
        self.target = target
        self.name = target.name
        self.max_context = target.backend.max_context
        model = getattr(target.backend, "model", None)  # a PyTorch target; None on llama.cpp (no layerskip there)
        self.num_layers = len(model.get_decoder().layers) if model is not None else 0
        self._model_drafters = {k.lower(): v for k, v in (model_drafters or {}).items()}
        self._drafters: dict[str, Drafter | None] = {"none": None}
        self._engines: OrderedDict[SpecSettings, EngineHandle] = OrderedDict()
        self.max_engines = max_engines
        self._raw_default = default
        self.default = self.normalise()
        # A private tokenizer copy for request encoding, so the generation thread's tokenizer is never used from
        # two threads at once; encoding is the same code as adaspec.api (SpeculativeLM.encode).
        tok = copy.deepcopy(target.tokenizer)
        self.encoder = SpeculativeLM(LoadedModel(target.backend, tok, target.name), None, FixedController(0))
        self.tokenizer = target.tokenizer
        self.generate_executor = ThreadPoolExecutor(1, thread_name_prefix="adaspec-generate")
        self.encode_executor = ThreadPoolExecutor(1, thread_name_prefix="adaspec-encode")
        self.plain_ms: float | None = None  # EMA of a plain decoding step's wall time
        self.service_s: float | None = None  # EMA of a request's generation time (for Retry-After)
        self.backend = "torch"  # where a draft model a client names is loaded (load() sets the host's)
        self.current: Job | None = None

    @classmethod
    def load(cls, target: str, draft: str | None, *, controller: str = DEFAULT_CONTROLLER, k: int | None = None,
             dtype: str | None = None, device: str = "cpu", threads: int | None = None,
             extra_drafters: Sequence[str] = (), progress: bool = True, backend: str = "torch") -> ModelHost:
        """Load the target and every model drafter clients may choose (the default one plus ``extra_drafters``) on
        ``backend``/``device`` (see :func:`adaspec.api.load`; ``adaspec serve`` passes ``auto``)."""
        set_threads(threads)
        make_controller(controller, k)  # validate before loading anything heavy
        device = resolve_device(device)
        tgt = load_model(target, backend=backend, dtype=dtype, device=device, progress=progress)
        if tgt.runtime_reason and progress:
            print(f"target runtime: {tgt.runtime_reason}", file=sys.stderr)
        model_drafters: dict[str, Drafter] = {}
        draft = draft or "none"
        for spec in [draft, *extra_drafters]:
            if builtin_drafter(spec) or spec.lower() in model_drafters:
                continue
            drafter = make_drafter(spec, tgt, dtype=dtype, device=device, progress=progress, backend=backend)
            model_drafters[spec.lower()] = drafter
            model_drafters.setdefault(drafter.name.lower(), drafter)
        host = cls(tgt, SpecSettings(draft, controller, k), model_drafters)
        host.backend = backend  # where a draft model a client names later is loaded
        return host

    # Settings ----------------------------------------------------------------------------------------------------
    def available_drafters(self) -> list[str]:
        """Drafter specs clients may send (local paths are left out of the list but still accepted)."""
        models = sorted(k for k in self._model_drafters if not os.path.exists(k))
        layerskip = [f"layerskip:N (1 <= N <= {self.num_layers})"] if self.num_layers else []
        return ["none", "ngram", *layerskip, *models]

    def normalise(self, drafter: str | None = None, controller: str | None = None,
                  k: int | None = None) -> SpecSettings:
        """Validate a (partial) setting against this server; fields left as None take the server's defaults.

        Raises:
            ConfigError: an unknown drafter or controller, or an invalid K (the message lists the choices).
        """
        raw = self._raw_default
        spec = (raw.drafter if drafter is None else drafter).strip()
        controller = raw.controller if controller is None else controller
        k = raw.k if k is None else k
        low = spec.lower()
        if low in ("none", "ngram"):
            spec = low
        elif low.startswith("layerskip:"):
            try:
                n = int(low.split(":", 1)[1])
            except ValueError:
                raise ConfigError(f"expected layerskip:N with an integer N, got {spec!r}") from None
            if not 1 <= n <= self.num_layers:
                if not self.num_layers:
                    raise ConfigError(f"layerskip drafting needs a PyTorch target; {self.name} runs on a GGUF runtime "
                                      "(start the server with --backend torch)")
                raise ConfigError(f"layerskip:N needs 1 <= N <= {self.num_layers} for {self.name}, got {n}")
            spec = f"layerskip:{n}"
        elif low in self._model_drafters:
            spec = low
        else:
            raise ConfigError(f"drafter {spec!r} is not available on this server; choose one of: "
                              + ", ".join(self.available_drafters()))
        if controller not in CONTROLLERS:
            raise ConfigError(f"unknown controller {controller!r}; choose one of {', '.join(CONTROLLERS)}")
        make_controller(controller, k)  # validates K
        if spec == "none" or k == 0:
            return PLAIN
        return SpecSettings(spec, controller, k)

    def _drafter(self, spec: str) -> Drafter | None:
        if spec not in self._drafters:
            if spec in self._model_drafters:
                self._drafters[spec] = self._model_drafters[spec]
            else:
                self._drafters[spec] = make_drafter(spec, self.target, progress=False, backend=self.backend)
        return self._drafters[spec]

    def engine_for(self, settings: SpecSettings) -> EngineHandle:
        """The engine for ``settings`` (built on first use; event-loop thread only)."""
        handle = self._engines.get(settings)
        if handle is not None:
            self._engines.move_to_end(settings)
            return handle
        drafter = self._drafter(settings.drafter)
        if drafter is None:
            engine = SpeculativeEngine(self.target.backend, None, None, tokenizer=self.tokenizer)
        else:
            engine = SpeculativeEngine(self.target.backend, drafter, make_controller(settings.controller, settings.k),
                                       tokenizer=self.tokenizer)
        observed = ObservedController(engine.controller)
        engine.controller = observed
        handle = EngineHandle(settings, engine, observed, drafter.name if drafter is not None else "none")
        self._engines[settings] = handle
        while len(self._engines) > self.max_engines:
            self._engines.popitem(last=False)
        return handle

    # Encoding (on the encode thread) -----------------------------------------------------------------------------
    def encode_text(self, prompt: str) -> list[int]:
        return self.encoder.encode(prompt, chat=False)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        if not self.encoder.has_chat_template:
            raise ConfigError(f"{self.name} has no chat template; use /v1/completions with a plain prompt")
        return self.encoder.encode(messages, chat=True)

    @property
    def has_chat_template(self) -> bool:
        return self.encoder.has_chat_template

    # Warm-up and the plain-step reference ------------------------------------------------------------------------
    def warmup(self, steps: int = 8) -> None:
        """Run the default engine once, and plain decoding for ``steps`` tokens to measure a plain step's time."""
        ids = list(range(1, 9))
        self.engine_for(self.default).engine.warmup()
        plain = self.engine_for(PLAIN).engine
        cfg = GenerationConfig(max_new_tokens=steps + 1, ignore_eos=True, seed=0, temperature=0.0)
        plain.generate(ids, cfg)  # first run allocates
        result = plain.generate(ids, cfg)
        times = [s.total_ms for s in result.stats.steps if s.drafted == 0]
        if times:
            self.plain_ms = statistics.median(times)

    def observe_plain_step(self, ms: float) -> None:
        self.plain_ms = ms if self.plain_ms is None else 0.9 * self.plain_ms + 0.1 * ms

    def observe_service(self, seconds: float) -> None:
        self.service_s = seconds if self.service_s is None else 0.8 * self.service_s + 0.2 * seconds

    def cancel_current(self) -> None:
        job = self.current
        if job is not None:
            job.cancel.set()

    def shutdown(self) -> None:
        self.cancel_current()
        self.generate_executor.shutdown(wait=False, cancel_futures=True)
        self.encode_executor.shutdown(wait=False, cancel_futures=True)


# --------------------------------------------------------------------------------------------------------------
# The queue
# --------------------------------------------------------------------------------------------------------------


class QueueFull(Exception):
    """The wait queue is full."""


class Scheduler:
    """One running slot and a bounded FIFO of waiters. Event-loop thread only (no locks needed).

    ``reserve()`` returns a future that resolves when the caller holds the slot (at once when idle), or raises
    :class:`QueueFull` when ``max_waiting`` requests already wait. The holder calls ``release()`` exactly once;
    a waiter that gives up calls ``abandon(ticket)`` (which releases if the slot had just been handed over).
    """

    def __init__(self, max_waiting: int) -> None:
        if max_waiting < 0:
            raise ConfigError(f"max queue must be >= 0, got {max_waiting}")
        self.max_waiting = max_waiting
        self.busy = False
        self._waiters: deque[asyncio.Future] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def running(self) -> int:
        return 1 if self.busy else 0

    def reserve(self) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        if not self.busy and not self._waiters:
            self.busy = True
            fut.set_result(None)
            return fut
        if len(self._waiters) >= self.max_waiting:
            raise QueueFull
        self._waiters.append(fut)
        return fut

    def release(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the slot passes straight to the next waiter
                return
        self.busy = False

    def abandon(self, ticket: asyncio.Future) -> None:
        if ticket.done() and not ticket.cancelled():
            self.release()  # it had been handed the slot
            return
        try:
            self._waiters.remove(ticket)
        except ValueError:
            pass
        ticket.cancel()


# --------------------------------------------------------------------------------------------------------------
# One request's generation
# --------------------------------------------------------------------------------------------------------------


@dataclass
class Job:
    """One request on the generation thread. Events reach the loop through ``events``: ``("chunk", StreamChunk)``,
    ``("error", exception)``, then always ``("end", None)``."""

    host: ModelHost
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
    _prev_k: int | None = None

    def _emit(self, kind: str, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, item))
        except RuntimeError:  # the loop is closed (shutdown)
            pass

    def _on_step(self, step: StepRecord, next_k: int) -> None:
        prev = self._prev_k if self._prev_k is not None else step.k
        if prev > 0 and next_k == 0:
            self.fallbacks += 1
        self.metrics.step(step, self.handle.drafter_label, next_k, prev)
        self._prev_k = next_k
        if step.drafted == 0:
            self.host.observe_plain_step(step.total_ms)

    def run(self) -> None:
        """The generation thread's body: never raises."""
        self.started = time.monotonic()
        self.host.current = self
        self.handle.controller.listener = self._on_step
        self.metrics.queued(self.started - self.arrival)
        try:
            self.metrics.speculation_state(self.handle.controller.next_k() if not self.handle.settings.plain else 0)
            gen = self.handle.engine.stream(self.prompt_ids, self.config)
            try:
                while True:
                    if self.cancel.is_set():
                        self.outcome = "cancelled"
                        break
                    if time.monotonic() > self.deadline:
                        self.outcome = "timeout"
                        break
                    try:
                        chunk = next(gen)
                    except StopIteration:
                        break
                    if self.first_chunk is None:
                        self.first_chunk = time.monotonic()
                        self.metrics.prefilled(len(self.prompt_ids))
                    if chunk.result is not None:
                        self.result = chunk.result
                        self.outcome = chunk.result.finish_reason
                    self._emit("chunk", chunk)
            finally:
                gen.close()
        except AdaspecError as e:  # e.g. ConfigError / ContextLengthError that slipped past validation
            self.error, self.outcome = e, "invalid"
            self._emit("error", e)
        except Exception as e:  # a bug: report it, keep serving
            log.exception("generation failed")
            self.error, self.outcome = e, "error"
            self._emit("error", e)
        finally:
            self.handle.controller.listener = None
            self.finished = time.monotonic()
            self.host.current = None
            try:
                self._record()
            except Exception:  # metrics must never break the server
                log.exception("recording metrics failed")
            self._emit("end", None)

    def _record(self) -> None:
        m = self.metrics
        m.outcome(self.outcome or "error")
        if self.started is not None:
            self.host.observe_service(self.finished - self.started)
        if self.result is None:
            return
        s = self.result.stats
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


def speculation_summary(settings: SpecSettings, drafter_label: str, s: GenerationStats, *, queue_ms: float,
                        plain_ms: float | None, fallbacks: int) -> dict:
    trace = s.k_trace
    decode_ms = sum(st.total_ms for st in s.steps)
    decode_tokens = sum(st.emitted for st in s.steps)
    speedup = (decode_tokens * plain_ms / decode_ms) if plain_ms and decode_ms > 0 else None
    return {
        "drafter": settings.drafter,
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


