"""A serving engine as a child process: start it, wait until it answers, watch it, stop it, and say why it failed.

The server's stdout and stderr go to a log file (appended: a restart keeps the earlier run's lines). Readiness is
``GET /v1/models`` answering 200 (vLLM and llama-server both serve it once the model is loaded; llama-server
answers 503 while loading). A server that exits before it is ready, or does not become ready in time, raises
:class:`EngineError` with the log's last lines; :meth:`EngineProcess.check` does the same for a server that died
while it was being measured.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from adaspec.errors import AdaspecError


class EngineError(AdaspecError):
    """A serving engine failed to start, exited while in use, or answered with server errors. ``log_tail`` holds
    the last lines of its log."""

    def __init__(self, message: str, log_tail: str = ""):
        super().__init__(message + (f"\n--- last lines of the engine's log ---\n{log_tail}" if log_tail else ""))
        self.log_tail = log_tail


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a text file ("" when it does not exist)."""
    try:
        with Path(path).open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class EngineProcess:
    """One server process. ``argv``/``env`` come from :mod:`adaspec.engines.vllm_server` or
    :mod:`adaspec.engines.llama_server`; ``url`` is ``http://127.0.0.1:PORT``. Use as a context manager (stops the
    server on exit, also after an error)."""

    def __init__(self, name: str, argv: Sequence[str], url: str, log: Path, *, env: dict | None = None,
                 startup_timeout_s: float = 900.0):
        self.name, self.argv, self.url, self.log = name, list(argv), url, Path(log)
        self.env, self.startup_timeout_s = env, startup_timeout_s
        self.proc: subprocess.Popen | None = None
        self.ready_s: float | None = None

    def start(self) -> EngineProcess:
        """Start the server and wait until ``/v1/models`` answers 200.

        Raises:
            EngineError: the program is missing, the port is taken, the server exited, or it was not ready within
                ``startup_timeout_s`` (then it is stopped).
        """
        self.log.parent.mkdir(parents=True, exist_ok=True)
        if _answers(self.url):
            raise EngineError(f"{self.name}: something already answers at {self.url}; stop it or use another port")
        with self.log.open("ab") as f:
            f.write(f"\n=== adaspec: starting {self.name}: {' '.join(self.argv)}\n".encode())
            f.flush()
            try:
                self.proc = subprocess.Popen(self.argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             env={**os.environ, **(self.env or {})}, start_new_session=True)
            except OSError as e:
                raise EngineError(f"{self.name}: cannot run {self.argv[0]} ({e})") from None
        t0 = time.monotonic()
        try:
            while time.monotonic() - t0 < self.startup_timeout_s:
                if self.proc.poll() is not None:
                    raise EngineError(f"{self.name} exited with status {self.proc.returncode} before it was ready",
                                      tail(self.log))
                if _answers(self.url):
                    self.ready_s = time.monotonic() - t0
                    return self
                time.sleep(1.0)
        except BaseException:  # Ctrl-C while waiting: never leave a half-started server behind
            self.stop()
            raise
        self.stop()
        raise EngineError(f"{self.name} was not ready after {self.startup_timeout_s:g} s", tail(self.log))

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check(self, wait_s: float = 0.0) -> None:
        """Raises EngineError (with the log's tail) when the server has exited (within ``wait_s`` seconds: a
        server whose connections just dropped may still be exiting)."""
        if self.proc is not None and wait_s > 0:
            try:
                self.proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                pass
        if self.proc is not None and self.proc.poll() is not None:
            raise EngineError(f"{self.name} exited with status {self.proc.returncode} while in use", tail(self.log))

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM to the server's process group (vLLM runs its engine in a child process), then SIGKILL."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        _wait_port_free(self.url)

    def __enter__(self) -> EngineProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/v1/models", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _wait_port_free(url: str, timeout_s: float = 15.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            httpx.get(url + "/v1/models", timeout=2)
        except httpx.HTTPError:
            return
        time.sleep(0.5)
