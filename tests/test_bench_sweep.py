"""Sweeps: config handling, token-exact prompts, the prefix cache, records, and resume after a stop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from bench_tiny import ByteTokenizer, tiny_loader, tiny_model

from adaspec.backends import TorchBackend
from adaspec.bench.grid import apply_override, build_config, expand, normalize, point_key, preset, read_config_file
from adaspec.bench.measure import NOT_MEASURABLE, Meter, rapl_domains
from adaspec.bench.prompts import ContextBuilder, hf_builder
from adaspec.bench.sweep import PrefixCacheBackend, run_bench
from adaspec.compare import read_results
from adaspec.errors import ConfigError

CORPUS = " ".join(f"Sentence number {i} of some real looking background text." for i in range(400))


def tiny_config(**bench) -> dict:
    return normalize({
        "bench": {"target": "tiny-target", "dtype": ["float32"], "threads": [1], "max_new_tokens": 12,
                  "plain_every": 2, "workload": "tiny", **bench},
        "micro": {"contexts": [96, 160], "verify_tokens": [1, 3, 5], "repeats": 2, "drafts": ["tiny-draft"]},
        "sweep": [
            {"name": "alpha-k", "drafter": ["calibrated"], "alpha": [0.5, 0.9], "cost": ["0.5", "tiny-draft"],
             "k": [2, 4], "context": [96]},
            {"name": "real", "drafter": ["tiny-draft", "ngram"], "k": [3], "controller": ["fixed", "adaptive"],
             "context": [160], "temperature": [0.0, 0.8]},
        ]})


@pytest.fixture
def corpus(monkeypatch):
    monkeypatch.setattr("adaspec.bench.prompts.corpus_text", lambda max_chars=600_000: CORPUS)


def run(cfg: dict, out: Path, **kw) -> dict:
    return run_bench(cfg, out, loader=tiny_loader, tasks=["Write a function that adds two numbers."],
                     progress=False, **kw)


def test_presets_and_overrides(tmp_path):
    quick = build_config(preset_name="quick")
    assert {s["name"] for s in quick["sweep"]} == {"alpha-k", "context-k", "real"}
    assert max(quick["micro"]["contexts"]) <= 4096
    full = build_config(preset_name="full")
    assert max(full["micro"]["contexts"]) == 16384 and "float32" in full["bench"]["dtype"]
    cfg = build_config(preset_name="quick", overrides=['bench.dtype=["float32"]', "sweep.alpha-k.k=[2]",
                                                       "micro.repeats=5"], sweeps=["alpha-k"])
    assert cfg["bench"]["dtype"] == ["float32"] and cfg["micro"]["repeats"] == 5
    assert [s["name"] for s in cfg["sweep"]] == ["alpha-k"] and cfg["sweep"][0]["k"] == [2]
    with pytest.raises(ConfigError):
        apply_override(preset("quick"), "nonsense")
    with pytest.raises(ConfigError):
        build_config(preset_name="quick", sweeps=["nope"])
    with pytest.raises(ConfigError):
        normalize({"bench": {"backend": ["llama.cpp"]}})
    with pytest.raises(ConfigError):
        normalize({"sweep": [{"name": "x", "k": [0]}]})
    toml = tmp_path / "c.toml"
    toml.write_text('preset = "quick"\n[bench]\nthreads = [1]\n[[sweep]]\nname = "only"\nk = [3]\n')
    cfg = normalize(read_config_file(toml))
    assert cfg["bench"]["threads"] == [1] and [s["name"] for s in cfg["sweep"]] == ["only"]
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("bench:\n  threads: 1\nsweep:\n  - name: y\n    alpha: 0.5\n")
    cfg = normalize(read_config_file(yaml_file))
    assert cfg["bench"]["threads"] == [1] and cfg["sweep"][0]["alpha"] == [0.5]


def test_expand_dedupes_and_keys_are_stable():
    cfg = tiny_config()
    points = expand(cfg)
    # alpha-k: 2 α × 2 costs × 2 K; real: 2 drafters × 2 controllers × 2 temperatures.
    assert len(points) == 8 + 8
    keys = [point_key(p, cfg["bench"]) for p in points]
    assert len(set(keys)) == len(keys)
    assert keys == [point_key(p, cfg["bench"]) for p in expand(tiny_config())]
    # The calibrated drafter is greedy-only: temperature > 0 drops its points.
    cfg2 = normalize({"sweep": [{"name": "c", "drafter": ["calibrated"], "temperature": [0.0, 0.7]}]})
    assert len(expand(cfg2)) == 1


def test_context_builder_is_token_exact_and_real_text():
    tok = ByteTokenizer()
    builder = ContextBuilder(lambda s: tok(s)["input_ids"], lambda m: f"<user>{m}</user><assistant>", CORPUS)
    for length in (300, 1000, 2048):
        ids = builder.build("Add two numbers.", length)
        assert len(ids) == length
        text = tok.decode(ids)
        assert text.startswith("<user>Background material") and text.endswith("Add two numbers.</user><assistant>")
        assert "Sentence number 0 of some real looking background text." in text
    # A task longer than the context keeps the whole task.
    assert len(builder.build("x" * 500, 100)) > 100
    assert hf_builder(tok).template is None


def test_real_corpus_is_available():
    from adaspec.bench.prompts import corpus_text

    text = corpus_text()
    assert len(text) > 100_000 and "def " in text


def test_prefix_cache_backend_reuses_and_matches_a_fresh_prefill():
    model = tiny_model(5)
    fresh = TorchBackend(model, "fresh")
    cached = PrefixCacheBackend(TorchBackend(model, "cached"))
    prompt = list(range(1, 60))
    cached.forward(prompt + [7, 8, 9], 1)
    cached.reset()
    got = cached.forward(prompt, 1)
    assert cached.reused_tokens == len(prompt) - 1
    want = fresh.forward(prompt, 1)
    assert torch.allclose(got, want, atol=1e-4)
    assert cached.forward([3], 1).shape == fresh.forward([3], 1).shape
    assert torch.allclose(cached.forward([4, 5], 2), fresh.forward([4, 5], 2), atol=1e-4)
    cached.truncate(len(prompt))
    fresh.truncate(len(prompt))
    assert cached.seq_len == len(prompt)
    cached.drop()
    assert cached.seq_len == 0


def test_sweep_records_and_resume(tmp_path, corpus, monkeypatch):
    from adaspec.engine import SpeculativeEngine

    out = tmp_path / "bench.jsonl"
    cfg = tiny_config()
    # A time limit of 0 s starts nothing.
    assert run(cfg, out, time_limit_s=0.0)["stopped"]
    # Kill the run (Ctrl-C) in the middle of its 12th generation.
    generate = SpeculativeEngine.generate
    calls = {"n": 0}

    def dying(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 12:
            raise KeyboardInterrupt
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(SpeculativeEngine, "generate", dying)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, out)
    monkeypatch.setattr(SpeculativeEngine, "generate", generate)
    finished = {r["key"] for r in read_results(out) if r["kind"] == "point"}
    assert 0 < len(finished) < 16
    # A half-written last line (a kill mid-write) is ignored on resume.
    with open(out, "a") as f:
        f.write('{"kind": "point", "key": "trunc')
    second = run(cfg, out)
    assert not second["stopped"] and second["done"] == len(finished) and second["run"] == 16 - len(finished)
    rows = read_results(out)
    points = [r for r in rows if r["kind"] == "point"]
    assert len(points) == 16 and len({r["key"] for r in points}) == 16
    assert {r["key"] for r in points} == {point_key(p, cfg["bench"]) for p in expand(cfg)}
    # Micro-measurements were taken once, not again on resume.
    micro_keys = {r["micro_key"] for r in rows if r["kind"] == "micro"}
    assert len(micro_keys) == 2  # target forwards, draft forwards
    assert sum(1 for r in rows if r["kind"] == "micro" and r["measure"] == "forward") == 2 * 3 + 2
    # TTFT comes from the micro prefill (the prompts reuse its cached prefix) unless prefix_cache is off.
    assert {r["ttft_source"] for r in points} == {"micro prefill"}
    # Every point carries what the issue asks for.
    for r in points:
        for field in ("speedup", "speedup_e2e", "tokens_per_s", "ttft_ms", "tpot_ms", "rss_bytes", "peak_rss_bytes",
                      "draft_param_bytes", "draft_kv_bytes", "energy_source", "cpu_s_per_token", "alpha", "alpha_l",
                      "tau", "predicted_speedup", "plain_key", "step_draft_ms", "step_verify_ms"):
            assert field in r, field
        assert r["speedup"] > 0 and r["new_tokens"] == 12
        if r["temperature"] == 0:
            assert r["identical_to_plain"]  # fp32: speculative output equals plain greedy output
        if r["drafter"] == "tiny-draft":
            assert r["draft_param_bytes"] > 0
    assert all(r["prompt_tokens"] == r["context"] for r in points)
    # Nothing left: a third run measures nothing.
    assert run(cfg, out)["run"] == 0
    again = read_results(out)
    assert len([r for r in again if r["kind"] == "point"]) == 16
    json.dumps(again)  # JSON-clean (no NaN objects etc. that would break readers)


def test_cold_prefill_without_prefix_cache(tmp_path, corpus):
    cfg = tiny_config(prefix_cache=False)
    cfg["sweep"] = [dict(cfg["sweep"][0], alpha=[0.9], cost=["0.5"], k=[2])]
    out = tmp_path / "cold.jsonl"
    assert run(cfg, out)["run"] == 1
    (point,) = [r for r in read_results(out) if r["kind"] == "point"]
    assert point["ttft_source"] == "measured cold prefill" and point["ttft_ms"] > 0


def test_energy_meter_says_when_it_cannot_measure(tmp_path):
    assert rapl_domains(tmp_path / "nothing") == []
    meter = Meter(tmp_path / "nothing")
    assert meter.energy_source == NOT_MEASURABLE
    meter.start()
    reading = meter.stop()
    assert reading.energy_j is None and reading.cpu_s >= 0
    # A fake RAPL tree is read, with counter wrap-around.
    d = tmp_path / "rapl" / "intel-rapl:0"
    d.mkdir(parents=True)
    (d / "energy_uj").write_text("999000000")
    (d / "max_energy_range_uj").write_text("1000000000")
    (tmp_path / "rapl" / "intel-rapl:0:0").mkdir()
    meter = Meter(tmp_path / "rapl")
    assert meter.energy_source.startswith("RAPL")
    meter.start()
    (d / "energy_uj").write_text("1000000")
    assert meter.stop().energy_j == pytest.approx(2.0)


def test_bench_cli_dry_run(capsys):
    from adaspec.cli import main

    assert main(["bench", "--quick", "--dtype", "float32", "--sweeps", "alpha-k", "--dry-run"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert lines and {x["dtype"] for x in lines} == {"float32"} and {x["sweep"] for x in lines} == {"alpha-k"}
    assert main(["bench", "--dry-run"]) == 2  # neither a preset nor a config
