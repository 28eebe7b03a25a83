"""The cache folder and how every stage writes into it safely: its root (``$ADASPEC_CACHE``), removal of
stale temp entries, publishing temp files with normal permissions, and an inter-process lock per entry."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Iterator

__all__ = ["cache_root"]

_STALE_TEMP_S = 6 * 3600  # leftover temp files/folders older than this are removed


def cache_root() -> Path:
    """``$ADASPEC_CACHE`` or ``~/.cache/adaspec`` (read on every call)."""
    env = os.environ.get("ADASPEC_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "adaspec"


def _is_stale(path: Path) -> bool:
    try:
        return time.time() - path.stat().st_mtime > _STALE_TEMP_S
    except OSError:
        return False


def _remove_path(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink()


def _clean_stale(folder: Path, pattern: str) -> None:
    if folder.is_dir():
        for p in folder.glob(pattern):
            if _is_stale(p):
                _remove_path(p)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _publish_mode(path: Path) -> None:
    """Give a temp file/folder (created 0600/0700 by tempfile) the permissions a normal one would get."""
    mask = _umask()
    if path.is_dir():
        os.chmod(path, 0o777 & ~mask)
        for p in path.rglob("*"):
            os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)
    else:
        os.chmod(path, 0o666 & ~mask)


def _dir_size(path: Path) -> int:
    total = 0
    if path.is_dir():
        for p in path.rglob("*"):
            with contextlib.suppress(OSError):
                if p.is_file():
                    total += p.stat().st_size
    return total


@contextlib.contextmanager
def _locked(key: str, *, progress: bool = False) -> Iterator[None]:
    """Hold an exclusive inter-process lock ``locks/<key>.lock`` under the cache root (POSIX; elsewhere a
    no-op). Two processes fetching or converting the same model then take turns instead of both doing
    minutes of work and gigabytes of memory; the second one finds the finished entry and returns."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    folder = cache_root() / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{key}.lock", "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress:
                print(f"waiting for another adaspec process working on {key} ...", file=sys.stderr, flush=True)
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
