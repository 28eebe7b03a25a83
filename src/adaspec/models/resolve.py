"""Resolving what the user typed (a zoo name, a ``.gguf`` file, a Hugging Face folder or a hub id) into
something a backend loads, fetching and converting on first use; and what is on disk for a zoo model."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelFetchError, UnknownModelError
from .assemble import fetch_gguf
from .cache import _dir_size, cache_root
from .convert import _converted_marker, _read_marker, convert_gguf, converted_dir, fetch
from .progress import _transformers_progress
from .registry import VARIANTS, ZOO, _entry, _unknown_message
from .requantize import fetch_variant
from .wheels import _find_cached_wheel, _wheels_dir

__all__ = ["ResolvedModel", "model_status", "resolve", "resolve_gguf"]


@dataclass
class ResolvedModel:
    """Where a model spec points: ``path`` is a local HF folder (``is_local``) or a hub id."""

    spec: str
    name: str
    path: str
    gguf: Path | None
    is_local: bool


_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]*[A-Za-z0-9_]$")


def adhoc_converted_dir(gguf_file: Path) -> Path:
    """``hf/gguf-<16 hex>/`` for a local GGUF, keyed on its absolute path, size and mtime."""
    gguf_file = Path(gguf_file).expanduser().resolve()
    st = gguf_file.stat()
    key = hashlib.sha256(f"{gguf_file}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_root() / "hf" / f"gguf-{key}"


def resolve(spec: str, *, fetch_missing: bool = True, progress: bool = True) -> ResolvedModel:
    """Turn a model spec into something ``from_pretrained`` can load.

    * zoo name -> its converted folder (fetched and converted first when missing and ``fetch_missing``);
    * path to an existing ``.gguf`` -> converted once into ``hf/gguf-<hash>/``;
    * existing folder with ``config.json`` -> itself;
    * ``org/name`` that is not an existing path -> passed through as a hub id;
    * anything else -> UnknownModelError (with the zoo names and the closest match).
    """
    text = str(spec).strip()
    key = text.lower()
    if key in VARIANTS:
        raise UnknownModelError(f"{VARIANTS[key].name} is a requantised GGUF variant: it runs on the GGUF runtimes "
                                f"only (append @ik or @llamacpp), not on PyTorch; {VARIANTS[key].base} is the model "
                                "it was built from")
    if key in ZOO:
        entry = ZOO[key]
        gguf_file = cache_root() / "gguf" / f"{entry.name}.gguf"
        if _converted_marker(entry.name) is None:
            if not fetch_missing:
                raise ModelFetchError(
                    f"model {entry.name} is not fetched yet; run `adaspec models fetch {entry.name}`"
                )
            fetch(entry.name, progress=progress)
        return ResolvedModel(
            spec=text,
            name=entry.name,
            path=str(converted_dir(entry.name)),
            gguf=gguf_file if gguf_file.is_file() else None,
            is_local=True,
        )

    path = Path(text).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise UnknownModelError(_unknown_message(text, "a file, but not a .gguf file"))
        path = path.resolve()
        out = adhoc_converted_dir(path)
        marker = _read_marker(out)
        if marker is None:
            if not fetch_missing:
                raise ModelFetchError(f"{path} has not been converted yet (it would go to {out})")
            convert_gguf(path, out, progress=progress, label=path.name)
        return ResolvedModel(spec=text, name=path.stem, path=str(out), gguf=path, is_local=True)
    if path.is_dir():
        if (path / "config.json").is_file():
            path = path.resolve()
            return ResolvedModel(spec=text, name=path.name, path=str(path), gguf=None, is_local=True)
        ggufs = sorted(path.glob("*.gguf"))
        hint = f"a folder without config.json; pass the file itself, e.g. {ggufs[0]}" if ggufs else (
            "a folder without config.json"
        )
        raise UnknownModelError(_unknown_message(text, hint))
    if key.endswith(".gguf"):
        raise UnknownModelError(_unknown_message(text, "no such .gguf file"))
    if _HUB_ID.match(text) and not text.startswith((".", "~")):
        return ResolvedModel(spec=text, name=text, path=text, gguf=None, is_local=False)
    raise UnknownModelError(_unknown_message(text))


def resolve_gguf(spec: str, *, progress: bool = True) -> tuple[str, Path, Path]:
    """Resolve a model spec for a backend that runs GGUF files as they are (llama.cpp): no conversion.

    Returns ``(name, gguf_file, tokenizer_dir)``: a zoo name gives its assembled, verified GGUF (fetched when
    missing; a variant is requantised from its base on first use); a path gives that ``.gguf`` file. ``tokenizer_dir`` holds a Hugging Face tokenizer equal to the
    GGUF's own (the converted folder when the model was converted, else the tokenizer alone, extracted once into
    ``tokenizers/<name>-<hash>/``).

    Raises:
        UnknownModelError: ``spec`` is a Hugging Face folder or hub id (they hold no GGUF file) or unknown.
    """
    text = str(spec).strip()
    key = text.lower()
    if key in VARIANTS:  # requantised from its base: the base's tokenizer
        _, _, tok_dir = resolve_gguf(VARIANTS[key].base, progress=progress)
        return VARIANTS[key].name, fetch_variant(key, progress=progress), tok_dir
    if key in ZOO:
        entry = ZOO[key]
        path = fetch_gguf(entry.name, progress=progress)
        name = entry.name
        if _converted_marker(entry.name) is not None:
            return name, path, converted_dir(entry.name)
        digest = entry.gguf_sha256[:12]
    else:
        path = Path(text).expanduser()
        if not (path.is_file() and path.suffix.lower() == ".gguf"):
            raise UnknownModelError(_unknown_message(
                text, "the llama.cpp backend runs GGUF files: pass a zoo name or a path to a .gguf file"))
        path = path.resolve()
        name = path.stem
        digest = adhoc_converted_dir(path).name.removeprefix("gguf-")[:12]
    tok_dir = cache_root() / "tokenizers" / f"{name}-{digest}"
    if not (tok_dir / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        tmp = tok_dir.with_name(tok_dir.name + f".tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        with _transformers_progress(progress):
            tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        tok.save_pretrained(str(tmp))
        shutil.rmtree(tok_dir, ignore_errors=True)
        os.replace(tmp, tok_dir)
    return name, path, tok_dir


def model_status(name: str) -> dict:
    """What is on disk for zoo model ``name`` (for ``adaspec models list`` / ``info``). Never hashes."""
    entry = _entry(name)
    wheels_dir = _wheels_dir()
    packages = []
    for requirement, member in entry.packages:
        wheel = _find_cached_wheel(requirement, wheels_dir)
        packages.append(
            {
                "requirement": requirement,
                "member": member,
                "wheel": str(wheel) if wheel else None,
                "wheel_size": wheel.stat().st_size if wheel else None,
            }
        )
    gguf_file = cache_root() / "gguf" / f"{entry.name}.gguf"
    gguf_size = gguf_file.stat().st_size if gguf_file.is_file() else None
    gguf_ok = gguf_size == entry.gguf_size
    hf_dir = converted_dir(entry.name)
    marker = _converted_marker(entry.name)
    converted = marker is not None
    if converted:
        status = "converted"
    elif gguf_ok:
        status = "cached"
    else:
        status = "not fetched"
    return {
        "name": entry.name,
        "role": entry.role,
        "description": entry.description,
        "quant": entry.quant,
        "license": entry.license,
        "status": status,
        "parts_total": len(entry.packages),
        "parts_downloaded": sum(p["wheel"] is not None for p in packages),
        "packages": packages,
        "gguf_path": str(gguf_file),
        "gguf_present": gguf_size is not None,
        "gguf_size": gguf_size,
        "gguf_expected_size": entry.gguf_size,
        "gguf_size_ok": gguf_ok,
        "gguf_sha256": entry.gguf_sha256,
        "hf_path": str(hf_dir),
        "converted": converted,
        "converted_dtype": marker.get("dtype") if marker else None,
        "converted_size": _dir_size(hf_dir) if converted else None,
        "converted_info": marker,
    }
