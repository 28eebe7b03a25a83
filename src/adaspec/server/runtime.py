"""What the HTTP layer drives, by its old address: the names below live in their own modules now.

* :mod:`.settings`: ``SpecSettings`` (:class:`adaspec.spec_setting.SpecSetting`), ``PLAIN``, the batch's prefill
  defaults.
* :mod:`.host`: :class:`ModelHost` (the loaded models, engines per setting).
* :mod:`.generation_thread`: :class:`GenerationThread` (the one thread every forward runs on).
* :mod:`.jobs`: :class:`Job` (one request on the generation side), :class:`EngineHandle`,
  :class:`ObservedController`, :func:`speculation_summary`.
* :mod:`.batch_runner`: :class:`BatchRunner` (continuous batching's generation loop).
* :mod:`.admission`: :class:`Scheduler` (the bounded FIFO queue in front of the running slots), ``QueueFull``.
"""

from __future__ import annotations

from adaspec.server.admission import QueueFull, Scheduler
from adaspec.server.batch_runner import BatchRunner
from adaspec.server.generation_thread import GenerationThread
from adaspec.server.host import ModelHost
from adaspec.server.jobs import EngineHandle, Job, ObservedController, speculation_summary
from adaspec.server.settings import DEFAULT_PREFILL_CHUNK, DEFAULT_PREFILL_STEP_MS, PLAIN, SpecSettings
from adaspec.stats import compress_trace

__all__ = ["BatchRunner", "DEFAULT_PREFILL_CHUNK", "DEFAULT_PREFILL_STEP_MS", "EngineHandle", "GenerationThread",
           "Job", "ModelHost", "ObservedController", "PLAIN", "QueueFull", "Scheduler", "SpecSettings",
           "compress_trace", "speculation_summary"]
