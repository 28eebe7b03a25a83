"""Stage 2b, ``gguf/<variant>.gguf``: a zoo variant requantised from its base model's GGUF by ik_llama.cpp's
``llama-quantize`` (shipped in the ik-llama-cpp-python wheel), built once, atomically, and checked against the
size and SHA-256 the registry records (the tool is deterministic for a pinned wheel)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ..errors import ModelFetchError
from .assemble import _sha256_file, fetch_gguf
from .cache import _clean_stale, _locked, cache_root
from .registry import VARIANTS, Variant

__all__ = ["fetch_variant", "quantize_tool", "runnable_spec"]


def quantize_tool() -> Path:
    """The ``llama-quantize`` binary of ik-llama-cpp-python.

    Raises:
        ModelFetchError: ik-llama-cpp-python is not installed (names the install command).
    """
    try:
        from ik_llama_cpp.quantize import find_quantize_bin
    except ImportError:
        raise ModelFetchError('building a requantised zoo variant needs ik_llama.cpp\'s llama-quantize: '
                              'pip install "ik-llama-cpp-python==0.1.5"') from None
    path = find_quantize_bin()
    if path is None:
        raise ModelFetchError("ik-llama-cpp-python is installed but its llama-quantize binary was not found")
    return path


def fetch_variant(name: str, *, progress: bool = True, variants: dict[str, Variant] | None = None) -> Path:
    """Make sure ``gguf/<name>.gguf`` exists (fetching the base model and requantising it if needed); return it.

    A cached file is trusted when its size matches. ``variants`` defaults to the registry's (tests pass their own).

    Raises:
        ModelFetchError: the quantize tool is missing or fails, or the result is not the recorded file.
        KeyError: ``name`` is not a variant.
    """
    variant = (VARIANTS if variants is None else variants)[name.strip().lower()]
    final = cache_root() / "gguf" / f"{variant.name}.gguf"
    with _locked(f"gguf-{variant.name}", progress=progress):
        if final.is_file() and final.stat().st_size == variant.gguf_size:
            return final
        base = fetch_gguf(variant.base, progress=progress)
        _clean_stale(final.parent, f".{variant.name}.*.partial")
        tmp = final.parent / f".{variant.name}.{os.getpid()}.partial"
        cmd = [str(quantize_tool()), "--allow-requantize", "--output-tensor-type", variant.output_quant,
               str(base), str(tmp), variant.quant, str(max(os.cpu_count() or 1, 1))]
        if progress:
            print(f"{variant.name}: requantising {variant.base} to {variant.quant}", file=sys.stderr)
        run = subprocess.run(cmd, capture_output=True, text=True)
        try:
            if run.returncode != 0:
                tail = "\n".join((run.stdout + run.stderr).strip().splitlines()[-5:])
                raise ModelFetchError(f"llama-quantize failed for {variant.name} (exit {run.returncode}): {tail}")
            size, digest = tmp.stat().st_size, _sha256_file(tmp)
            if (size, digest) != (variant.gguf_size, variant.gguf_sha256):
                raise ModelFetchError(
                    f"{variant.name}: llama-quantize made a file of {size:,} bytes with SHA-256 {digest}; the "
                    f"registry expects {variant.gguf_size:,} bytes, {variant.gguf_sha256} (another "
                    "ik-llama-cpp-python version?)")
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
    return final


def runnable_spec(spec: str, backend: str) -> tuple[str, str]:
    """``(spec, note)``: a variant where it cannot run -- on PyTorch, or not yet built on a machine without
    ik_llama.cpp's quantize tool -- becomes the zoo model it is built from (the same weights before requantising),
    and ``note`` says so; any other spec comes back as it is with an empty note."""
    variant = VARIANTS.get(spec.strip().lower())
    if variant is None:
        return spec, ""
    if backend == "torch":
        return variant.base, f"{variant.name} runs on the GGUF runtimes only: {variant.base} on PyTorch instead"
    built = (cache_root() / "gguf" / f"{variant.name}.gguf").is_file()
    if not built:
        try:
            quantize_tool()
        except ModelFetchError as err:
            return variant.base, f"{variant.name} cannot be built here ({err}): {variant.base} instead"
    return spec, ""
