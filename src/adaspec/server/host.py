"""The loaded model pair and its engines: :class:`ModelHost`.

:class:`ModelHost` loads the target once, plus the draft models clients may choose, and keeps one
:class:`~adaspec.engine.SpeculativeEngine` per speculation setting (drafter, controller, K), all sharing the
target's backend. With ``max_batch`` 1 one generation runs at a time, on a dedicated thread
(:class:`~adaspec.server.generation_thread.GenerationThread`); the engines never run concurrently. With
``max_batch`` > 1 the target (and every draft model) holds ``max_batch`` sequences and a
:class:`~adaspec.server.batch_runner.BatchRunner` drives one :class:`~adaspec.batch.BatchEngine` on that thread.
"""

from __future__ import annotations

import copy
import os
import statistics
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from adaspec.api import LoadedModel, SpeculativeLM, load_model, make_drafter, set_threads
from adaspec.backends.prefix_cache import PrefixCacheBackend
from adaspec.backends.select import resolve_device
from adaspec.batch import BatchEngine
from adaspec.controllers import FixedController, make_controller
from adaspec.defaults import DEFAULT_CONTROLLER, DEFAULT_DRAFT_CATCH_UP
from adaspec.drafters import Drafter
from adaspec.drafters.model import check_catch_up
from adaspec.drafters.suffix import is_suffix_spec
from adaspec.engine import GenerationConfig, SpeculativeEngine
from adaspec.request import check_logit_bias
from adaspec.errors import ConfigError
from adaspec.server.batch_runner import BatchRunner
from adaspec.server.generation_thread import GenerationThread
from adaspec.server.jobs import EngineHandle, Job, ObservedController
from adaspec.server.metrics import ServerMetrics
from adaspec.server.settings import DEFAULT_PREFILL_CHUNK, DEFAULT_PREFILL_STEP_MS, DEFAULT_PREFIX_CACHE_BYTES
from adaspec.server.suffix_partitions import ServerSuffixCache
from adaspec.spec_setting import BUILTIN_LOOKUPS, PLAIN, SpecSetting, builtin_drafter, layerskip_layers, validate
from adaspec.structured.constraint import Constraint


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
        prefix_cache: with ``max_batch`` 1, keep the target's cache between requests and prefill only the part of a
            prompt it does not share with the sequence before (:class:`~adaspec.backends.prefix_cache.PrefixCacheBackend`;
            strict-mode requests prefill cold).
        prefix_cache_bytes: with ``prefix_cache``, host memory in bytes for copies of earlier sequences, so that
            interleaved sessions each find their own prefix (0: the sequence before only).

    Raises:
        ConfigError: ``max_batch`` above what the target holds; a suffix drafter of another depth than the
            server's suffix cache.
    """

    def __init__(self, target: LoadedModel, default: SpecSetting, model_drafters: dict[str, Drafter] | None = None,
                 *, max_engines: int = 32, max_batch: int = 1, prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
                 prefill_step_ms: float | None = DEFAULT_PREFILL_STEP_MS, max_dynamic_drafters: int = 4,
                 suffix_tokens: int | None = None, prefix_cache: bool = True,
                 prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES) -> None:
        self.loaded = target  # as loaded: drafters are built from it
        # one request at a time: a prompt prefills only what it does not share with an earlier sequence
        self.target = replace(target, backend=PrefixCacheBackend(target.backend, strict_cold=True,
                                                                 store_bytes=prefix_cache_bytes)) \
            if prefix_cache and max_batch == 1 else target
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
        default_drafter = default.drafter or "none"
        self.suffix = ServerSuffixCache(default_drafter, self._model_drafters.get(default_drafter.lower()),
                                        suffix_tokens)
        for drafter in self._model_drafters.values():
            self.suffix.adopt(drafter)
        self._drafters: dict[str, Drafter | None] = {}  # loaded at start, or the default (never evicted)
        self._dynamic: OrderedDict[str, Drafter | None] = OrderedDict()  # built on demand, least recently used first
        self.max_dynamic_drafters = max(1, max_dynamic_drafters)
        self._engines: OrderedDict[SpecSetting, EngineHandle] = OrderedDict()
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
        self.draft_catch_up = DEFAULT_DRAFT_CATCH_UP  # such a draft model's bounded catch-up (load() sets the host's)
        self.current: Job | None = None
        self.requested_name = self.name  # the target as the user named it (load() sets it; served by the CLI)

    @classmethod
    def load(cls, target: str, draft: str | None, *, controller: str = DEFAULT_CONTROLLER, k: int | None = None,
             dtype: str | None = None, device: str = "cpu", threads: int | None = None,
             extra_drafters: Sequence[str] = (), progress: bool = True, backend: str = "torch",
             max_batch: int = 1, strict: bool = False, prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
             prefill_step_ms: float | None = DEFAULT_PREFILL_STEP_MS, served_as: str | None = None,
             suffix_tokens: int | None = None, prefix_cache: bool = True,
             prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
             draft_catch_up: int | None = DEFAULT_DRAFT_CATCH_UP) -> ModelHost:
        """Load the target and every model drafter clients may choose (the default one plus ``extra_drafters``) on
        ``backend``/``device`` (see :func:`adaspec.api.load`; ``adaspec serve`` passes ``auto``), each holding
        ``max_batch`` sequences. With ``max_batch`` > 1 the batch runs in ``strict`` mode or not for every request.
        A draft model, loaded now or on a request's demand, feeds at most ``draft_catch_up`` tokens at once
        (:func:`adaspec.api.make_drafter`).

        Raises:
            ConfigError: ``max_batch`` < 1; ``strict`` batching on a runtime whose rows mix (ik_llama.cpp).
        """
        set_threads(threads)
        validate(draft, controller, k)  # before loading anything heavy
        check_catch_up(draft_catch_up)
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
                                   max_sequences=max_batch, catch_up=draft_catch_up)
            model_drafters[spec.lower()] = drafter
            model_drafters.setdefault(drafter.name.lower(), drafter)
        host = cls(tgt, SpecSetting(draft, controller, k), model_drafters, max_batch=max_batch,
                   prefill_chunk=prefill_chunk, prefill_step_ms=prefill_step_ms, suffix_tokens=suffix_tokens,
                   prefix_cache=prefix_cache, prefix_cache_bytes=prefix_cache_bytes)
        host.backend = backend  # where a draft model a client names later is loaded
        host.draft_catch_up = draft_catch_up
        host.requested_name = served_as or target
        return host

    # Settings ----------------------------------------------------------------------------------------------------
    def available_drafters(self) -> list[str]:
        """Drafter specs clients may send (local paths are left out of the list but still accepted)."""
        models = sorted(k for k in self._model_drafters if not os.path.exists(k))
        layerskip = [f"layerskip:N (1 <= N <= {self.num_layers})"] if self.num_layers else []
        return ["none", *BUILTIN_LOOKUPS, "suffix[:KEY=VALUE,...]", *layerskip, *models]

    def normalise(self, drafter: str | None = None, controller: str | None = None,
                  k: int | None = None) -> SpecSetting:
        """Validate a (partial) setting against this server; fields left as None take the server's defaults.

        Raises:
            ConfigError: an unknown drafter or controller, or an invalid K (the message lists the choices).
        """
        raw = self._raw_default
        spec = ((raw.drafter or "none") if drafter is None else drafter).strip()
        controller = raw.controller if controller is None else controller
        k = raw.k if k is None else k
        low = spec.lower()
        n = layerskip_layers(spec)
        if low in ("none", *BUILTIN_LOOKUPS):
            spec = low
        elif is_suffix_spec(low):  # every suffix drafter shares the server's cache (.suffix_partitions)
            self.suffix.check(low)
            spec = low
        elif n is not None:
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
        setting = validate(spec, controller, k)
        return PLAIN if setting.plain or k == 0 else setting

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
        drafter = make_drafter(spec, self.loaded, progress=False, backend=self.backend, max_sequences=self.max_batch,
                               catch_up=self.draft_catch_up)
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

    def engine_for(self, settings: SpecSetting) -> EngineHandle:
        """The engine for ``settings`` (built on first use; event-loop thread only)."""
        handle = self._engines.get(settings)
        if handle is not None:
            self._engines.move_to_end(settings)
            return handle
        drafter = None if settings.plain else self._drafter(settings.drafter)
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

    # Request checks and per-request state (event-loop or encode thread) ------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Token ids the target accepts (0 to ``vocab_size`` - 1)."""
        return self.target.backend.vocab_size

    def check_config(self, cfg: GenerationConfig) -> None:
        """The engine's own checks of ``cfg`` that need no model run (the logit bias's token ids), so a request
        fails before it takes a place in the queue.

        Raises:
            ConfigError: ``cfg.logit_bias`` names a token id outside the target's vocabulary.
        """
        check_logit_bias(cfg, self.target.backend)

    def set_max_scored_rows(self, rows: int) -> None:
        """Positions whose logits one batch step keeps for prompt scoring (``max_batch`` > 1; no-op otherwise)."""
        if self.batch is not None:
            self.batch.max_scored_rows = rows

    def compile_constraint(self, handle: EngineHandle, constraint: Constraint) -> None:
        """Compile ``constraint`` (cached by constraint; on the encode thread) and share the vocabulary and its
        compiled grammars with the engine that will run it: ``handle``'s (``max_batch`` 1) or the batch engine
        (``max_batch`` > 1, where each row keeps its own grammar state).

        Raises:
            ConfigError: the constraint does not compile.
            TriggerUnavailable: a lazy constraint's trigger is not a special token of this vocabulary.
        """
        self.encoder.engine.compile(constraint)
        vocab = self.encoder.engine.grammar_vocab  # one vocabulary and grammar cache per model
        handle.engine.grammar_vocab = vocab
        if self.batch is not None:
            self.batch.grammar_vocab = vocab

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
