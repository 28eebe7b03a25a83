"""What the HTTP layer drives: the loaded model pair, engines per speculation setting, the FIFO queue, and jobs.

* :class:`ModelHost` loads the target once, plus the draft models clients may choose, and keeps one
  :class:`~adaspec.engine.SpeculativeEngine` per speculation setting (drafter, controller, K), all sharing the
  target's backend. With ``max_batch`` 1 one generation runs at a time, on a dedicated thread; the engines never
  run concurrently. With ``max_batch`` > 1 the target (and every draft model) holds ``max_batch`` sequences and a
  :class:`BatchRunner` drives one :class:`~adaspec.batch.BatchEngine` (continuous batching): requests join and
  leave at step boundaries, each with its own drafter and controller.
* :class:`~adaspec.server.admission.Scheduler` (re-exported here) is the bounded FIFO queue in front of the
  ``max_batch`` running slots (event-loop side only).
* :class:`Job` is one request on the generation side: it runs ``engine.stream`` (``max_batch`` 1) or receives its
  row's chunks from the :class:`BatchRunner`, and hands them to the event loop; setting ``job.cancel`` (client
  gone) or passing the deadline stops it after the current step, which frees the slot.
* :class:`ObservedController` wraps an engine's controller to see every step as it happens (live metrics),
  without touching the engine.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import queue
import statistics
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from adaspec.api import LoadedModel, SpeculativeLM, builtin_drafter, load_model, make_drafter, set_threads
from adaspec.backends.select import resolve_device
from adaspec.batch import BatchEngine
from adaspec.controllers import CONTROLLERS, Controller, FixedController, make_controller
from adaspec.defaults import DEFAULT_CONTROLLER
from adaspec.drafters import Drafter
from adaspec.drafters.suffix import is_suffix_spec
from adaspec.engine import GenerationConfig, GenerationResult, SpeculativeEngine, StreamChunk
from adaspec.errors import AdaspecError, ConfigError
from adaspec.server.admission import QueueFull, Scheduler  # noqa: F401  (re-exported)
from adaspec.server.metrics import ServerMetrics
from adaspec.server.suffix_partitions import ServerSuffixCache
from adaspec.stats import GenerationStats, StepRecord, compress_trace

log = logging.getLogger("adaspec.server")

DEFAULT_PREFILL_CHUNK = 64  # prompt tokens per batch step while other rows decode (--prefill-chunk)
DEFAULT_PREFILL_STEP_MS = 750.0  # wall-time budget of a batch step carrying prefill (--prefill-step-ms)


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

    def set_synced(self, synced) -> None:
        self.inner.set_synced(synced)

    def seed_verify_costs(self, curve, context_len: int, *, level_from_steps: bool = True) -> None:
        self.inner.seed_verify_costs(curve, context_len, level_from_steps=level_from_steps)

    def seed_draft_costs(self, costs) -> None:
        self.inner.seed_draft_costs(costs)


@dataclass
class EngineHandle:
    settings: SpecSettings
    engine: SpeculativeEngine
    controller: ObservedController
    drafter_label: str  # the drafter's name in metrics ("none" for plain decoding)
    drafter_for: Callable[[int], Drafter] | None = None  # a batched row's drafter (None: plain decoding)

    def new_controller(self) -> Controller:
        """A fresh controller of this setting (a batched request's own)."""
        if self.settings.plain:
            return FixedController(0)
        return make_controller(self.settings.controller, self.settings.k)


class ModelHost:
    """The loaded target, the drafters clients may pick, and engines per setting.

    Args:
        target: the loaded target model.
        default: the server's default speculation setting (what a request without ``speculation`` gets).
        model_drafters: draft models by every name a client may use for them (built from ``target``).
        dtype, device: used to build ``layerskip:N`` drafters.
        max_engines: engines kept (least recently used ones are dropped beyond this; the default and plain
            engines are rebuilt on demand like any other).
        max_batch: requests decoding together (continuous batching, :class:`BatchRunner`); the target and the
            draft models must hold that many sequences (``max_sequences``). 1: one request at a time.
        prefill_chunk: with ``max_batch`` > 1, prompt tokens prefilled per batch step while other rows decode
            (:class:`~adaspec.batch.BatchEngine`; None: whole prompts).
        prefill_step_ms: with ``max_batch`` > 1, the wall-time budget in ms that sizes those chunks (at most
            ``prefill_chunk``) from the measured cost per token (:class:`~adaspec.batch.BatchEngine`; None: fixed
            chunks).
        max_dynamic_drafters: drafters built on demand for a request's ``speculation.drafter`` (``layerskip:N``,
            ``ngram``) kept at once; the least recently used beyond this are dropped with their engines and
            per-slot draft caches (the drafters loaded at start are always kept).
        suffix_tokens: the size of the suffix cache every suffix drafter shares (:mod:`.suffix_partitions`;
            None: the default drafter's, else 100,000 tokens).

    Raises:
        ConfigError: ``max_batch`` above what the target holds; a suffix drafter of another depth than the
            server's suffix cache.
    """

    def __init__(self, target: LoadedModel, default: SpecSettings, model_drafters: dict[str, Drafter] | None = None,
                 *, max_engines: int = 32, max_batch: int = 1, prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
                 prefill_step_ms: float | None = DEFAULT_PREFILL_STEP_MS, max_dynamic_drafters: int = 4,
                 suffix_tokens: int | None = None) -> None:
        self.target = target
        self.max_batch = max_batch
        self.batch: BatchEngine | None = None
        if max_batch > 1:
            self.batch = BatchEngine(target.backend, max_batch=max_batch, tokenizer=target.tokenizer,
                                     prefill_chunk=prefill_chunk, prefill_step_ms=prefill_step_ms)
        self.runner: BatchRunner | None = None
        self.name = target.name
        self.max_context = target.backend.max_context
        model = getattr(target.backend, "model", None)  # a PyTorch target; None on llama.cpp (no layerskip there)
        self.num_layers = len(model.get_decoder().layers) if model is not None else 0
        self._model_drafters = {k.lower(): v for k, v in (model_drafters or {}).items()}
        self.suffix = ServerSuffixCache(default.drafter, self._model_drafters.get(default.drafter.lower()),
                                        suffix_tokens)
        for drafter in self._model_drafters.values():
            self.suffix.adopt(drafter)
        self._drafters: dict[str, Drafter | None] = {"none": None}
        self._dynamic: OrderedDict[str, Drafter | None] = OrderedDict()  # built on demand, least recently used first
        self.max_dynamic_drafters = max(1, max_dynamic_drafters)
        self._engines: OrderedDict[SpecSettings, EngineHandle] = OrderedDict()
        self.max_engines = max_engines
        self._raw_default = default
        self.default = self.normalise()
        # A private tokenizer copy for request encoding, so the generation thread's tokenizer is never used from
        # two threads at once; encoding is the same code as adaspec.api (SpeculativeLM.encode).
        tok = copy.deepcopy(target.tokenizer)
        self.encoder = SpeculativeLM(LoadedModel(target.backend, tok, target.name), None, FixedController(0))
        self.tokenizer = target.tokenizer
        self.generate_executor = GenerationThread()
        self.encode_executor = ThreadPoolExecutor(1, thread_name_prefix="adaspec-encode")
        self.plain_ms: float | None = None  # EMA of a plain decoding step's wall time
        self.service_s: float | None = None  # EMA of a request's generation time (for Retry-After)
        self.backend = "torch"  # where a draft model a client names is loaded (load() sets the host's)
        self.current: Job | None = None
        self.requested_name = self.name  # the target as the user named it (load() sets it; served by the CLI)

    @classmethod
    def load(cls, target: str, draft: str | None, *, controller: str = DEFAULT_CONTROLLER, k: int | None = None,
             dtype: str | None = None, device: str = "cpu", threads: int | None = None,
             extra_drafters: Sequence[str] = (), progress: bool = True, backend: str = "torch",
             max_batch: int = 1, strict: bool = False, prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
             prefill_step_ms: float | None = DEFAULT_PREFILL_STEP_MS, served_as: str | None = None, suffix_tokens: int | None = None) -> ModelHost:
        """Load the target and every model drafter clients may choose (the default one plus ``extra_drafters``) on
        ``backend``/``device`` (see :func:`adaspec.api.load`; ``adaspec serve`` passes ``auto``), each holding
        ``max_batch`` sequences. With ``max_batch`` > 1 the batch runs in ``strict`` mode or not for every request.

        Raises:
            ConfigError: ``max_batch`` < 1; ``strict`` batching on a runtime whose rows mix (ik_llama.cpp).
        """
        set_threads(threads)
        make_controller(controller, k)  # validate before loading anything heavy
        if max_batch < 1:
            raise ConfigError(f"max_batch must be >= 1, got {max_batch}")
        device = resolve_device(device)
        tgt = load_model(target, backend=backend, dtype=dtype, device=device, progress=progress,
                         max_sequences=max_batch)
        if max_batch > 1:
            if strict and not tgt.backend.rows_independent:
                raise ConfigError(f"--strict with --max-batch {max_batch}: {tgt.name} changes a row's logits with the "
                                  "other rows, so strict mode cannot hold in a batch; use --backend torch, or "
                                  "--max-batch 1")
            if strict and not tgt.backend.supports_batch_invariance:
                raise ConfigError(f"strict mode needs a batch-invariant backend; {tgt.name} has none")
            tgt.backend.batch_invariant = strict
        if tgt.runtime_reason and progress:
            print(f"target runtime: {tgt.runtime_reason}", file=sys.stderr)
        model_drafters: dict[str, Drafter] = {}
        draft = draft or "none"
        for spec in [draft, *extra_drafters]:
            if builtin_drafter(spec) or spec.lower() in model_drafters:
                continue
            drafter = make_drafter(spec, tgt, dtype=dtype, device=device, progress=progress, backend=backend,
                                   max_sequences=max_batch)
            model_drafters[spec.lower()] = drafter
            model_drafters.setdefault(drafter.name.lower(), drafter)
        host = cls(tgt, SpecSettings(draft, controller, k), model_drafters, max_batch=max_batch,
                   prefill_chunk=prefill_chunk, prefill_step_ms=prefill_step_ms, suffix_tokens=suffix_tokens)
        host.backend = backend  # where a draft model a client names later is loaded
        host.requested_name = served_as or target
        return host

    # Settings ----------------------------------------------------------------------------------------------------
    def available_drafters(self) -> list[str]:
        """Drafter specs clients may send (local paths are left out of the list but still accepted)."""
        models = sorted(k for k in self._model_drafters if not os.path.exists(k))
        layerskip = [f"layerskip:N (1 <= N <= {self.num_layers})"] if self.num_layers else []
        return ["none", "ngram", "ngram-tree", "suffix[:KEY=VALUE,...]", *layerskip, *models]

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
        if low in ("none", "ngram", "ngram-tree"):
            spec = low
        elif is_suffix_spec(low):  # every suffix drafter shares the server's cache (.suffix_partitions)
            self.suffix.check(low)
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
        if spec in self._drafters:
            return self._drafters[spec]
        if spec in self._model_drafters:
            self._drafters[spec] = self._model_drafters[spec]
            if self.batch is not None and self._drafters[spec] is not None:  # loaded at start: its per-slot draft
                self.batch.keep_draft_caches.add(self._drafters[spec].for_sequence)  # caches serve the next requests
            return self._drafters[spec]
        if spec in self._dynamic:
            self._dynamic.move_to_end(spec)
            return self._dynamic[spec]
        drafter = make_drafter(spec, self.target, progress=False, backend=self.backend, max_sequences=self.max_batch)
        self.suffix.adopt(drafter)
        if spec == self.default.drafter:  # the server's default drafter is never evicted
            self._drafters[spec] = drafter
            return drafter
        self._dynamic[spec] = drafter
        while len(self._dynamic) > self.max_dynamic_drafters:
            self._evict(*self._dynamic.popitem(last=False))
        return drafter

    def _evict(self, spec: str, drafter: Drafter | None) -> None:
        """Drop an on-demand drafter: its engines and its per-slot drafters in the batch (a row still using one
        keeps it until it ends)."""
        for settings in [s for s in self._engines if s.drafter == spec]:
            del self._engines[settings]
        if self.batch is not None and drafter is not None:
            self.batch.forget_drafters(drafter.for_sequence)

    @property
    def dynamic_drafters(self) -> list[str]:
        """Specs of the on-demand drafters kept now, least recently used first."""
        return list(self._dynamic)

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
        handle = EngineHandle(settings, engine, observed, drafter.name if drafter is not None else "none",
                              drafter.for_sequence if drafter is not None else None)
        self._engines[settings] = handle
        while len(self._engines) > self.max_engines:
            self._engines.popitem(last=False)
        return handle

    # Encoding (on the encode thread) -----------------------------------------------------------------------------
    def encode_text(self, prompt: str) -> list[int]:
        return self.encoder.encode(prompt, chat=False)

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        if not self.encoder.has_chat_template:
            raise ConfigError(f"{self.name} has no chat template; use /v1/completions with a plain prompt")
        return self.encoder.encode(messages, chat=True, tools=tools)

    @property
    def has_chat_template(self) -> bool:
        return self.encoder.has_chat_template

    # Warm-up and the plain-step reference ------------------------------------------------------------------------
    def on_generation_thread(self, fn, *args):
        """Run ``fn(*args)`` on the generation thread and return its result (raising what it raised).

        Every forward of the server's models runs on that one thread, start-up warm-up and calibration included:
        the GGUF runtimes parallelise with OpenMP, whose libgomp gives each thread that starts a parallel region a
        team of its own and, once it manages more threads than there are CPUs, stops spinning between the steps of
        a forward and sleeps on a futex instead. Warming up on the main thread and serving from the generation
        thread left two teams on this 2-core machine and made every plain decoding step about 10 % slower
        (`docs/results/issue15/omp_teams.py`: 0 vs about 30,000 futex sleeps per 96-token request).

        Raises:
            RuntimeError: the batch loop holds the generation thread (after :meth:`start_runner`).
        """
        if threading.current_thread() is self.generate_executor.thread:
            return fn(*args)
        if self.runner is not None:
            raise RuntimeError("the batch loop holds the generation thread: run this before start_runner")
        return self.generate_executor.submit(fn, *args).result()

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

    def calibrate_batch(self) -> dict[int, float]:
        """Measure the target's cost curve for the batch's K cap and the default drafter's draft-model costs
        (:meth:`BatchEngine.calibrate`); returns the curve, ms by tokens."""
        if self.batch is None:
            return {}
        drafter_for = None if self.default.plain else self.engine_for(self.default).drafter_for
        return self.batch.calibrate(drafter_for=drafter_for)

    def start_runner(self, metrics: ServerMetrics) -> BatchRunner:
        """Start the batch's generation thread (``max_batch`` > 1; once)."""
        if self.batch is None:
            raise ConfigError("continuous batching needs max_batch > 1")
        if self.runner is None:
            self.runner = BatchRunner(self.batch, metrics, executor=self.generate_executor)
        return self.runner

    def cancel_current(self) -> None:
        job = self.current
        if job is not None:
            job.cancel.set()
        if self.runner is not None:
            self.runner.cancel_all()

    def shutdown(self) -> None:
        self.cancel_current()
        self.generate_executor.shutdown(wait=False, cancel_futures=True)  # nothing queued runs after this
        if self.runner is not None:
            self.runner.stop()
        self.encode_executor.shutdown(wait=False, cancel_futures=True)


class GenerationThread(Executor):
    """The one thread that runs every forward of a server's models (see :meth:`ModelHost.on_generation_thread`):
    an :class:`~concurrent.futures.Executor` over a single **daemon** thread, so a process that never shuts its
    host down still exits, even while the batch loop holds the thread. Tasks run in submission order."""

    def __init__(self, name: str = "adaspec-generate") -> None:
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def submit(self, fn, /, *args, **kwargs) -> Future:
        if self._closed:
            raise RuntimeError("the generation thread is shut down")
        future: Future = Future()
        self._tasks.put((future, fn, args, kwargs))
        return future

    def _run(self) -> None:
        while True:
            item = self._tasks.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as e:  # handed to whoever waits on the future
                log.exception("a task on the generation thread failed")
                future.set_exception(e)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._closed = True
        if cancel_futures:
            while True:
                try:
                    item = self._tasks.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        self._tasks.put(None)
        if wait and threading.current_thread() is not self.thread:
            self.thread.join()


# --------------------------------------------------------------------------------------------------------------
# One request's generation
# --------------------------------------------------------------------------------------------------------------


@dataclass
class Job:
    """One request on the generation side. Events reach the loop through ``events``: ``("chunk", StreamChunk)``,
    ``("error", exception)``, then always ``("end", None)``; ``on_end`` (if set) runs after the end event is sent,
    on the generation thread."""

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


class BatchRunner:
    """The generation thread of a batched server: jobs join the :class:`~adaspec.batch.BatchEngine` at step
    boundaries, each step's chunks go to their jobs, and a job whose client left (or whose deadline passed) is
    cancelled before the next step without touching the other rows. A row that fails ends its own job only.

    Thread-safe entry points: :meth:`submit`, :meth:`cancel_all`, :meth:`stop`.
    """

    def __init__(self, engine: BatchEngine, metrics: ServerMetrics, executor: Executor | None = None) -> None:
        self.engine = engine
        self.metrics = metrics
        self._inbox: deque[Job] = deque()
        self._jobs: dict[int, Job] = {}
        self._admitting: list[Job] = []
        self._lock = threading.Lock()  # guards _inbox, _admitting and _jobs (cancel_all runs on the event loop)
        self._wake = threading.Event()
        self._stopped = False
        self._last_step_end = 0.0  # time.monotonic() at the end of the last step (the debug trace)
        if executor is not None:  # the host's generation thread, where warm-up ran (see on_generation_thread)
            self._done = executor.submit(self._loop)
        else:
            thread = threading.Thread(target=self._loop, name="adaspec-batch", daemon=True)
            thread.start()
            self._done = thread

    @property
    def running(self) -> int:
        return len(self._jobs)

    def submit(self, job: Job) -> None:
        with self._lock:
            self._inbox.append(job)
        self._wake.set()

    def cancel_all(self) -> None:
        with self._lock:
            jobs = list(self._inbox) + self._admitting + list(self._jobs.values())
        for job in jobs:
            job.cancel.set()
        self._wake.set()

    def stop(self) -> None:
        self.cancel_all()
        self._stopped = True
        self._wake.set()
        if isinstance(self._done, threading.Thread):
            self._done.join(timeout=10)
        else:
            try:
                self._done.result(timeout=10)
            except BaseException:  # a timeout, or the loop's own failure (logged where it ran): stopping goes on
                log.warning("the batch loop did not end cleanly", exc_info=True)

    def _loop(self) -> None:
        while not (self._stopped and not self._jobs):
            try:
                self._iterate()
            except Exception as e:  # never let the generation thread die: end every running request, go on
                log.exception("batch runner failed")
                with self._lock:
                    jobs, self._jobs = dict(self._jobs), {}
                for rid, job in jobs.items():
                    try:
                        self.engine.cancel(rid)
                    except Exception:
                        pass
                    try:
                        job.fail(e)
                        job.end()
                    except Exception:
                        log.exception("could not end a request")

    def _iterate(self) -> None:
        """Admit, reap, then one batched step (or wait for work)."""
        self._admit()
        self._reap()
        if self._stopped and not self._jobs:
            return
        if not self.engine:
            self._wake.wait()
            self._wake.clear()
            return
        try:
            out = self.engine.step()
        except Exception as e:  # a bug outside any one row: end every running request, keep serving
            log.exception("batch step failed")
            for rid in list(self._jobs):
                self.engine.cancel(rid)
                self._finish(rid, error=e)
            return
        if self.engine.last_rows:
            e = self.engine
            self.metrics.batch_step(e.last_rows, e.last_tokens, e.last_forward_ms / 1e3,
                                    sum(len(c.token_ids) for c in out.values()), step_s=e.last_step_ms / 1e3,
                                    prefill_tokens=e.last_prefill_tokens, shared_tokens=e.last_shared_tokens)
            if log.isEnabledFor(logging.DEBUG):  # a trace of every step: where a stream's gaps come from
                now = time.monotonic()
                log.debug("batch step ended at %.3f: %.0f ms (forward %.0f ms, %d rows, %d tokens, %d prefilled, "
                          "%d shared), %.0f ms since the last step ended; emitted (tokens, characters) %s", now, e.last_step_ms,
                          e.last_forward_ms, e.last_rows, e.last_tokens, e.last_prefill_tokens, e.last_shared_tokens,
                          (now - self._last_step_end) * 1e3 if self._last_step_end else 0.0,
                          {rid: (len(c.token_ids), len(c.text)) for rid, c in out.items()})
                self._last_step_end = now
        for rid, chunk in out.items():
            job = self._jobs.get(rid)
            if job is None:
                continue
            if chunk.error is not None:
                self._finish(rid, error=chunk.error)
                continue
            job.deliver(chunk)
            if chunk.result is not None:
                self._finish(rid)

    def _admit(self) -> None:
        with self._lock:  # jobs being admitted stay visible to cancel_all (neither in the inbox nor in _jobs yet)
            jobs, self._inbox = list(self._inbox), deque()
            self._admitting = jobs
        try:
            self._admit_jobs(jobs)
        finally:
            with self._lock:
                self._admitting = []

    def _admit_jobs(self, jobs: list[Job]) -> None:
        for job in jobs:
            job.begin()
            try:
                job.rid = self.engine.add(job.prompt_ids, job.config, drafter_for=job.handle.drafter_for,
                                          controller_factory=job.observed_controller)
            except Exception as e:  # refused (e.g. strict asked of a non-strict batch): this job only
                job.fail(e)
                job.end()
                continue
            with self._lock:  # cancel_all reads it from the event-loop thread
                self._jobs[job.rid] = job

    def _reap(self) -> None:
        for rid, job in list(self._jobs.items()):
            if job.stopping():
                self.engine.cancel(rid)
                self._finish(rid, outcome=job.outcome)

    def _finish(self, rid: int, *, error: BaseException | None = None, outcome: str | None = None) -> None:
        with self._lock:
            job = self._jobs.pop(rid)
        if error is not None:
            job.fail(error)
        elif outcome is not None:
            job.outcome = outcome
        job.end()


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


