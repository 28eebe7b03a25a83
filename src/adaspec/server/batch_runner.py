"""The generation thread of a batched server (``max_batch`` > 1): :class:`BatchRunner` drives one
:class:`~adaspec.batch.BatchEngine` (continuous batching); requests join and leave at step boundaries, each with its
own drafter and controller."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Executor

from adaspec.batch import BatchEngine
from adaspec.server.jobs import Job
from adaspec.server.metrics import ServerMetrics

log = logging.getLogger("adaspec.server")


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
