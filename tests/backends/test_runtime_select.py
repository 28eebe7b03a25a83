"""Choosing where a model runs (``--backend auto|torch|llamacpp|ik``, ``--device auto|cpu|cuda``) and keeping two
GGUF runtimes apart in one process.

Fast tests script the probe (:func:`adaspec.backends.select.fastest_gguf_runtime` takes a ``measure`` function);
slow ones run the real runtimes on the zoo's SmolLM2 (Q4_1).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from adaspec.backends import cpu, select
from adaspec.backends.select import (NLL_TOLERANCE, choose_backend, fastest_gguf_runtime, make_gguf_backend,
                                     normalize_backend, resolve_device)
from adaspec.errors import ConfigError

MODEL = "smollm2-135m-instruct"
HAVE_LLAMACPP = importlib.util.find_spec("llama_cpp") is not None
HAVE_IK = importlib.util.find_spec("ik_llama_cpp") is not None


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh runtimes.json (the models stay in the real cache, which the slow tests fetch from)."""
    monkeypatch.setattr(select, "_cache_file", lambda: tmp_path / "runtimes.json")
    return tmp_path


@pytest.fixture
def gguf(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + bytes(60))
    return path


class Scripted:
    """A probe that returns fixed numbers per runtime and counts its calls."""

    def __init__(self, table):
        self.table, self.calls = table, []

    def __call__(self, runtime, gguf_file, threads, probe_ids):
        self.calls.append(runtime)
        return dict(self.table[runtime])


BOTH = {"ik": "0.1.5", "llamacpp": "0.3.36"}
REJECTED: dict[str, str] = {}  # the rejections of the last fastest_gguf_runtime_nocache call


def test_picks_the_lowest_plain_plus_verify_time_and_caches_the_probe(cache, gguf):
    probe = Scripted({"ik": {"1": 65.0, "5": 111.0, "nll": 2.00}, "llamacpp": {"1": 80.0, "5": 256.0, "nll": 2.01}})
    choice, _ = fastest_gguf_runtime(gguf, 2, [1, 2, 3], measure=probe, runtimes=BOTH)
    assert choice.backend == "ik" and sorted(probe.calls) == ["ik", "llamacpp"]
    assert "measured now" in choice.reason and "65/111 ms" in choice.reason and "80/256 ms" in choice.reason
    again, _ = fastest_gguf_runtime(gguf, 2, [1, 2, 3], measure=probe, runtimes=BOTH)
    assert again.backend == "ik" and len(probe.calls) == 2  # from $ADASPEC_CACHE/runtimes.json
    assert json.loads((cache / "runtimes.json").read_text())
    fastest_gguf_runtime(gguf, 1, [1, 2, 3], measure=probe, runtimes=BOTH)  # another thread count: probed anew
    assert len(probe.calls) == 4


def test_plain_step_alone_does_not_decide():
    """t(1) + t(5): a runtime with a slightly slower plain step but much cheaper verification wins."""
    probe = Scripted({"ik": {"1": 82.0, "5": 120.0, "nll": 2.0}, "llamacpp": {"1": 80.0, "5": 256.0, "nll": 2.0}})
    assert fastest_gguf_runtime_nocache(probe).backend == "ik"
    probe = Scripted({"ik": {"1": 90.0, "5": 260.0, "nll": 2.0}, "llamacpp": {"1": 80.0, "5": 256.0, "nll": 2.0}})
    assert fastest_gguf_runtime_nocache(probe).backend == "llamacpp"


def fastest_gguf_runtime_nocache(probe, **kwargs):
    """The choice of :func:`fastest_gguf_runtime` with a throw-away cache; the rejections go to ``REJECTED``."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.gguf"
        path.write_bytes(b"GGUF")
        old = select._cache_file
        select._cache_file = lambda: Path(d) / "runtimes.json"
        try:
            choice, rejected = fastest_gguf_runtime(path, 2, [1], measure=probe, runtimes=kwargs.pop("runtimes", BOTH),
                                                    **kwargs)
            REJECTED.clear()
            REJECTED.update(rejected)
            return choice
        finally:
            select._cache_file = old


def test_a_runtime_that_computes_the_model_wrongly_is_left_out_with_the_reason():
    probe = Scripted({"ik": {"1": 65.0, "5": 111.0, "nll": 4.82}, "llamacpp": {"1": 80.0, "5": 256.0, "nll": 3.06}})
    choice = fastest_gguf_runtime_nocache(probe)
    assert choice.backend == "llamacpp"
    assert "ik_llama.cpp not used" in choice.reason and "4.82" in choice.reason and "3.06" in choice.reason
    # within the tolerance both count as correct, and the faster wins
    probe = Scripted({"ik": {"1": 65.0, "5": 111.0, "nll": 3.06 + NLL_TOLERANCE - 0.01},
                      "llamacpp": {"1": 80.0, "5": 256.0, "nll": 3.06}})
    assert fastest_gguf_runtime_nocache(probe).backend == "ik"


def test_a_lone_runtime_is_checked_against_the_zoo_reference():
    probe = Scripted({"ik": {"1": 65.0, "5": 111.0, "nll": 4.82}})
    assert fastest_gguf_runtime_nocache(probe, runtimes={"ik": "0.1.5"}, reference_nll=3.06) is None
    assert "ik_llama.cpp not used" in REJECTED["ik"]
    choice = fastest_gguf_runtime_nocache(probe, runtimes={"ik": "0.1.5"}, reference_nll=4.7)
    assert choice.backend == "ik" and "the GGUF runtime installed" in choice.reason
    assert fastest_gguf_runtime_nocache(probe, runtimes={}) is None


def test_backend_and_device_names():
    assert normalize_backend("llama.cpp") == "llamacpp" and normalize_backend("IK") == "ik"
    with pytest.raises(ConfigError, match="unknown backend 'vllm'; choose one of: auto, torch, llamacpp, ik"):
        normalize_backend("vllm")
    with pytest.raises(ConfigError, match="choose one of: cpu, torch|torch, llamacpp, ik"):
        normalize_backend("auto", allow_auto=False)
    with pytest.raises(ConfigError, match="unknown device 'tpu'; choose one of: auto, cpu, cuda"):
        resolve_device("tpu")


def test_device_auto_and_cuda_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu" and resolve_device(None) == "cpu"
    with pytest.raises(ConfigError, match="PyTorch sees no CUDA device"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda" and resolve_device("cuda:1") == "cuda:1"


def test_auto_chooses_pytorch_where_gguf_runtimes_do_not_apply(tmp_path):
    assert choose_backend("org/some-model", device="cpu").backend == "torch"  # a hub id: no GGUF file
    assert choose_backend(str(tmp_path), device="cpu").backend == "torch"  # an HF folder
    assert choose_backend(MODEL, device="cuda").backend == "torch"
    got = choose_backend(MODEL, device="cpu", dtype="float32")
    assert got.backend == "torch" and "dtype float32" in got.reason
    assert choose_backend(MODEL, "ik", device="cpu").backend == "ik"
    with pytest.raises(ConfigError, match="runs on the CPU"):
        choose_backend(MODEL, "llamacpp", device="cuda")


def test_ik_missing_names_the_install_command(monkeypatch):
    from adaspec.backends import ik_backend

    monkeypatch.setattr(ik_backend, "_LIB", None)
    monkeypatch.setattr(cpu, "cpu_has_avx2", lambda: True)
    monkeypatch.setitem(sys.modules, "ik_llama_cpp", None)  # import fails as when not installed
    with pytest.raises(ConfigError, match='pip install "ik-llama-cpp-python==0.1.5"'):
        ik_backend.import_ik_llama_cpp()


def test_a_cpu_without_avx2_skips_ik_and_says_why(monkeypatch):
    from adaspec.backends import ik_backend

    monkeypatch.setattr(cpu, "cpu_has_avx2", lambda: False)
    assert "ik" not in select.installed_runtimes()
    if HAVE_IK:
        assert "lacks AVX2" in select.unavailable_runtimes()["ik"]
    monkeypatch.setattr(ik_backend, "_LIB", None)
    with pytest.raises(ConfigError, match="needs a CPU with AVX2"):
        ik_backend.import_ik_llama_cpp()


def test_a_runtime_that_fails_on_the_file_is_left_out_not_fatal():
    def probe(runtime, gguf_file, threads, probe_ids):
        if runtime == "ik":
            raise ConfigError("ik_llama.cpp could not load m.gguf")
        return {"1": 80.0, "5": 256.0, "nll": 2.0}

    choice = fastest_gguf_runtime_nocache(probe)
    assert choice.backend == "llamacpp" and "ik_llama.cpp not used: it failed on this file" in choice.reason
    assert fastest_gguf_runtime_nocache(probe, runtimes={"ik": "0.1.5"}) is None
    assert "could not load" in REJECTED["ik"]


# Real runtimes ------------------------------------------------------------------------------------------------

needs_both = pytest.mark.skipif(not (HAVE_IK and HAVE_LLAMACPP), reason="needs both GGUF runtimes")


@pytest.mark.slow
@needs_both
def test_probe_on_smollm2_finds_ik_wrong_and_auto_uses_llamacpp(cache):
    """ik_llama.cpp 0.1.5 runs SmolLM2 (Q4_1, llama architecture) but computes it differently from llama.cpp and the
    converted PyTorch model (greedy continuations differ from the first token; the probe text's NLL is ~1.8 nats
    higher), while both agree on Qwen2.5. The probe catches that, and ``auto`` runs the model on llama.cpp."""
    from transformers import AutoTokenizer

    from adaspec.models import ZOO, resolve_gguf

    _, path, tok_dir = resolve_gguf(MODEL, progress=False)
    ids = AutoTokenizer.from_pretrained(str(tok_dir))(select.PROBE_TEXT)["input_ids"]
    ref = select.measure_runtime("llamacpp", path, 2, ids)
    ik = select.measure_runtime("ik", path, 2, ids)
    assert abs(ref["nll"] - ZOO[MODEL].probe_nll) < 0.05  # the zoo's reference is llama.cpp's value
    assert ik["nll"] > ref["nll"] + NLL_TOLERANCE
    choice = choose_backend(MODEL, device="cpu", threads=2)
    assert choice.backend == "llamacpp" and "ik_llama.cpp not used" in choice.reason


LOGITS_SCRIPT = r"""
import sys, torch
from adaspec.backends.select import make_gguf_backend
from adaspec.models import resolve_gguf
path = resolve_gguf("smollm2-135m-instruct", progress=False)[1]
order, out = sys.argv[1].split(","), sys.argv[2]
backends = {rt: make_gguf_backend(rt, path, threads=2, max_context=64) for rt in order}  # load all, then run
ids = [1, 4093, 1345, 5050, 314, 253, 1789, 28, 4557, 30]
torch.save({rt: b.forward(ids, 3) for rt, b in backends.items()}, out)
"""


@pytest.mark.slow
@needs_both
def test_both_gguf_libraries_in_one_process_each_run_their_own_code(tmp_path):
    """llama-cpp-python and ik-llama-cpp-python both ship a ``libllama.so``. Loaded into one process (an ik target
    with a llama.cpp draft, or both in one ``compare``), each backend must still call its own library: its logits in
    a mixed process equal those of a process that loaded only that library, bit for bit, in either load order, and
    the two libraries' logits differ on this model (so the check can tell them apart)."""
    def run(order):
        out = tmp_path / f"{order.replace(',', '-')}.pt"
        subprocess.run([sys.executable, "-c", LOGITS_SCRIPT, order, str(out)], check=True, timeout=300)
        return torch.load(out)

    solo = {rt: run(rt)[rt] for rt in ("llamacpp", "ik")}
    assert (solo["llamacpp"] - solo["ik"]).abs().max() > 0.1
    for order in ("ik,llamacpp", "llamacpp,ik"):
        mixed = run(order)
        for rt in ("llamacpp", "ik"):
            assert torch.equal(mixed[rt], solo[rt]), (order, rt)


def test_simd_of_reads_the_widest_extension_a_build_reports():
    from adaspec.backends.gguf import simd_of

    wheel = ("AVX = 1 | AVX_VNNI = 0 | AVX2 = 1 | AVX512 = 0 | AVX512_VBMI = 0 | AVX512_VNNI = 0 | AVX512_BF16 = 0 | "
             "FMA = 1 | NEON = 0 | F16C = 1 | SSE3 = 1 | MATMUL_INT8 = 0 | ")
    native = wheel.replace("AVX512 = 0", "AVX512 = 1").replace("AVX512_VNNI = 0", "AVX512_VNNI = 1")
    assert simd_of(wheel) == "AVX2"
    assert simd_of(native) == "AVX-512"
    assert simd_of("AVX = 1 | AVX2 = 0 | AVX512 = 0") == "AVX"
    assert simd_of("NEON = 1 | ARM_FMA = 1") == ""
    assert simd_of("") == ""


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_IK, reason="ik-llama-cpp-python not installed")
def test_a_loaded_ik_backend_reports_its_builds_simd():
    from adaspec.models import resolve_gguf

    _, path, _ = resolve_gguf(MODEL, progress=False)
    backend = make_gguf_backend("ik", path, threads=1, max_context=64)
    try:
        assert backend.simd in ("AVX-512", "AVX2", "AVX")  # every x86 build of the runtime reports one of them
        if backend.simd == "AVX-512":
            assert cpu.cpu_simd() == "AVX-512"  # a build running AVX-512 code can only be running on such a CPU
    finally:
        backend.close()
