"""Zoo variants requantised here by ik_llama.cpp's llama-quantize: built once, checked, refused where they cannot run."""

from __future__ import annotations

import dataclasses
import hashlib
import subprocess

import pytest

from adaspec.backends.select import has_gguf
from adaspec.errors import ModelFetchError, UnknownModelError
from adaspec.models import VARIANTS, Variant, cache_root, fetch_gguf, fetch_variant, resolve, resolve_gguf
from adaspec.models import requantize

BASE = "smollm2-135m-instruct"


@pytest.fixture
def variant(monkeypatch):
    """A Q4_0 variant of the small test model, with the size and hash the tool gives on this machine's wheel."""
    pytest.importorskip("ik_llama_cpp")
    base = fetch_gguf(BASE, progress=False)
    name = "test-smollm2-q4_0"
    out = cache_root() / "gguf" / f"{name}.gguf"
    probe = out.with_suffix(".probe")
    subprocess.run([str(requantize.quantize_tool()), "--allow-requantize", "--output-tensor-type", "q4_0",
                    str(base), str(probe), "Q4_0", "2"], check=True, capture_output=True)
    v = Variant(name=name, base=BASE, quant="Q4_0", output_quant="q4_0", description="test",
                gguf_size=probe.stat().st_size, gguf_sha256=hashlib.sha256(probe.read_bytes()).hexdigest())
    probe.unlink()
    out.unlink(missing_ok=True)
    monkeypatch.setitem(VARIANTS, name, v)
    yield v
    out.unlink(missing_ok=True)


@pytest.mark.slow
def test_a_variant_is_built_once_checked_and_resolved_with_its_bases_tokenizer(variant, monkeypatch):
    path = fetch_variant(variant.name, progress=False)
    assert path.stat().st_size == variant.gguf_size
    assert path.stat().st_size < fetch_gguf(BASE, progress=False).stat().st_size  # Q4_0 is smaller than Q4_1

    def no_rebuild(*a, **k):
        raise AssertionError("a cached variant must not be requantised again")

    monkeypatch.setattr(requantize.subprocess, "run", no_rebuild)
    assert fetch_variant(variant.name, progress=False) == path
    name, gguf_file, tok_dir = resolve_gguf(variant.name, progress=False)
    assert (name, gguf_file) == (variant.name, path)
    assert tok_dir == resolve_gguf(BASE, progress=False)[2]
    assert has_gguf(variant.name)


@pytest.mark.slow
def test_a_variant_that_is_not_the_recorded_file_is_refused_and_not_kept(variant, monkeypatch):
    wrong = dataclasses.replace(variant, gguf_sha256="0" * 64)
    monkeypatch.setitem(VARIANTS, variant.name, wrong)
    with pytest.raises(ModelFetchError, match="registry expects .* 0000"):
        fetch_variant(variant.name, progress=False)
    assert not (cache_root() / "gguf" / f"{variant.name}.gguf").exists()
    assert not list((cache_root() / "gguf").glob(f".{variant.name}.*.partial"))


def test_a_variant_is_refused_on_pytorch_with_a_clear_message():
    name = next(iter(VARIANTS))
    with pytest.raises(UnknownModelError, match="runs on the GGUF runtimes only"):
        resolve(name)


def test_the_shipped_variant_is_built_from_a_zoo_model():
    from adaspec.models import ZOO

    for v in VARIANTS.values():
        assert v.base in ZOO and v.role == ZOO[v.base].role and len(v.gguf_sha256) == 64


def test_a_variant_falls_back_to_its_base_where_it_cannot_run(monkeypatch, tmp_path):
    from adaspec.models.requantize import runnable_spec

    monkeypatch.setenv("ADASPEC_CACHE", str(tmp_path))  # nothing built here
    name = next(iter(VARIANTS))
    base = VARIANTS[name].base
    spec, note = runnable_spec(name, "torch")
    assert spec == base and "GGUF runtimes only" in note

    def missing():
        raise ModelFetchError("no llama-quantize")

    monkeypatch.setattr(requantize, "quantize_tool", missing)
    spec, note = runnable_spec(name, "llamacpp")
    assert spec == base and "cannot be built here" in note
    (tmp_path / "gguf").mkdir()
    (tmp_path / "gguf" / f"{name}.gguf").write_bytes(b"built before")  # a built one runs without the tool
    assert runnable_spec(name, "llamacpp") == (name, "")
    assert runnable_spec("qwen2.5-coder-1.5b-instruct", "torch") == ("qwen2.5-coder-1.5b-instruct", "")


def test_models_info_describes_a_variant(capsys):
    import argparse
    import json

    from adaspec.models.cli import add_models_parser

    parser = argparse.ArgumentParser()
    add_models_parser(parser.add_subparsers(dest="command"))
    name = next(iter(VARIANTS))
    args = parser.parse_args(["models", "info", name, "--json"])
    assert args.func(args) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["name"] == name and info["base"] == VARIANTS[name].base
    assert info["gguf_sha256"] == VARIANTS[name].gguf_sha256
