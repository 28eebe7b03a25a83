"""Facts about this machine's CPU (Linux ``/proc/cpuinfo``; elsewhere ``platform``), for the backends to ask."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags (the ``flags`` line of Linux ``/proc/cpuinfo``); None where there is none to read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    line = next((line for line in text.splitlines() if line.startswith("flags")), None)
    return frozenset(line.split(":", 1)[1].split()) if line is not None else None


def cpu_has_avx2() -> bool:
    """True when the CPU reports AVX2 (Linux /proc/cpuinfo; other systems: assume x86_64 has it)."""
    flags = cpu_flags()
    if flags is None:
        return platform.machine().lower() in ("x86_64", "amd64")
    return "avx2" in flags


def cpu_simd() -> str:
    """The CPU's widest x86 vector extension: ``"AVX-512"`` (AVX-512 Foundation), ``"AVX2"``, or ``""`` (neither, or
    no flags to read). The same labels as :func:`adaspec.backends.gguf.simd_of` gives a runtime's build."""
    flags = cpu_flags() or frozenset()
    return next((name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2")) if flag in flags), "")


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()`` or the machine type."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_label() -> str:
    """The CPU's model name and widest vector extension, e.g. ``"AMD EPYC (AVX2)"``: result rows carry it so a file
    filled on several machines can be split by machine."""
    simd = cpu_simd()
    return f"{cpu_name()} ({simd})" if simd else cpu_name()
