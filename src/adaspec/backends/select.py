"""Which backend runs a model: ``--backend auto|torch|llamacpp|ik`` and ``--device auto|cpu|cuda``.

``auto`` (the default) picks the fastest path this machine has, measured rather than assumed:

* on CUDA: PyTorch (the GGUF runtimes here are CPU builds);
* on the CPU, for a model that has a GGUF file (a zoo name or a ``.gguf`` path): the fastest *installed* GGUF
  runtime that computes the model correctly, chosen by probing each one on that file once (:func:`measure_runtime`:
  one-token decoding and a 5-token verification forward at a 128-token context, median of 3, plus the mean
  negative log-likelihood of a fixed text, which must be within :data:`NLL_TOLERANCE` of the reference: a runtime
  can mis-run a model, as ik_llama.cpp 0.1.5 does SmolLM2 here) and remembered in
  ``$ADASPEC_CACHE/runtimes.json`` per file, CPU and thread count. ik_llama.cpp is a candidate only on CPUs with
  AVX2 (its prebuilt wheel needs it);
* otherwise (a Hugging Face folder or hub id, an explicit ``dtype``, or no GGUF runtime installed): PyTorch.

A ``@backend`` suffix on a model spec (``NAME@ik``) pins that model and wins over ``--backend``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from adaspec.backends import cpu
from adaspec.defaults import BACKEND_CHOICES as BACKENDS
from adaspec.defaults import DEVICE_CHOICES as DEVICES
from adaspec.errors import AdaspecError, ConfigError


GGUF_RUNTIMES = ("ik", "llamacpp")  # preference order when timings tie
RUNTIME_LABELS = {"torch": "PyTorch", "llamacpp": "llama.cpp", "ik": "ik_llama.cpp"}
_ALIASES = {"auto": "auto", "torch": "torch", "pytorch": "torch", "pt": "torch", "llamacpp": "llamacpp",
            "llama.cpp": "llamacpp", "llama_cpp": "llamacpp", "gguf": "llamacpp", "ik": "ik", "ik_llama.cpp": "ik",
            "ikllamacpp": "ik", "ik_llama": "ik"}
PROBE_CONTEXT = 128
PROBE_WIDTHS = (1, 5)


def normalize_backend(name: str, *, allow_auto: bool = True) -> str:
    """Canonical backend name (``torch``, ``llamacpp``, ``ik`` or ``auto``).

    Raises:
        ConfigError: an unknown name, listing the choices.
    """
    key = str(name).strip().lower()
    if key not in _ALIASES or (key == "auto" and not allow_auto):
        choices = BACKENDS if allow_auto else BACKENDS[1:]
        raise ConfigError(f"unknown backend {name!r}; choose one of: {', '.join(choices)}")
    return _ALIASES[key]


def resolve_device(device: str | None) -> str:
    """``auto`` → ``cuda`` when PyTorch sees a CUDA device, else ``cpu``.

    Raises:
        ConfigError: an unknown device name, or ``cuda`` on a machine where PyTorch sees no CUDA device.
    """
    key = (device or "auto").strip().lower()
    if key.startswith("cuda:"):
        key, index = "cuda", key
    else:
        index = key
    if key not in DEVICES:
        raise ConfigError(f"unknown device {device!r}; choose one of: {', '.join(DEVICES)}")
    import torch

    if key == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if key == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: PyTorch sees no CUDA device here (a CPU-only torch build, no GPU, or no "
                          "driver); use --device cpu")
    return index


def installed_runtimes() -> dict[str, str]:
    """GGUF runtimes that can run here → their package version; a runtime that cannot is left out (see
    :func:`unavailable_runtimes` for why)."""
    return {name: ver for name, (ver, why) in _probe_installed().items() if why is None}


def unavailable_runtimes() -> dict[str, str]:
    """GGUF runtimes that cannot run here → one line saying why and how to fix it."""
    return {name: why for name, (ver, why) in _probe_installed().items() if why is not None}


def _probe_installed() -> dict[str, tuple[str | None, str | None]]:
    from importlib import metadata

    out: dict[str, tuple[str | None, str | None]] = {}
    for name, dist in (("ik", "ik-llama-cpp-python"), ("llamacpp", "llama-cpp-python")):
        try:
            ver = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[name] = (None, f"{dist} is not installed")
            continue
        if name == "ik" and not cpu.cpu_has_avx2():
            out[name] = (ver, "this CPU lacks AVX2, which the prebuilt ik-llama-cpp-python wheel needs")
            continue
        out[name] = (ver, None)
    return out


@dataclass(frozen=True)
class RuntimeChoice:
    """The backend ``auto`` chose for one model, and why (a line for the user)."""

    backend: str
    reason: str
    timings: dict[str, dict[str, float]] | None = None  # runtime → {"1": ms, "5": ms} when measured


def _cache_file() -> Path:
    from adaspec.models import cache_root

    return cache_root() / "runtimes.json"


PROBE_TEXT = (
    "The quick brown fox jumps over the lazy dog. In computer science, a linked list is a linear collection of data "
    "elements whose order is not given by their physical placement in memory. Instead, each element points to the "
    "next. It is a data structure consisting of a collection of nodes which together represent a sequence.\n\n"
    "def fibonacci(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n")
"""Fixed text whose mean next-token negative log-likelihood checks that a runtime computes the model correctly."""

NLL_TOLERANCE = 0.25
"""Nats per token a runtime's probe NLL may exceed the reference (the best runtime's, or the zoo's llama.cpp value)
before it is called wrong for this model. Q4 kernels of two correct runtimes differ by a few hundredths."""


def probe_nll(backend, ids: list[int]) -> float:
    """Mean negative log-likelihood (nats/token) of ``ids[1:]`` given the prefix, from one forward with logits for
    every position; the cache is emptied before and after."""
    import torch

    backend.reset()
    logits = backend.forward(ids, len(ids)).float()
    backend.reset()
    logp = torch.log_softmax(logits[:-1], -1)
    return float(-logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].mean())


def measure_runtime(runtime: str, gguf_file: Path, threads: int, probe_ids: list[int], *,
                    repeats: int = 3) -> dict[str, float]:
    """Probe ``runtime`` on ``gguf_file``: ``"1"``/``"5"`` = milliseconds of one forward of n tokens (logits for all
    n, as verification needs) after a :data:`PROBE_CONTEXT`-token context, median of ``repeats`` after one warm-up;
    ``"nll"`` = :func:`probe_nll` of ``probe_ids`` (nats/token). Timing is the goodput controller's own
    :func:`~adaspec.backends.costcurve.measure_verify_curve`."""
    from adaspec.backends.costcurve import measure_verify_curve

    context = max(PROBE_CONTEXT, len(probe_ids))
    backend = make_gguf_backend(runtime, gguf_file, threads=threads, max_context=context + 16)
    try:
        out = {"nll": round(probe_nll(backend, probe_ids), 4)}
        measure_verify_curve(backend, PROBE_WIDTHS, context_len=PROBE_CONTEXT, repeats=1)  # warm-up
        curve = measure_verify_curve(backend, PROBE_WIDTHS, context_len=PROBE_CONTEXT, repeats=repeats)
        return out | {str(n): round(ms, 2) for n, ms in curve.items()}
    finally:
        backend.close()


def require_runtime(runtime: str) -> None:
    """Fail now, with the install command, when GGUF runtime ``runtime`` cannot be used here.

    Raises:
        ConfigError: its package is missing or cannot run on this CPU; ``runtime`` is not a GGUF runtime.
    """
    if runtime == "ik":
        from adaspec.backends.ik_backend import import_ik_llama_cpp

        import_ik_llama_cpp()
    elif runtime == "llamacpp":
        from adaspec.backends.llamacpp_backend import import_llama_cpp

        import_llama_cpp()
    else:
        raise ConfigError(f"{runtime!r} is not a GGUF runtime; choose one of: {', '.join(GGUF_RUNTIMES)}")


def make_gguf_backend(runtime: str, gguf_file: Path, **kwargs):
    """A :class:`~adaspec.backends.gguf.GgufBackend` of ``runtime`` (``ik`` or ``llamacpp``) over ``gguf_file``."""
    if runtime == "ik":
        from adaspec.backends.ik_backend import IkLlamaBackend

        return IkLlamaBackend(gguf_file, **kwargs)
    if runtime == "llamacpp":
        from adaspec.backends.llamacpp_backend import LlamaCppBackend

        return LlamaCppBackend(gguf_file, **kwargs)
    raise ConfigError(f"{runtime!r} is not a GGUF runtime; choose one of: {', '.join(GGUF_RUNTIMES)}")


def fastest_gguf_runtime(gguf_file: Path, threads: int, probe_ids: list[int], *, reference_nll: float | None = None,
                         measure: Callable = measure_runtime,
                         runtimes: dict[str, str] | None = None) -> tuple[RuntimeChoice | None, dict[str, str]]:
    """The installed GGUF runtime with the lowest ``t(1) + t(5)`` (one plain step plus one K = 4 verification) on
    this file, CPU and thread count, among those that compute the model correctly: a runtime whose probe NLL
    exceeds the reference (``reference_nll`` when known, else the best runtime's) by more than
    :data:`NLL_TOLERANCE` is left out, with the reason. Probes run once and are cached in
    ``$ADASPEC_CACHE/runtimes.json``.

    Returns:
        ``(choice, rejected)``: the choice (None when no GGUF runtime is installed or none passes the check) and,
        per runtime left out, one line saying why.
    """
    runtimes = installed_runtimes() if runtimes is None else runtimes
    rejected: dict[str, str] = {}
    if not runtimes:
        return None, rejected
    gguf_file = Path(gguf_file)
    st = gguf_file.stat()
    key = "|".join([gguf_file.name, str(st.st_size), cpu.cpu_name(), f"threads={threads}", f"probe={len(probe_ids)}",
                    *(f"{n}={v}" for n, v in sorted(runtimes.items()))])
    cache = _cache_file()
    try:
        table = json.loads(cache.read_text())
    except (OSError, ValueError):
        table = {}
    timings = table.get(key)
    measured_now = timings is None
    if measured_now:
        timings = {}
        for name in runtimes:
            try:
                timings[name] = measure(name, gguf_file, threads, probe_ids)
            except (AdaspecError, RuntimeError, OSError) as e:  # cannot load or run this file: not a candidate
                timings[name] = {"error": f"{type(e).__name__}: {e}"}
        table[key] = timings
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".tmp-{os.getpid()}")
            tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
            os.replace(tmp, cache)
        except OSError:
            pass  # a read-only cache only costs a re-measurement next time
    ran = {n: t for n, t in timings.items() if "nll" in t and "1" in t and "5" in t}
    for n, t in timings.items():
        if n not in ran:
            rejected[n] = f"{RUNTIME_LABELS.get(n, n)} not used: it failed on this file ({t.get('error', t)})"
    ref = min([t["nll"] for t in ran.values()] + ([reference_nll] if reference_nll is not None else []),
              default=0.0)
    sound = {n: t for n, t in ran.items() if t["nll"] <= ref + NLL_TOLERANCE}
    for n, t in ran.items():
        if n not in sound:
            rejected[n] = (f"{RUNTIME_LABELS[n]} not used: it computes this model wrongly here (probe NLL "
                            f"{t['nll']:.2f} nats/token against {ref:.2f})")
    if not sound:
        return None, rejected
    order = {n: i for i, n in enumerate(GGUF_RUNTIMES)}
    best = min(sound, key=lambda n: (sound[n]["1"] + sound[n]["5"], order.get(n, 9)))
    parts = ", ".join(f"{RUNTIME_LABELS[n]} {t['1']:.0f}/{t['5']:.0f} ms" for n, t in sorted(sound.items()))
    why = (f"{RUNTIME_LABELS[best]}: " + ("fastest GGUF runtime on this CPU" if len(sound) > 1 else
                                          "the GGUF runtime installed") +
           f" ({'measured now' if measured_now else 'measured'}: one forward of 1/5 tokens at a {PROBE_CONTEXT}-token "
           f"context with {threads} threads: {parts})")
    if rejected:
        why += "; " + "; ".join(rejected.values())
    return RuntimeChoice(best, why, timings), rejected


def has_gguf(spec: str) -> bool:
    """True when ``spec`` names a model with a GGUF file (a zoo name or variant, or a ``.gguf`` path)."""
    from adaspec.models import VARIANTS, ZOO

    text = str(spec).strip()
    return text.lower() in ZOO or text.lower() in VARIANTS or text.lower().endswith(".gguf")


def choose_backend(spec: str, backend: str = "auto", *, device: str = "cpu", dtype: str | None = None,
                   threads: int = 1, progress: bool = False) -> RuntimeChoice:
    """The backend for model ``spec`` (without a ``@backend`` suffix) under ``--backend``/``--device``/``--dtype``.

    Raises:
        ConfigError: unknown backend names; a GGUF runtime asked for with ``--device cuda``.
    """
    backend = normalize_backend(backend)
    if backend != "auto":
        if backend != "torch" and device != "cpu":
            raise ConfigError(f"--backend {backend} runs on the CPU here; use --device cpu or --backend torch")
        return RuntimeChoice(backend, f"{RUNTIME_LABELS[backend]}: asked for")
    if device != "cpu":
        return RuntimeChoice("torch", f"PyTorch: device {device}")
    if dtype is not None:
        return RuntimeChoice("torch", f"PyTorch: dtype {dtype} asked for (GGUF runtimes run the file's own "
                                      "quantisation)")
    if not has_gguf(spec):
        return RuntimeChoice("torch", "PyTorch: the model has no GGUF file")
    from transformers import AutoTokenizer

    from adaspec.models import ZOO, resolve_gguf

    name, gguf_file, tok_dir = resolve_gguf(spec, progress=progress)
    probe_ids = AutoTokenizer.from_pretrained(str(tok_dir))(PROBE_TEXT)["input_ids"]
    entry = ZOO.get(name.lower())
    choice, rejected = fastest_gguf_runtime(gguf_file, threads, probe_ids,
                                            reference_nll=entry.probe_nll if entry is not None else None)
    blocked = {n: why for n, why in unavailable_runtimes().items() if "not installed" not in why}
    if choice is not None and blocked:  # installed but cannot run here (a CPU without AVX2): say so
        choice = RuntimeChoice(choice.backend, choice.reason + "; " + "; ".join(
            f"{RUNTIME_LABELS[n]} not used: {why}" for n, why in blocked.items()), choice.timings)
    if choice is None and rejected:
        return RuntimeChoice("torch", "PyTorch: " + "; ".join(rejected.values()))
    if choice is None:
        missing = "; ".join(unavailable_runtimes().values())
        hint = ('; pip install "ik-llama-cpp-python==0.1.5" for the fast CPU path' if cpu.cpu_has_avx2()
                else '; pip install -e ".[llamacpp]" for llama.cpp')
        return RuntimeChoice("torch", f"PyTorch: no GGUF runtime can run here ({missing}{hint})")
    return choice
