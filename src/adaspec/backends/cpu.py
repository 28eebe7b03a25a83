"""Facts about this machine's CPU (Linux ``/proc/cpuinfo``; elsewhere ``platform``), for the backends to ask."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_has_avx2() -> bool:
    """True when the CPU reports AVX2 (Linux /proc/cpuinfo; other systems: assume x86_64 has it)."""
    try:
        return " avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine().lower() in ("x86_64", "amd64")


def cpu_has_avx512() -> bool:
    """True when the CPU reports AVX-512 Foundation (Linux /proc/cpuinfo; elsewhere False)."""
    try:
        return " avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


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
    try:
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        flags = ""
    simd = next((name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2")) if f" {flag}" in flags), None)
    return f"{cpu_name()} ({simd})" if simd else cpu_name()
