"""Sweeps: config handling, token-exact prompts, the prefix cache, records, and resume after a stop."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from bench_tiny import ByteTokenizer, tiny_loader, tiny_model

from adaspec.backends import TorchBackend
from adaspec.backends.prefix_cache import PrefixCacheBackend
from adaspec.bench.grid import (Setting, apply_override, build_config, expand, normalize, point_key, preset,
                                read_config_file)
from adaspec.bench.measure import NOT_MEASURABLE, Meter, rapl_domains
from adaspec.bench.prompts import ContextBuilder, hf_builder
from adaspec.bench.loading import context_needed, on_backend
from adaspec.bench.sweep import run_bench
from adaspec.bench.results import read_results
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
    with pytest.raises(ConfigError, match="unknown backend 'llama.cpp'"):
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


def test_real_corpus_is_available(monkeypatch, tmp_path):
    """The padding corpus comes from the data shipped in the package: no ADASPEC_DATA, nothing beside the cwd."""
    import adaspec
    from adaspec.bench.prompts import corpus_text
    from adaspec.workloads import data_dir

    monkeypatch.delenv("ADASPEC_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    assert data_dir() == Path(adaspec.__file__).parent / "data"
    corpus_text.cache_clear()
    text = corpus_text()
    corpus_text.cache_clear()
    with open(data_dir() / "spec_bench_questions.jsonl", encoding="utf-8") as f:
        first = next(row for row in map(json.loads, f) if row["category"] in ("summarization", "rag"))
    assert len(text) == 600_000 and text.startswith(first["turns"][0]) and "#### " in text  # GSM8K answers follow


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


def test_draft_model_prefill_stays_out_of_the_timed_runs(tmp_path, corpus, monkeypatch):
    """The draft model is fed the prompt before the group's timed runs (charged to the end-to-end speedup), so a
    point's decode time holds drafting and verification only, never the draft model's prefill."""
    from adaspec.engine import SpeculativeEngine

    cfg = tiny_config()
    cfg["sweep"] = [dict(cfg["sweep"][1], controller=["fixed"], temperature=[0.0], drafter=["tiny-draft"])]
    fed: list[tuple[bool, str, int]] = []  # (inside a timed generate, model, tokens fed)
    timed = {"on": False}
    generate, forward = SpeculativeEngine.generate, TorchBackend.forward

    def timed_generate(self, *args, **kwargs):
        timed["on"] = True
        try:
            return generate(self, *args, **kwargs)
        finally:
            timed["on"] = False

    def logged_forward(self, input_ids, num_logits=1):
        fed.append((timed["on"], self.name, len(input_ids)))
        return forward(self, input_ids, num_logits)

    monkeypatch.setattr(SpeculativeEngine, "generate", timed_generate)
    monkeypatch.setattr(TorchBackend, "forward", logged_forward)
    assert run(cfg, tmp_path / "b.jsonl")["run"] == 1
    (point,) = [r for r in read_results(tmp_path / "b.jsonl") if r["kind"] == "point"]
    assert point["speculation_steps"] > 0 and point["draft_prefill_ms"] > 0
    draft_in_run = [n for on, name, n in fed if on and name == "tiny-draft"]
    assert draft_in_run and max(draft_in_run) <= 3  # the last prompt token / correction + last accepted token


def test_draft_prefill_is_cold_without_an_estimate_and_skipped_beyond_the_draft_window(tmp_path, corpus, monkeypatch):
    from adaspec.bench.loading import prefill_draft
    from adaspec.drafters import ModelDrafter

    # No micro-measurement of the draft model: each group's draft prefill is measured from an empty cache.
    cfg = tiny_config()
    cfg["micro"]["drafts"] = []
    cfg["sweep"] = [dict(cfg["sweep"][1], controller=["fixed"], temperature=[0.0], drafter=["tiny-draft"],
                         context=[300, 160])]
    fed: list[tuple[str, int, int]] = []  # (model, cache length before, tokens fed)
    forward = TorchBackend.forward

    def logged_forward(self, input_ids, num_logits=1):
        fed.append((self.name, self.seq_len, len(input_ids)))
        return forward(self, input_ids, num_logits)

    monkeypatch.setattr(TorchBackend, "forward", logged_forward)
    assert run(cfg, tmp_path / "b.jsonl")["run"] == 2
    assert ("tiny-draft", 0, 299) in fed and ("tiny-draft", 0, 159) in fed  # both prompts from an empty cache
    # A prompt the draft model's window cannot hold is not fed (the drafter would not draft from it).
    small = ModelDrafter(PrefixCacheBackend(TorchBackend(tiny_model(1, 1), "small", max_context=64)))
    assert prefill_draft(small, list(range(100))) < 50 and small.backend.inner.seq_len == 0
    prefill_draft(small, list(range(40)))
    assert small.backend.inner.seq_len == 39


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


def test_llamacpp_settings_expand_once_per_thread_count():
    cfg = tiny_config(backend=["torch", "llamacpp"], dtype=["bfloat16", "float32"], threads=[1, 2])
    settings = list(dict.fromkeys(p.setting for p in expand(cfg)))
    # PyTorch: every dtype × threads; llama.cpp runs the GGUF as it is, so the dtype axis collapses to "gguf".
    assert settings == [Setting("tiny-target", d, t, "torch", 1) for d in ("bfloat16", "float32") for t in (1, 2)] \
        + [Setting("tiny-target", "gguf", t, "llamacpp", 1) for t in (1, 2)]
    # layer-skip self-drafting needs a PyTorch target: its points exist on torch settings only
    skip = tiny_config(backend=["torch", "llamacpp"])
    skip["sweep"] = [dict(skip["sweep"][1], drafter=["layerskip:1", "ngram"])]
    assert {(p.setting.backend, p.drafter) for p in expand(skip)} == {
        ("torch", "layerskip:1"), ("torch", "ngram"), ("llamacpp", "ngram")}
    gguf = Setting("t", "gguf", 2, "llamacpp", 1)
    assert on_backend("qwen", gguf) == "qwen@llamacpp" and on_backend("qwen@llamacpp", gguf) == "qwen@llamacpp"
    with pytest.raises(ConfigError, match="qwen@torch: adaspec bench puts every model of a setting on the "
                                          "setting's backend \\(llamacpp\\)"):
        on_backend("qwen@torch", gguf)
    mixed = tiny_config(backend=["llamacpp"])
    mixed["micro"]["drafts"] = ["tiny-draft@torch"]
    with pytest.raises(ConfigError, match="tiny-draft@torch"):  # refused before anything is loaded or measured
        run_bench(mixed, Path("unused.jsonl"), loader=tiny_loader, progress=False)
    assert [on_backend(s, gguf) for s in ("ngram", "calibrated")] == ["ngram", "calibrated"]
    assert on_backend("qwen", Setting("t", "float32", 2, "torch", 1)) == "qwen"
    # room for the longest micro context + widest verify, and the longest prompt + new tokens + K, + 64 spare
    assert context_needed(cfg) == max(160 + 5 + 1, 160 + 12 + 3 + 1, 96 + 12 + 4 + 1) + 64


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python not installed")
def test_sweep_on_the_llamacpp_backend(tmp_path, corpus):
    """The backend axis: a real GGUF (smollm2-135m-instruct, Q4_1) swept at 1 and 2 threads, loaded once."""
    from adaspec.bench.report import make_report

    model = "smollm2-135m-instruct"
    cfg = normalize({
        "bench": {"target": model, "backend": ["llamacpp"], "dtype": ["bfloat16"], "threads": [1, 2],
                  "max_new_tokens": 8, "workload": "tiny", "chat": False},
        "micro": {"contexts": [64, 128], "verify_tokens": [1, 3], "repeats": 1, "drafts": [model]},
        "sweep": [{"name": "alpha-k", "drafter": ["calibrated"], "alpha": [1.0], "cost": [model], "k": [2],
                   "context": [64]},
                  {"name": "real", "drafter": [model, "ngram"], "k": [2], "context": [128]}]})
    out = tmp_path / "llamacpp.jsonl"
    result = run_bench(cfg, out, tasks=["Write a function that adds two numbers."], progress=False)
    assert result["run"] == 6 and not result["stopped"]
    rows = read_results(out)
    (mem,) = [r for r in rows if r["kind"] == "memory"]  # one load serves both thread counts
    assert mem["backend"] == "llamacpp" and mem["dtype"] == "gguf"
    assert mem["target_kv_bytes_per_token"] == 2 * 30 * 3 * 64 * 2  # 30 layers, 3 KV heads of 64, f16 cache
    from adaspec.models import resolve_gguf

    size = resolve_gguf(model, progress=False)[1].stat().st_size
    assert 0.9 * size < mem["target_param_bytes"] <= size
    assert mem["drafts"][model]["param_bytes"] == mem["target_param_bytes"]
    micro = [r for r in rows if r["kind"] == "micro"]
    assert {(r["threads"], r["role"]) for r in micro} == {(1, "target"), (2, "target"), (1, "draft"), (2, "draft")}
    points = [r for r in rows if r["kind"] == "point"]
    assert {(r["threads"], r["drafter"]) for r in points} == {(t, d) for t in (1, 2)
                                                              for d in ("calibrated", model, "ngram")}
    for r in points:
        assert r["backend"] == "llamacpp" and r["new_tokens"] == 8 and r["speedup"] > 0
    # The model drafting for itself is accepted except where llama.cpp's one-token and batched kernels flip a
    # near-tie; the calibrated drafter at α = 1 proposes the plain greedy run's own tokens.
    assert all(r["alpha_l"] >= 0.75 for r in points if r["drafter"] in ("calibrated", model))
    report = make_report([out], tmp_path / "report.md")
    text = report["report"].read_text()
    assert f"## {model}, gguf, 1 thread, llamacpp" in text and "| llama.cpp GGUF, 2 threads |" in text


def test_points_compare_with_the_plain_runs_of_their_own_invocation():
    """The machine's speed drifts between sessions: a point measured by a later `adaspec bench` run (resume) is
    compared only with the plain runs that run measured of its group, never with older ones."""
    from adaspec.bench.report import analyse
    from adaspec.bench.results import tag_runs

    setting = {"target": "t", "dtype": "float32", "threads": 2, "backend": "torch", "batch": 1}

    def plain(key, tpot):
        return {"kind": "plain", "key": key, **setting, "group": "g", "tpot_ms": tpot, "decode_ms": 31 * tpot,
                "step_other_ms": 1.0, "decode_tokens_per_s": 1e3 / tpot}

    def point(key, tpot):
        return {"kind": "point", "key": key, **setting, "group": "g", "sweep": "s", "drafter": "ngram", "k": 4,
                "controller": "fixed", "context": 256, "temperature": 0.0, "tpot_ms": tpot, "decode_ms": 31 * tpot,
                "ttft_ms": 1000.0, "draft_prefill_ms": 0.0, "new_tokens": 32}

    micro = {"kind": "micro", "key": "m", **setting, "model": "t", "role": "target", "measure": "forward",
             "context": 256, "n": 1, "ms": 100.0, "samples": []}
    rows = [{"kind": "meta", "key": "meta-a"}, micro, plain("g-0", 100.0), point("p1", 50.0),
            {"kind": "meta", "key": "meta-b"}, plain("g-1", 200.0), point("p2", 100.0)]
    tagged = tag_runs([dict(r) for r in rows])
    assert [r.get("run") for r in tagged] == [None, "meta-a", "meta-a", "meta-a", None, "meta-b", "meta-b"]
    (a,) = analyse(rows)
    assert {p["key"]: p["speedup"] for p in a.points} == {"p1": 2.0, "p2": 2.0}  # not 150/50 = 3 and 150/100 = 1.5
    assert {p["key"]: p["plain_runs"] for p in a.points} == {"p1": 1, "p2": 1}


def test_batch_axis_measures_batched_runs_against_plain_batches_and_maps_them(tmp_path, corpus):
    """bench.batch = [1, 2, 3]: each B > 1 group runs B requests through the BatchEngine, plain batches
    interleaved; fp32 rows are exact (greedy points equal plain), and `adaspec map` draws the batch section."""
    from adaspec.bench.report import make_report

    cfg = normalize({
        "bench": {"target": "tiny-target", "dtype": ["float32"], "threads": [1], "max_new_tokens": 10,
                  "plain_every": 2, "workload": "tiny", "batch": [1, 2, 3]},
        "micro": {"contexts": [96], "verify_tokens": [1, 3], "repeats": 1, "drafts": []},
        "sweep": [{"name": "b", "drafter": ["calibrated", "ngram", "tiny-draft"], "alpha": [0.9], "cost": ["0"],
                   "k": [2], "context": [96]}]})
    out = tmp_path / "b.jsonl"
    res = run_bench(cfg, out, loader=tiny_loader, progress=False,
                    tasks=["Write a function that adds two numbers.", "Reverse a list.", "Sort a dict by value."])
    assert res["run"] == 9 and not res["stopped"]
    rows = read_results(out)
    for b in (2, 3):
        plains = [r for r in rows if r["kind"] == "plain" and r["batch"] == b]
        points = [r for r in rows if r["kind"] == "point" and r["batch"] == b]
        assert len(points) == 3 and plains
        assert all(len(p["token_ids"]) == b and all(len(t) == 10 for t in p["token_ids"]) for p in plains)
        assert all(p["identical_to_plain"] for p in points)  # fp32 rows: greedy speculation is exact
        assert all(p["new_tokens"] == 10 * b and p["speedup"] > 0 for p in points)
        cal = next(p for p in points if p["drafter"] == "calibrated")
        assert cal["draft_tokens"] > 0 and 0.5 <= cal["alpha"] <= 1.0
        curve = [r for r in rows if r["kind"] == "batch_curve" and r["batch"] == b]
        assert len(curve) == 1 and "1" in curve[0]["curve"]
    report = make_report([out], tmp_path / "report.md", img_dir=tmp_path / "img")
    text = report["report"].read_text()
    assert "## Batch size: tiny-target, float32, 1 threads, torch" in text
    assert "**Turning point:**" in text and "seed study's claim" in text
    figs = report["figures"]["batch-tiny-target-float32-1-torch"]
    assert figs["speedup"].exists() and figs["throughput"].exists()
    # the batch-1 setting keeps its own maps; batch > 1 settings are not fitted with the batch-1 cost model
    assert [a.setting["batch"] for a in report["analyses"]] == [1]
    with pytest.raises(ConfigError, match="batch size 0"):
        normalize({"bench": {"batch": [0]}})
    # fp32 rows never leave the greedy path, so the calibrated points held their dial
    assert all(p["offpath_positions"] == 0 for p in rows if p["kind"] == "point" and p["batch"] > 1
               and p["drafter"] == "calibrated")
    from adaspec.bench.batchmap import off_dial

    assert off_dial({"drafter": "calibrated", "draft_tokens": 10, "offpath_positions": 3})
    assert not off_dial({"drafter": "calibrated", "draft_tokens": 10, "offpath_positions": 1})
    assert not off_dial({"drafter": "ngram", "draft_tokens": 10, "offpath_positions": 9})


def test_tree_axis_values_points_and_stable_chain_keys():
    import hashlib
    from dataclasses import replace

    from adaspec.bench.grid import parse_tree

    assert parse_tree(0) == (0, "") and parse_tree(6) == (6, "always") and parse_tree("goodput:8") == (8, "goodput")
    for bad, why in (("wide", "tree values are"), (1, "is a chain"), (10**6, "tree_budget must be in"),
                     ("sometimes:4", "tree values are")):
        with pytest.raises(ConfigError, match=why):
            parse_tree(bad, "s")
    with pytest.raises(ConfigError, match="tree values are"):
        normalize({"sweep": [{"name": "t", "tree": ["x"]}]})
    cfg = normalize({"bench": {"target": "t", "workload": "tiny", "batch": [1, 2], "backend": ["torch", "llamacpp"]},
                     "sweep": [{"name": "t", "drafter": ["calibrated", "ngram", "ngram-tree", "d"], "k": [3],
                                "tree": [0, 6, "goodput:6"]}]})
    points = expand(cfg)
    single = [p for p in points if p.setting.batch == 1 and p.setting.backend == "torch"]
    # where nothing would branch (calibrated and ngram drafters, batched settings, llama.cpp) only chains remain
    assert sorted((p.drafter, p.tree, p.tree_choice) for p in single) == [
        ("calibrated", 0, ""), ("d", 0, ""), ("d", 6, "always"), ("d", 6, "goodput"), ("ngram", 0, ""),
        ("ngram-tree", 0, ""), ("ngram-tree", 6, "always"), ("ngram-tree", 6, "goodput")]
    assert all(p.tree == 0 for p in points if p.setting.batch == 2 or p.setting.backend == "llamacpp")
    assert len({point_key(p, cfg["bench"]) for p in points}) == len(points)
    # a chain's resume key is the one it had before the axis existed (results files written then still resume)
    chain = next(p for p in single if p.drafter == "d" and not p.tree)
    fields = chain.fields()
    for k in ("sweep", "tree", "tree_choice"):
        fields.pop(k)
    fields.update(workload="tiny", max_new_tokens=cfg["bench"]["max_new_tokens"], seed=cfg["bench"]["seed"],
                  chat=cfg["bench"]["chat"])
    assert point_key(chain, cfg["bench"]) == "p-" + hashlib.sha1(
        json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    assert point_key(replace(chain, tree=6, tree_choice="always"), cfg["bench"]) != point_key(chain, cfg["bench"])


def test_tree_points_verify_trees_and_are_reported_beside_their_chain(corpus, tmp_path):
    from adaspec.bench.report import make_report

    cfg = tiny_config()
    cfg["micro"]["contexts"] = [160]
    cfg["sweep"] = [{**cfg["sweep"][1], "name": "trees", "drafter": ["tiny-draft"], "controller": ["fixed"],
                     "temperature": [0.0], "tree": [0, 6]}]
    cfg = normalize(cfg)
    out = tmp_path / "t.jsonl"
    run(cfg, out)
    rows = [r for r in read_results(out) if r["kind"] == "point"]
    chain = next(r for r in rows if r["tree"] == 0)
    tree = next(r for r in rows if r["tree"] == 6)
    assert tree["tree_choice"] == "always" and not tree.get("tree_fallback")
    assert tree["tree_steps"] == tree["speculation_steps"] > 0 and chain["tree_steps"] == 0
    assert tree["mean_drafted"] > chain["mean_drafted"]  # 6-node trees against chains of at most 3
    assert tree["identical_to_plain"] is True and chain["identical_to_plain"] is True  # fp32 greedy: lossless
    assert tree["predicted_speedup"] != tree["predicted_speedup"]  # NaN: the chain formula does not price trees
    assert chain["predicted_speedup"] == chain["predicted_speedup"]  # a chain is priced
    report = tmp_path / "r.md"
    make_report([out], report)
    md = report.read_text()
    assert "### Trees against chains" in md and "tiny-draft tree 6" in md
    line = next(x for x in md.splitlines() if x.startswith("| tiny-draft | fixed | 3 | 0 |") and "| tree 6 |" in x)
    assert f"{tree['tau']:.2f}" in line and f"{100 * (tree['speedup'] / chain['speedup'] - 1):+.1f} %" in line


def test_tree_rows_pair_a_tree_with_the_chain_another_sweep_measured():
    from adaspec.bench.report import tree_rows

    base = {"drafter": "d", "controller": "fixed", "k": 3, "context": 160, "temperature": 0.0, "prompt_index": 0}
    chain = {**base, "sweep": "chains", "tree": 0}
    tree = {**base, "sweep": "trees", "tree": 6, "tree_choice": "always"}
    other = {**base, "sweep": "trees", "tree": 6, "tree_choice": "always", "prompt_index": 1}
    pairs = tree_rows([chain, tree, other])
    assert [(p["chain"] is chain, p["tree"] is t) for p, t in zip(pairs, (tree, other))] == [(True, True),
                                                                                            (False, True)]
    assert tree_rows([chain]) == []


def test_ngram_tree_chain_points_are_priced_as_lookup():
    from adaspec.bench.predict import drafter_cost_key

    assert drafter_cost_key({"drafter": "ngram-tree"}) is None and drafter_cost_key({"drafter": "ngram"}) is None
    assert drafter_cost_key({"drafter": "qwen2.5-coder-0.5b-instruct"}) == "qwen2.5-coder-0.5b-instruct"


def test_suffix_points_keep_a_cache_per_method_across_prompts_and_resume(tmp_path, corpus):
    """Each (drafter, K, controller, ...) of a sweep has its own suffix cache, kept across its prompts in order: the
    K = 4 point never drafts from the K = 2 point's answer to the same prompt, and a resumed run puts the answers
    it already has back into those caches."""
    cfg = tiny_config()
    cfg["sweep"] = [{"name": "suffix", "drafter": ["suffix"], "k": [2, 4], "controller": ["fixed"],
                     "context": [96, 160], "temperature": [0.0]}]
    cfg = normalize(cfg)

    def accepted(out: Path) -> dict:
        return {(r["context"], r["k"]): (r["draft_tokens"], r["accepted_tokens"]) for r in read_results(out)
                if r["kind"] == "point"}

    run(cfg, tmp_path / "both.jsonl")
    alone = normalize({**cfg, "sweep": [dict(cfg["sweep"][0], k=[4])]})
    run(alone, tmp_path / "alone.jsonl")
    both = accepted(tmp_path / "both.jsonl")
    assert len(both) == 4 and all(r["identical_to_plain"] for r in read_results(tmp_path / "both.jsonl")
                                  if r["kind"] == "point")
    assert {key: v for key, v in both.items() if key[1] == 4} == accepted(tmp_path / "alone.jsonl")
    # Groups run from the longest context down: stop after the first, resume, and get the uninterrupted numbers.
    first = normalize({**cfg, "sweep": [dict(cfg["sweep"][0], context=[160])]})
    run(first, tmp_path / "resumed.jsonl")
    assert run(cfg, tmp_path / "resumed.jsonl")["run"] == 2
    assert accepted(tmp_path / "resumed.jsonl") == both
