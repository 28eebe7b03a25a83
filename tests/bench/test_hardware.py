"""Issue 17: synthetic models, roofline hardware profiles, predicted maps, NVML energy and the prepared GPU sweep."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
import torch

from adaspec.bench.hardware import PROFILES, HardwareProfile, bytes_per_param, profile
from adaspec.bench.published import PUBLISHED, predict_published, validate_published
from adaspec.bench.measure import Meter
from adaspec.cli import main
from adaspec.errors import ConfigError
from adaspec.models.synthetic import (SHAPES, SyntheticTokenizer, build_synthetic, is_synthetic, parse_synthetic,
                                      shape, synthetic_config)

REPO = Path(__file__).resolve().parents[2]

# Parameter counts from the Qwen2.5 model cards ("Number of Parameters"), in billions.
QWEN_CARD_PARAMS = {"qwen2.5-0.5b": 0.49, "qwen2.5-1.5b": 1.54, "qwen2.5-3b": 3.09, "qwen2.5-7b": 7.61,
                    "qwen2.5-14b": 14.7, "qwen2.5-32b": 32.5}


@pytest.mark.parametrize("key", sorted(QWEN_CARD_PARAMS))
def test_shape_table_matches_published_parameter_counts(key):
    assert shape(key).total_params / 1e9 == pytest.approx(QWEN_CARD_PARAMS[key], rel=0.01)


@pytest.mark.parametrize("key", ["qwen2.5-7b", "qwen2.5-0.5b", "vicuna-68m", "vicuna-13b"])
def test_built_model_has_the_shape_of_the_table(key):
    """The transformers model built from the config has exactly the table's matrices (norms and biases aside)."""
    with torch.device("meta"):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_config(synthetic_config(parse_synthetic(f"synthetic:{key}")))
    s = SHAPES[key]
    matrices = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2)
    assert matrices == s.total_params
    layer0 = model.model.layers[0]
    assert layer0.self_attn.k_proj.weight.shape == (s.kv_heads * s.head_dim, s.hidden)
    assert layer0.mlp.gate_proj.weight.shape == (s.intermediate, s.hidden)
    assert len(model.model.layers) == s.layers


def test_spec_parsing_and_errors():
    assert parse_synthetic("synthetic:7b").name == "synthetic:qwen2.5-7b"
    assert parse_synthetic("synthetic:qwen2.5-0.5b:layers=2").shape.layers == 2
    assert shape("qwen2.5-coder-1.5b-instruct@ik") == SHAPES["qwen2.5-1.5b"]
    assert shape("synthetic:qwen2.5-0.5b:layers=3").layers == 3
    assert is_synthetic("Synthetic:qwen2.5-7b") and not is_synthetic("qwen2.5-coder-0.5b-instruct")
    with pytest.raises(ConfigError, match="choose synthetic:<shape>.*qwen2.5-0.5b"):
        parse_synthetic("synthetic:gpt-5")
    with pytest.raises(ConfigError, match="layers=N with 1 <= N <= 24"):
        parse_synthetic("synthetic:qwen2.5-0.5b:layers=25")
    with pytest.raises(ConfigError, match="unknown model shape 'bert'"):
        shape("bert")


def test_tokenizer_decodes_every_id_of_the_vocabulary():
    tok = SyntheticTokenizer(extra_ids=0)
    ids = tok("def f(x):", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == "def f(x):"
    assert tok.decode([68 + 256 * 500, 68]) == "AA"  # an id beyond the bytes decodes as byte (id - 3) mod 256
    assert isinstance(tok.decode([151935, 100000, 259]), str)  # any id of a 151,936-token vocabulary decodes
    assert tok.eos_token_id == SyntheticTokenizer.EOS_ID


def test_synthetic_model_runs_speculative_decoding_losslessly():
    """A 1-layer synthetic 0.5B shape through the public API: fp32 greedy speculative output equals plain."""
    from adaspec.api import SpeculativeLM, load_model, make_drafter
    from adaspec.controllers import make_controller

    target = load_model("synthetic:qwen2.5-0.5b:layers=1", dtype="float32", device="cpu", progress=False)
    assert target.name == "synthetic:qwen2.5-0.5b:layers=1"
    assert target.backend.vocab_size == 151936
    plain = SpeculativeLM(target, None, make_controller("fixed", 0))
    spec = SpeculativeLM(target, make_drafter("ngram", target), make_controller("fixed", 4))
    a = plain.generate("def add(a, b):", max_new_tokens=12, chat=False)
    b = spec.generate("def add(a, b):", max_new_tokens=12, chat=False)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 12
    assert b.stats.steps  # it ran speculation steps


def test_synthetic_models_refuse_gguf_runtimes_and_text_quality(tmp_path):
    from adaspec.api import load_model
    from adaspec.bench.profile import profile_workload
    from adaspec.quality.evaluate import run_eval

    with pytest.raises(ConfigError, match="built in PyTorch"):
        load_model("synthetic:qwen2.5-0.5b@llamacpp", progress=False)
    with pytest.raises(ConfigError, match="synthetic model .* adaspec eval measures the text"):
        run_eval(target="synthetic:qwen2.5-7b", draft="ngram", tasks=["gsm8k"], methods=["plain"], limit=1,
                 max_new_tokens=4, out_dir=tmp_path)
    with pytest.raises(ConfigError, match="adaspec profile"):
        profile_workload("humaneval", target="qwen2.5-coder-0.5b-instruct", drafts=["synthetic:qwen2.5-0.5b"])


def test_build_is_seeded():
    a = build_synthetic("synthetic:vicuna-68m", dtype=torch.float32, seed=3)
    b = build_synthetic("synthetic:vicuna-68m", dtype=torch.float32, seed=3)
    assert torch.equal(a.model.layers[1].mlp.up_proj.weight, b.model.layers[1].mlp.up_proj.weight)


# The roofline ---------------------------------------------------------------------------------------------------
def test_roofline_values_by_hand():
    """A 1 GB/s, 1 TFLOP/s machine with no host time: the forward time is exactly the larger of the two terms."""
    s = SHAPES["qwen2.5-0.5b"]
    hw = HardwareProfile("toy", "cpu", 1.0, 1.0, 64, bandwidth_efficiency=1.0, matmul_efficiency=1.0, layer_ms=0.0,
                         forward_ms=0.0)
    memory_ms = (s.matmul_params * 2 + s.kv_bytes_per_token(2) * 100) / 1e9 * 1e3
    assert hw.forward_time_ms(s, 1, 100) == pytest.approx(memory_ms)
    compute_ms = s.flops(4000, 100) / 1e12 * 1e3
    assert compute_ms > memory_ms
    assert hw.forward_time_ms(s, 4000, 100) == pytest.approx(compute_ms)
    assert s.flops(1, 0) == pytest.approx(2 * s.matmul_params + 4 * s.layers * s.hidden)
    gpu = HardwareProfile("toy", "gpu", 1.0, 1.0, 64, bandwidth_efficiency=1.0, matmul_efficiency=1.0,
                          layer_ms=0.5, forward_ms=1.0)
    assert gpu.forward_time_ms(s, 1, 100) == pytest.approx(memory_ms + 1.0)  # GPU: the slower of device and host
    fast_gpu = HardwareProfile("toy", "gpu", 1e6, 1e6, 64, layer_ms=0.5, forward_ms=1.0)
    assert fast_gpu.forward_time_ms(s, 1, 100) == pytest.approx(s.layers * 0.5 + 1.0, rel=1e-3)  # host-bound
    cpu = HardwareProfile("toy", "cpu", 1.0, 1.0, 64, bandwidth_efficiency=1.0, matmul_efficiency=1.0,
                          layer_ms=0.5, forward_ms=1.0)
    assert cpu.forward_time_ms(s, 1, 100) == pytest.approx(memory_ms + s.layers * 0.5 + 1.0)  # CPU: both, in turn
    curve = HardwareProfile("toy", "cpu", 1.0, 1.0, 64, bandwidth_efficiency=1.0, layer_ms=0.0, forward_ms=0.0,
                            matmul_curve=((1, 10.0), (5, 30.0)))
    kv_ms = s.kv_bytes_per_token(2) * 100 / 1e9 * 1e3
    assert curve.forward_time_ms(s, 3, 100) == pytest.approx(20.0 * s.matmul_params / 1e9 + kv_ms)  # interpolated
    assert curve.forward_time_ms(s, 10, 100) == pytest.approx(60.0 * s.matmul_params / 1e9 + kv_ms)  # ∝ n beyond
    assert bytes_per_param("q4_k_m") == pytest.approx(4.85 / 8)
    with pytest.raises(ConfigError, match="unknown dtype 'int3'"):
        bytes_per_param("int3")


def test_verification_is_nearly_free_on_a_gpu_and_not_on_a_small_cpu():
    s = SHAPES["qwen2.5-7b"]
    gpu = profile("h100-sxm", layer_ms=0.0, forward_ms=0.0)
    assert gpu.forward_time_ms(s, 9, 1024) / gpu.forward_time_ms(s, 1, 1024) < 1.05
    cpu = HardwareProfile("2-core", "cpu", 20, 0.05, 24, matmul_efficiency=1.0, layer_ms=0.0, forward_ms=0.0)
    small = SHAPES["qwen2.5-1.5b"]
    assert cpu.forward_time_ms(small, 9, 1024) / cpu.forward_time_ms(small, 1, 1024) > 2.0
    # the speedups the cost model predicts follow: with free drafts (prompt lookup), K = 8 at α = 0.4 pays where
    # verification is free (E[tokens] = 1.67, less 0.1 ms per looked-up token) and loses where it costs 2.85 plain steps
    g, c = gpu.cost_model(s), cpu.cost_model(small)
    expected = (1 - 0.4**9) / 0.6 * gpu.forward_time_ms(s, 1, 1024) / (gpu.forward_time_ms(s, 9, 1024) + 8 * 0.1)
    assert g.speedup(0.4, 8, 1024, "ngram-lookup") == pytest.approx(expected, rel=0.01)
    assert expected > 1.3
    assert c.speedup(0.4, 8, 1024, "ngram-lookup") < 0.7
    assert g.best_k(0.8, 1024, "ngram-lookup")[0] > c.best_k(0.8, 1024, "ngram-lookup")[0]


def test_published_speedups_are_predicted_within_the_stated_error():
    rows = validate_published()
    assert len(rows) == len(PUBLISHED) >= 8
    assert {r["hardware"] for r in rows} == {"rtx-3090", "a100-80gb", "h100-sxm"}
    errors = sorted(abs(r["error"]) for r in rows)
    assert errors[len(errors) // 2] < 0.10  # median
    assert errors[-1] < 0.20
    p = PUBLISHED[0]
    assert predict_published(p) == pytest.approx(rows[0]["predicted"])
    # the vLLM points ran with CUDA graphs: no host time per layer, in predict_published as in validate_published
    h100 = [(p, r) for p, r in zip(PUBLISHED, rows) if r["hardware"] == "h100-sxm"]
    assert len(h100) == 12 and all(p.layer_ms == 0.0 for p, _ in h100)
    p, r = h100[0]
    assert predict_published(p) == pytest.approx(r["predicted"])
    assert predict_published(p) > predict_published(p, profile("h100-sxm"))  # eager host time would cost
    assert max(abs(r["error"]) for _, r in h100) < 0.10
    # an unset override (a CLI flag left out) keeps each point's own host time
    assert validate_published(PUBLISHED[-1:], layer_ms=None)[0]["predicted"] == pytest.approx(rows[-1]["predicted"])


def test_qwen3_shapes_have_128_wide_heads():
    """Qwen3 configs set head_dim = 128 whatever hidden / heads is: q is (heads · 128) × hidden, o its transpose;
    parameter counts match the model cards (Qwen3-32B: 32.8 B, 31.2 B without embeddings; 4B: 4.0 B)."""
    from adaspec.models.synthetic import parse_synthetic, synthetic_config

    s = SHAPES["qwen3-32b"]
    assert s.head_dim == 128 and s.layer_matrices()[0] == (8192, 5120) and s.layer_matrices()[3] == (5120, 8192)
    assert s.total_params / 1e9 == pytest.approx(32.76, abs=0.01)
    assert s.layers * s.layer_params / 1e9 == pytest.approx(31.2, abs=0.05)
    assert SHAPES["qwen3-4b"].total_params / 1e9 == pytest.approx(4.02, abs=0.01)
    assert s.kv_bytes_per_token(2) == 2 * 64 * 8 * 128 * 2
    config = synthetic_config(parse_synthetic("synthetic:qwen3-4b:layers=2"))
    assert type(config).__name__ == "Qwen3Config" and config.head_dim == 128 and config.num_attention_heads == 32


def test_unknown_hardware_names_the_choices():
    with pytest.raises(ConfigError, match="unknown hardware 'tpu'.*rtx-4090.*h200"):
        profile("tpu")
    assert set(PROFILES) >= {"rtx-4090", "a100-80gb", "h100-sxm", "h200", "laptop-cpu"}
    assert all(p.source for p in PROFILES.values())


@pytest.mark.parametrize("key", ["qwen2.5-0.5b", "qwen2.5-7b", "vicuna-68m"])
def test_a_shapes_matrices_are_its_matmul_parameters(key):
    s = SHAPES[key]
    m = s.matrices()
    assert sum(o * i * count for (o, i), count in m.items()) == s.matmul_params
    assert m[(s.vocab, s.hidden)] == 1  # the LM head, once
    assert m[(s.intermediate, s.hidden)] == 2 * s.layers and m[(s.hidden, s.intermediate)] == s.layers


def test_linear_curves_price_a_model_matrix_by_matrix():
    """With a measured curve for every matrix shape of the model, the weights cost Σ count · curve(n) · size; the
    host time per layer loses its 7 linear calls (they are inside the curves); a missing shape falls back to
    ``matmul_curve``."""
    s = SHAPES["qwen2.5-0.5b"]
    kv = s.kv_heads * s.head_dim
    per_gparam = {(s.hidden, s.hidden): 100.0, (kv, s.hidden): 400.0, (s.intermediate, s.hidden): 200.0,
                  (s.hidden, s.intermediate): 250.0, (s.vocab, s.hidden): 300.0}  # ms per 10^9 weights at n = 1
    curves = tuple((d, ((1, v), (5, 3 * v))) for d, v in per_gparam.items())
    hw = HardwareProfile("toy", "cpu", 1.0, 1.0, 64, bandwidth_efficiency=1.0, layer_ms=0.5, forward_ms=0.0,
                         matmul_curve=((1, 10.0), (5, 30.0)), linear_curves=curves, linear_call_ms=0.01)
    by_hand = (s.layers * (2 * s.hidden ** 2 * 100.0 + 2 * kv * s.hidden * 400.0 + 2 * s.intermediate * s.hidden
                           * 200.0 + s.hidden * s.intermediate * 250.0) + s.vocab * s.hidden * 300.0) / 1e9
    kv_ms = s.kv_bytes_per_token(2) * 100 / 1e9 * 1e3
    host = s.layers * (0.5 - 7 * 0.01)
    assert hw.linear_ms(s, 1) == pytest.approx(by_hand)
    assert hw.forward_time_ms(s, 1, 100) == pytest.approx(by_hand + kv_ms + host)
    assert hw.forward_time_ms(s, 3, 100) == pytest.approx(2 * by_hand + kv_ms + host)  # interpolated: 2x at n = 3
    other = SHAPES["qwen2.5-1.5b"]  # no curve of its own: the per-10^9-weights curve, full host time per layer
    assert hw.linear_ms(other, 1) is None
    assert hw.forward_time_ms(other, 1, 100) == pytest.approx(10.0 * other.matmul_params / 1e9
                                                               + other.kv_bytes_per_token(2) * 100 / 1e6
                                                               + other.layers * 0.5)


def test_layer_curves_price_a_model_layer_by_layer():
    """With a measured curve for the model's decoder layer (its 7 matrices in order) and one for its LM head, the
    weights cost layers · layer(n) + head(n); a layer without its head curve, or another model's layer, falls back
    to matrix by matrix."""
    s = SHAPES["qwen2.5-0.5b"]
    head = (s.vocab, s.hidden)
    per_gparam = {d: 100.0 for d in s.matrices()}
    curves = tuple((d, ((1, v), (5, 3 * v))) for d, v in per_gparam.items())
    layer = ((1, 2.0), (5, 4.0))  # ms per layer
    hw = HardwareProfile("toy", "cpu", 1.0, 1.0, 64, bandwidth_efficiency=1.0, layer_ms=0.5, forward_ms=0.0,
                         linear_curves=curves, linear_call_ms=0.01, layer_curves=((s.layer_matrices(), layer),))
    head_ms = head[0] * head[1] * 100.0 / 1e9
    assert hw.linear_ms(s, 1) == pytest.approx(s.layers * 2.0 + head_ms)
    assert hw.linear_ms(s, 3) == pytest.approx(s.layers * 3.0 + 2 * head_ms)  # both curves interpolated at n = 3
    by_matrix = sum(count * 100.0 * o * i for (o, i), count in s.matrices().items()) / 1e9
    no_head = HardwareProfile("toy", "cpu", 1.0, 1.0, 64, linear_curves=tuple(c for c in curves if c[0] != head),
                              layer_curves=hw.layer_curves)
    assert no_head.linear_ms(s, 1) is None
    other_layer = HardwareProfile("toy", "cpu", 1.0, 1.0, 64, linear_curves=curves,
                                  layer_curves=((SHAPES["qwen2.5-1.5b"].layer_matrices(), layer),))
    assert other_layer.linear_ms(s, 1) == pytest.approx(by_matrix)


def test_overhead_curves_price_the_rest_of_a_cpu_forward():
    """With a measured overhead curve for the model, a CPU batch-1 forward costs matrices + overhead(n, L),
    interpolated in n and in L and extrapolated linearly in L; without one (or at batch 2, or on a GPU), the
    host-per-layer and KV-read terms as before."""
    from adaspec.bench.hardware import _interpolate_2d

    s = SHAPES["qwen2.5-0.5b"]
    head = (s.vocab, s.hidden)
    curves = tuple((d, ((1, 100.0), (5, 300.0))) for d in s.matrices())
    layer = ((1, 2.0), (5, 4.0))
    over = ((1, 128, 6.0), (5, 128, 10.0), (1, 1024, 8.0), (5, 1024, 14.0))
    hw = HardwareProfile("toy", "cpu", 1.0, 1.0, 64, bandwidth_efficiency=1.0, layer_ms=0.5, forward_ms=0.25,
                         linear_curves=curves, linear_call_ms=0.01, layer_curves=((s.layer_matrices(), layer),),
                         overhead_curves=((s, over),))
    matrices = s.layers * 2.0 + head[0] * head[1] * 100.0 / 1e9
    assert hw.forward_time_ms(s, 1, 128) == pytest.approx(matrices + 6.0 + 0.25)
    assert _interpolate_2d(over, 3, 128) == pytest.approx(8.0)
    assert _interpolate_2d(over, 1, 576) == pytest.approx(7.0)
    assert _interpolate_2d(over, 5, 1920) == pytest.approx(18.0)  # beyond the last context: the line continued
    assert _interpolate_2d(over, 1, 0) == pytest.approx(6.0 - 2.0 / 896 * 128)
    without = HardwareProfile("toy", "cpu", 1.0, 1.0, 64, bandwidth_efficiency=1.0, layer_ms=0.5, forward_ms=0.25,
                              linear_curves=curves, linear_call_ms=0.01, layer_curves=hw.layer_curves)
    kv_ms = s.kv_bytes_per_token(4) * 128 / 1e9 * 1e3
    assert without.forward_time_ms(s, 1, 128, dtype="float32") == pytest.approx(
        matrices + kv_ms + s.layers * (0.5 - 7 * 0.01) + 0.25)
    assert hw.forward_time_ms(s, 1, 128, dtype="float32", batch=2) == \
        pytest.approx(without.forward_time_ms(s, 1, 128, dtype="float32", batch=2))
    gpu = HardwareProfile("toy", "gpu", 1.0, 1.0, 64, bandwidth_efficiency=1.0, layer_ms=0.5, forward_ms=0.25,
                          linear_curves=curves, linear_call_ms=0.01, layer_curves=hw.layer_curves,
                          overhead_curves=hw.overhead_curves)
    assert gpu.forward_time_ms(s, 1, 128) != pytest.approx(matrices + 6.0 + 0.25)  # a GPU keeps max(device, host)
    empty = HardwareProfile("toy", "cpu", 1.0, 1.0, 64, bandwidth_efficiency=1.0, layer_ms=0.5, forward_ms=0.25,
                            linear_curves=curves, linear_call_ms=0.01, layer_curves=hw.layer_curves,
                            overhead_curves=((s, ()),))
    assert empty.forward_time_ms(s, 1, 128) == pytest.approx(without.forward_time_ms(s, 1, 128))
    other = SHAPES["qwen2.5-1.5b"]  # no overhead curve of its own
    assert hw.forward_time_ms(other, 1, 128) == pytest.approx(without.forward_time_ms(other, 1, 128))


def test_matmul_free_model_runs_every_operator_but_the_matrices():
    """The stand-in model has no linear layer or embedding left, computes logits of the right shape with the
    TorchBackend, and keeps its KV cache as the real model does."""
    from adaspec.backends.torch_backend import TorchBackend
    from adaspec.bench.hardware_measure import _matmul_free_model, measure_overhead_curve

    s = SHAPES["qwen2.5-0.5b"]
    model, stubs = _matmul_free_model(s, torch.float32, "cpu")
    assert not any(isinstance(m, torch.nn.Linear | torch.nn.Embedding) for m in model.modules())
    assert [tuple(st.weight.shape) for st in stubs] == [*s.layer_matrices(), (s.vocab, s.hidden)]
    params = sum(p.numel() for p in model.parameters())
    assert params == (2 * s.layers + 1) * s.hidden  # the RMSNorm weights only
    backend = TorchBackend(model, max_context=64)
    logits = backend.forward([1, 2, 3, 4, 5], 3)
    assert logits.shape == (3, s.vocab) and backend.seq_len == 5
    assert backend._cache.layers[0].keys.shape[-2] == 5
    tiny = SHAPES["vicuna-68m"]
    curve = measure_overhead_curve(tiny, widths=(1, 3), contexts=(8, 32), repeats=1)
    assert [(n, ctx) for n, ctx, _ in curve] == [(1, 8), (1, 32), (3, 8), (3, 32)]
    assert all(ms >= 0 for *_, ms in curve)


def test_layer_matrices_are_one_layer_in_forward_order():
    s = SHAPES["qwen2.5-0.5b"]
    kv = s.kv_heads * s.head_dim
    assert s.layer_matrices() == ((896, 896), (kv, 896), (kv, 896), (896, 896), (4864, 896), (4864, 896),
                                  (896, 4864))
    assert sum(o * i for o, i in s.layer_matrices()) == s.layer_params


def test_measure_layer_curve_streams_enough_layers(monkeypatch):
    from adaspec.bench import hardware_measure
    from adaspec.errors import ConfigError

    made = []
    real = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *a, **k: made.append(a) or real(*a, **k))
    mats = ((64, 32), (16, 32), (32, 64))
    size = sum(o * i for o, i in mats)
    curve = hardware_measure.measure_layer_curve(mats, widths=(1, 4), repeats=2, stream_bytes=size * 4 * 6)
    assert [n for n, _ in curve] == [1, 4] and all(v > 0 for _, v in curve)
    assert [made.count(m) for m in mats] == [6, 6, 6]  # six copies of the layer, every matrix of it
    assert made.count((4, 32)) == 1 and made.count((4, 64)) == 1  # one input per in_features and width
    with pytest.raises(ConfigError, match="at least one"):
        hardware_measure.measure_layer_curve(())


def test_measure_linear_curve_streams_enough_copies(monkeypatch):
    from adaspec.bench import hardware_measure

    made = []
    real = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *a, **k: made.append(a) or real(*a, **k))
    curve = hardware_measure.measure_linear_curve(64, 32, widths=(1, 3), repeats=2, stream_bytes=64 * 32 * 4 * 10)
    assert [n for n, _ in curve] == [1, 3] and all(v > 0 for _, v in curve)
    assert made.count((64, 32)) == 10  # ten distinct copies of the matrix pass 10 matrices' worth of bytes
    made.clear()
    hardware_measure.measure_linear_curve(64, 32, widths=(1,), repeats=1, stream_bytes=1)
    assert made.count((64, 32)) == 1


def test_predicted_report(tmp_path):
    from adaspec.bench.predicted import predicted_report

    out = predicted_report("a100-80gb", "vicuna-7b", ["vicuna-68m", "ngram"], tmp_path / "p.md", dtype="float16")
    md = (tmp_path / "p.md").read_text()
    assert md.startswith("# PREDICTED boundary map: vicuna-7b on a100-80gb")
    assert "| vicuna-68m | 512 |" in md and "| ngram-lookup | 512 |" in md
    assert "| 4096 |" not in md  # beyond the 2,048-token window of the Vicuna shapes
    assert "| Spec-Bench leaderboard | vicuna-7b | SpS | 5 | 2.28 | 1.49× | 1.41× | -5.4% |" in md
    assert all(p.exists() and p.stat().st_size > 10_000 for p in out["figures"].values())
    with pytest.raises(ConfigError, match="does not fit in rtx-4090's 24 GiB"):
        predicted_report("rtx-4090", "32b", ["ngram"], tmp_path / "q.md")


def test_predicted_report_checks_measured_micro_rows(tmp_path):
    from adaspec.bench.predicted import predicted_report

    hw = profile("h200")
    s = SHAPES["qwen2.5-1.5b"]
    rows = [{"kind": "micro", "measure": "forward", "dtype": "bfloat16", "model": "synthetic:qwen2.5-1.5b",
             "role": "target", "batch": 1, "n": n, "context": 512,
             "ms": hw.forward_time_ms(s, n, 512) * 1.25} for n in (1, 5)]
    rows.append({**rows[0], "model": "synthetic:qwen2.5-1.5b:layers=2"})  # another shape: left out
    results = tmp_path / "r.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = predicted_report("h200", "synthetic:qwen2.5-1.5b", ["ngram"], tmp_path / "p.md", measured=[results])
    assert [c["n"] for c in out["checks"]] == [1, 5]
    assert all(c["error"] == pytest.approx(1 / 1.25 - 1) for c in out["checks"])
    assert "median |error| **20.0%** over 2 forwards" in (tmp_path / "p.md").read_text()
    with pytest.raises(ConfigError, match="no micro measurements of a 7b model"):
        predicted_report("h200", "7b", ["ngram"], tmp_path / "q.md", measured=[results])


def test_replay_prices_measured_steps_on_another_machine(tmp_path):
    """Measured steps keep what they emitted and verified; their times come from the cost model: a fake machine
    where T(n) = 10 + n ms and a draft-model token costs 2 ms, lookup 0.5 ms."""
    from adaspec.bench.predicted import predicted_report, replay_steps

    class Cost:
        def verify_ms(self, n, context):
            return 10.0 + n

        def draft_ms(self, drafter, context):
            return {"ngram-lookup": 0.5, "0.5b": 2.0}[drafter]

    def step(k, drafted, emitted, drafter, tree=False):
        return {"k": k, "drafted": drafted, "accepted": emitted - 1, "emitted": emitted, "context_len": 300,
                "drafter": drafter if drafted else "", "tree": tree}

    rows = [{"method": "plain", "decode_ms": 1000.0, "decode_tokens": 10, "step_records": [step(0, 0, 1, "")] * 3},
            {"method": "ngram-tree/fixed:4+tree:8:always", "decode_ms": 400.0, "decode_tokens": 10,
             "step_records": [step(4, 8, 5, "ngram-tree", True), step(4, 4, 2, "ngram-tree", True), step(0, 0, 1, "")]},
            {"method": "draft/fixed:2", "decode_ms": 500.0, "decode_tokens": 10,
             "step_records": [step(2, 2, 3, "qwen2.5-coder-0.5b-instruct")]},
            {"method": "draft/fixed:2+short", "decode_ms": 500.0, "decode_tokens": 10,
             "step_records": [step(2, 1, 2, "qwen2.5-coder-0.5b-instruct")]}]  # a chain that stopped early
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = {r["method"]: r for r in replay_steps(Cost(), [path], draft="0.5b")}
    assert out["plain"]["predicted"] == pytest.approx(1.0) and out["plain"]["tau"] is None
    tree = out["ngram-tree/fixed:4+tree:8:always"]
    # plain: 8 tokens x 11 ms; the steps: (0.5 + 19) + (0.5 + 15) + 11
    assert tree["predicted"] == pytest.approx(8 * 11 / (19.5 + 15.5 + 11))
    assert (tree["tau"], tree["nodes"], tree["tree_steps"], tree["measured"]) == (3.5, 6.0, 2, 2.5)
    assert out["draft/fixed:2"]["predicted"] == pytest.approx(3 * 11 / (2 * 2.0 + 13))  # 2 draft forwards + T(3)
    assert out["draft/fixed:2+short"]["predicted"] == pytest.approx(2 * 11 / (1 * 2.0 + 12))  # stopped after 1
    with pytest.raises(ConfigError, match="need a draft model shape"):
        replay_steps(Cost(), [path])
    empty = tmp_path / "e.jsonl"
    empty.write_text(json.dumps({"method": "plain"}) + "\n")
    with pytest.raises(ConfigError, match="no adaspec compare rows with step records"):
        replay_steps(Cost(), [empty])
    # in the report: trees priced on an H200, where a 9-token forward costs about what a 5-token one does
    out = predicted_report("h200", "7b", ["0.5b", "ngram"], tmp_path / "p.md", replay=[path])
    md = (tmp_path / "p.md").read_text()
    assert "## Measured speculation steps replayed on h200 (PREDICTED)" in md
    assert "| ngram-tree/fixed:4+tree:8:always | 1 | 3.50 | 6.00 | 2 |" in md
    assert {r["method"] for r in out["replay"]} == {"plain", "ngram-tree/fixed:4+tree:8:always", "draft/fixed:2",
                                                    "draft/fixed:2+short"}


def test_map_cli_hardware(tmp_path, capsys):
    assert main(["map", "--hardware", "h200", "--shape", "7b", "--report", str(tmp_path / "h.md")]) == 0
    assert "PREDICTED" in capsys.readouterr().out
    assert main(["map", "--hardware", "tpu-v9", "--report", str(tmp_path / "x.md")]) == 2
    assert "unknown hardware 'tpu-v9'" in capsys.readouterr().err
    assert main(["map", "--report", str(tmp_path / "x.md")]) == 2
    assert "needs results files" in capsys.readouterr().err
    assert main(["map", "--hardware", "h200", "--shape", "gpt-9", "--report", str(tmp_path / "x.md")]) == 2
    assert "unknown model shape 'gpt-9'" in capsys.readouterr().err


def test_this_cpu_refuses_a_target_too_big_before_timing_its_matrices(monkeypatch, tmp_path):
    from adaspec.bench import predicted

    monkeypatch.setattr(predicted, "ram_bytes", lambda: 16 * 2**30)
    monkeypatch.setattr(predicted, "measure_profile", lambda **kw: pytest.fail("measured a model that cannot fit"))
    with pytest.raises(ConfigError, match=r"32b in bfloat16 \(32\.\d B parameters\) does not fit in this-cpu's 16 GiB"):
        predicted.predicted_report("this-cpu", "32b", ["ngram"], tmp_path / "p.md")


# Energy ---------------------------------------------------------------------------------------------------------
def test_meter_reads_nvml_energy(monkeypatch, tmp_path):
    counters = {0: 1_000_000, 1: 2_000_000}  # mJ
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 2, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetTotalEnergyConsumption=lambda h: counters[h])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    meter = Meter(tmp_path, gpu=True)
    assert meter.energy_source == "NVML total energy (2 GPUs)"
    meter.start()
    counters[0] += 1500
    counters[1] += 2500
    assert meter.stop().energy_j == pytest.approx(4.0)
    cpu = Meter(tmp_path)  # a CPU run never reads the GPUs
    assert cpu.nvml is None and cpu.energy_source.startswith("not measurable here")


def test_meter_without_an_nvml_counter(monkeypatch, tmp_path):
    def unsupported(h):
        raise RuntimeError("NVMLError_NotSupported")

    fake = types.SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 1,
                                 nvmlDeviceGetHandleByIndex=lambda i: i,
                                 nvmlDeviceGetTotalEnergyConsumption=unsupported)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    meter = Meter(tmp_path, gpu=True)
    assert meter.nvml is None and "no NVML energy counter" in meter.energy_source
    meter.start()
    assert meter.stop().energy_j is None


# The prepared GPU sweep -----------------------------------------------------------------------------------------
def test_gpu_sweep_config_expands_to_a_bounded_grid():
    from adaspec.bench.grid import build_config, expand

    cfg = build_config(config_file=REPO / "configs" / "gpu-sweep.toml", preset_name=None, overrides=[])
    points = expand(cfg)
    assert len(points) == 33
    assert {p.setting.target for p in points} == {"synthetic:qwen2.5-7b"}
    assert cfg["bench"]["device"] == "cuda" and cfg["bench"]["batch"] == [1]
    assert {p.alpha for p in points} == {0.5, 0.7, 0.8, 0.9}
    assert {p.context for p in points} == {512, 2048, 8192}
