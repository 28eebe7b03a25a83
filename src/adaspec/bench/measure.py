"""Process-level meters for the benchmark: energy (NVML on GPUs, RAPL on CPUs), CPU time, resident memory (model
bytes: the backends' ``weight_bytes``/``kv_bytes_per_token``).

Energy comes from counters only, never from a guessed wattage:

* a GPU run reads NVML's total-energy counter of each visible GPU (``nvmlDeviceGetTotalEnergyConsumption``,
  millijoules since the driver loaded; Volta and newer) through ``nvidia-ml-py``;
* a CPU run reads Intel RAPL counters (``/sys/class/powercap/intel-rapl:N/energy_uj``, package domains) when they
  are readable;
* otherwise the meter says "not measurable here" and reports CPU time instead, which is an energy *proxy*
  (CPU-seconds per token).
"""

from __future__ import annotations

import os
import platform
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import torch


POWERCAP = Path("/sys/class/powercap")
NOT_MEASURABLE = "not measurable here (no readable RAPL energy counters under /sys/class/powercap)"


def rapl_domains(root: Path = POWERCAP) -> list[Path]:
    """Readable package-level RAPL ``energy_uj`` files (``intel-rapl:N``, not the ``:N:M`` sub-domains)."""
    if not root.is_dir():
        return []
    found = []
    for d in sorted(root.glob("intel-rapl:*")):
        if d.name.count(":") != 1:
            continue
        f = d / "energy_uj"
        try:
            int(f.read_text())
        except (OSError, ValueError):
            continue
        found.append(d)
    return found


def _read_uj(domain: Path) -> tuple[int, int]:
    energy = int((domain / "energy_uj").read_text())
    try:
        wrap = int((domain / "max_energy_range_uj").read_text())
    except (OSError, ValueError):
        wrap = 2**63
    return energy, wrap


@dataclass
class MeterReading:
    wall_s: float
    cpu_s: float
    energy_j: float | None  # None when RAPL is not readable
    other_cpu: float | None = None  # share of the machine's CPU capacity that other processes used meanwhile


def _system_busy_s() -> float | None:
    """Busy CPU seconds of the whole machine since boot (``/proc/stat``: all but idle and iowait)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    busy = sum(fields[:8]) - fields[3] - fields[4]  # user nice system idle iowait irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


class NvmlEnergy:
    """NVML total-energy counters of the visible GPUs (``nvidia-ml-py``). :meth:`open` returns None where NVML,
    a GPU or the counter is missing."""

    def __init__(self, nvml, handles: list) -> None:
        self.nvml = nvml
        self.handles = handles

    @classmethod
    def open(cls) -> NvmlEnergy | None:
        try:
            import pynvml as nvml

            nvml.nvmlInit()
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
            for h in handles:
                nvml.nvmlDeviceGetTotalEnergyConsumption(h)  # raises NVMLError_NotSupported before Volta
        except Exception:  # noqa: BLE001 - no package, no driver, no GPU or no counter: not measurable
            return None
        return cls(nvml, handles) if handles else None

    @property
    def source(self) -> str:
        return f"NVML total energy ({len(self.handles)} GPU{'s' if len(self.handles) > 1 else ''})"

    def read_mj(self) -> list[int]:
        """Millijoules per GPU since the driver loaded."""
        return [int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in self.handles]


class Meter:
    """Measure wall time, process CPU time and (when readable) energy over a block::

        meter = Meter(gpu=True); meter.start(); ...; reading = meter.stop()

    ``gpu``: the work runs on CUDA, so energy is the GPUs' (NVML), not the CPU package's.
    """

    def __init__(self, root: Path = POWERCAP, *, gpu: bool = False) -> None:
        self.nvml = NvmlEnergy.open() if gpu else None
        self.domains = [] if self.nvml else rapl_domains(root)
        if self.nvml:
            self.energy_source = self.nvml.source
        elif self.domains:
            self.energy_source = f"RAPL ({', '.join(d.name for d in self.domains)})"
        else:
            self.energy_source = NOT_MEASURABLE + (" and no NVML energy counter" if gpu else "")

    def start(self) -> None:
        self._wall = time.perf_counter()
        t = os.times()
        self._cpu = t.user + t.system
        self._uj = [_read_uj(d) for d in self.domains]
        self._mj = self.nvml.read_mj() if self.nvml else None
        self._busy = _system_busy_s()

    def stop(self) -> MeterReading:
        wall = time.perf_counter() - self._wall
        t = os.times()
        cpu = t.user + t.system - self._cpu
        busy = _system_busy_s()
        other = None
        if busy is not None and self._busy is not None and wall > 0:
            other = max(0.0, (busy - self._busy - cpu) / (wall * (os.cpu_count() or 1)))
        energy = None
        if self.nvml:
            energy = sum(after - before for after, before in zip(self.nvml.read_mj(), self._mj)) / 1e3
        elif self.domains:
            total = 0
            for d, (before, wrap) in zip(self.domains, self._uj):
                after, _ = _read_uj(d)
                total += after - before if after >= before else after + wrap - before
            energy = total / 1e6
        return MeterReading(wall, cpu, energy, other)


def rss_bytes() -> int:
    """Current resident set size of this process (``/proc/self/statm``; falls back to the peak elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss * 1024


def machine_info() -> dict:
    """CPU model, core count, torch version and thread count, for the report."""
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = ""
    try:
        text = Path("/proc/cpuinfo").read_text()
        flags = " ".join(f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f in text)
    except OSError:
        pass
    mem = 0
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        pass
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except AttributeError:
        capability = ""
    from importlib.metadata import PackageNotFoundError, version

    def installed(dist: str) -> str | None:
        try:
            return version(dist)
        except PackageNotFoundError:
            return None

    return {"cpu": cpu, "cores": os.cpu_count(), "cpu_flags": flags, "torch_cpu_capability": capability,
            "llama_cpp_python": installed("llama-cpp-python"),
            "ik_llama_cpp_python": installed("ik-llama-cpp-python"),
            "memory_bytes": mem,
            "torch": torch.__version__, "platform": platform.platform(), "python": platform.python_version()}
