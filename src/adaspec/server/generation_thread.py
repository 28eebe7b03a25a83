"""The generation thread: one daemon thread, in submission order, for every forward of a server's models."""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Executor, Future

log = logging.getLogger("adaspec.server")


class GenerationThread(Executor):
    """The one thread that runs every forward of a server's models (see
    :meth:`~adaspec.server.host.ModelHost.on_generation_thread`): an :class:`~concurrent.futures.Executor` over a
    single **daemon** thread, so a process that never shuts its host down still exits, even while the batch loop
    holds the thread. Tasks run in submission order."""

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
