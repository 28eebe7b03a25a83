"""adaspec compare's additions: new method names, transformers peers (on tiny models), the oracle and the target
check (on synthetic rows), round-robin prompt order, presets."""

from __future__ import annotations

import pytest

from adaspec.compare import (DEFAULT_METHOD, PRESETS, Method, markdown_report, oracle, parse_method, summarize,
                             target_check)
from adaspec.compare.run import _round_robin
from adaspec.engine import GenerationConfig, SpeculativeEngine
from adaspec.backends import TorchBackend
from adaspec.errors import ConfigError
from adaspec.peers import Peer, PeerRunner, parse_peer
from adaspec.workloads import Prompt


def test_parse_new_methods():
    assert parse_method("goodput", "d") == Method("d", "goodput", None, label="goodput")
    assert parse_method("hybrid/goodput", "d") == Method("ngram+d", "goodput", None, label="hybrid/goodput")
    assert parse_method("bandit:4", "d") == Method("d", "bandit", 4, label="bandit:4")
    assert parse_method("hf:constant:3", "d") == Method("d", "hf", 3, label="hf:constant:3")
    assert parse_method("hf:pld", "d") == Method(None, "hf", 10, label="hf:pld")
    assert parse_method("hf:heuristic", "d").k == 20
    for bad in ("hf:bogus", "hf:constant:x", "hf:constant:0", "entropy:-1"):
        with pytest.raises(ConfigError):
            parse_method(bad, "d")
    assert parse_peer("goodput") is None
    assert parse_peer("hf:dynamic") == Peer("hf:dynamic", "dynamic", 20)


def test_presets_parse():
    for preset in PRESETS.values():
        for m in preset["methods"]:
            parse_method(m, "d")
    assert DEFAULT_METHOD in PRESETS["full"]["methods"] and DEFAULT_METHOD in PRESETS["quick"]["methods"]


def test_round_robin_covers_every_category_first():
    ps = [("w", Prompt(f"{c}{i}", c, "")) for c in "abc" for i in range(3 if c != "b" else 1)]
    assert [p.id for _, p in _round_robin(ps)] == ["a0", "b0", "c0", "a1", "c1", "a2", "c2"]


def row(prompt, method, tps, *, cat="code", temp=0.0, workload="humaneval", ids=(1, 2), peer=False):
    base = {"workload": workload, "category": cat, "prompt_id": prompt, "method": method, "temperature": temp,
            "new_tokens": 100, "total_ms": 100_000 / tps, "token_ids": list(ids)}
    if peer:
        return {**base, "draft_tokens": None, "accepted_tokens": None, "speculation_steps": None,
                "prefill_ms": None, "draft_ms": None, "verify_ms": None, "other_ms": None, "peer": True}
    return {**base, "draft_tokens": 10, "accepted_tokens": 5, "speculation_steps": 5, "prefill_ms": 1.0,
            "draft_ms": 1.0, "verify_ms": 1.0, "other_ms": 1.0}


def test_oracle_and_target_check():
    rows = []
    for cat, wl in (("code", "humaneval"), ("qa", "specbench"), ("rag", "specbench")):
        rows += [row("p", "plain", 10, cat=cat, workload=wl), row("p", "fixed:2", 12, cat=cat, workload=wl),
                 row("p", "fixed:4", 14 if cat != "qa" else 9, cat=cat, workload=wl),
                 row("p", DEFAULT_METHOD, 13.3, cat=cat, workload=wl, ids=(1, 3)),
                 row("p", "hf:dynamic", 11, cat=cat, workload=wl, peer=True),
                 row("p", "hf:pld", 20, cat=cat, workload=wl, peer=True)]
    table = summarize(rows)
    assert oracle(table[("code", 0.0)]) == "fixed:4" and oracle(table[("qa", 0.0)]) == "fixed:2"
    peer = table[("code", 0.0)]["hf:dynamic"]
    assert peer["alpha"] is None and peer["tau"] is None and peer["draft_share"] is None
    assert peer["speedup"] == pytest.approx(1.1)
    check = {(c["category"], c["temperature"]): c for c in target_check(rows)}
    code = check[("code", 0.0)]
    assert code["vs_oracle"] == pytest.approx(13.3 / 14) and code["vs_plain"] == pytest.approx(1.33)
    assert code["hf"] == "hf:dynamic" and code["vs_hf"] == pytest.approx(13.3 / 11)  # pld is not "assisted"
    assert code["identical"] == 0.0
    avg = next(c for c in check.values() if c["category"].startswith("Spec-Bench average (2"))
    assert avg["default"] == pytest.approx(1.33) and avg["oracle_tps"] == pytest.approx((1.2 + 1.4) / 2)
    assert avg["vs_hf"] == pytest.approx(1.33 / 1.1)
    report = markdown_report(rows)
    assert "## Target check" in report and "Oracle (best fixed K in hindsight): fixed:4, 14.00" in report
    assert "| hf:dynamic | 11.00 | 1.10x | — | — | 100% | n/a |" in report
    assert "## Target check" not in markdown_report([r for r in rows if r["method"] != DEFAULT_METHOD])


# Peers on tiny models ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plain_tokens(qwen):
    prompt = [3, 17, 42, 5, 9, 9, 12, 3, 17, 42]
    engine = SpeculativeEngine(TorchBackend(qwen, "qwen"), None, None)
    return prompt, engine.generate(prompt, GenerationConfig(max_new_tokens=24, ignore_eos=True)).token_ids


@pytest.mark.parametrize("method", ["hf:constant:3", "hf:heuristic:2", "hf:dynamic:4", "hf:pld:5"])
def test_peer_greedy_equals_plain_in_fp32(qwen, qwen_indep, plain_tokens, method):
    prompt, plain = plain_tokens
    peer = parse_peer(method)
    runner = PeerRunner(peer, qwen, qwen_indep if peer.needs_draft_model else None, eos_token_ids=[],
                        pad_token_id=0)
    before = qwen_indep.generation_config
    result = runner.generate(prompt, max_new_tokens=24)
    assert result["token_ids"] == plain
    assert result["new_tokens"] == 24 and result["total_ms"] > 0 and result["peer"] is True
    assert result["acceptance_rate"] is None and result["draft_ms"] is None
    assert qwen_indep.generation_config is before  # the draft model's own config is restored
    if peer.kind == "heuristic":
        assert runner.assistant_config.num_assistant_tokens != 2  # the schedule moved K and keeps it
    sampled = runner.generate(prompt, max_new_tokens=8, temperature=1.0, seed=3)
    assert sampled["new_tokens"] == 8
    assert runner.generate(prompt, max_new_tokens=8, temperature=1.0, seed=3)["token_ids"] == sampled["token_ids"]


def test_peer_needs_a_draft_model(qwen):
    with pytest.raises(ConfigError):
        PeerRunner(parse_peer("hf:constant"), qwen, None)


def test_run_compare_end_to_end_on_tiny_models(tmp_path, monkeypatch, qwen, qwen_indep, tokenizer):
    """The whole command on tiny saved models: every kind of method, prompt cache, resume, report."""
    import json

    import transformers

    from adaspec.compare import read_results, run_compare

    qwen.save_pretrained(tmp_path / "target")
    qwen_indep.save_pretrained(tmp_path / "draft")
    # AutoTokenizer would pick Qwen2's own tokenizer class for a qwen2 folder; hand out the word-level one.
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: tokenizer)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "category": c}) + "\n" for p, c in [
        ("w3 w17 w42 w5 w9 w9 w12 w3 w17 w42", "a"), ("w7 w8 w9 w7 w8", "b"), ("w1 w2 w3 w4", "a")]))
    methods = ["plain", "fixed:2", "goodput", "hybrid/goodput", "bandit", "entropy", "hf:constant:2", "hf:pld"]
    out = tmp_path / "r.jsonl"
    kw = dict(target=str(tmp_path / "target"), draft=str(tmp_path / "draft"), methods=methods,
              workloads=[str(data)], limit=None, max_new_tokens=12, temperatures=[0.0, 1.0], out=out,
              dtype="float32", threads=1, progress=False)
    run_compare(**kw, time_limit_s=0.0)  # stops before the second prompt
    assert {r["prompt_id"] for r in read_results(out)} == {"0"}
    run_compare(**kw)  # resumes
    rows = read_results(out)
    assert len(rows) == 3 * 2 * len(methods)
    assert [r["prompt_id"] for r in rows[::len(methods) * 2]] == ["0", "1", "2"]  # round-robin: a, b, a
    greedy = [r for r in rows if r["temperature"] == 0.0]
    by_prompt = {}
    for r in greedy:
        by_prompt.setdefault(r["prompt_id"], {})[r["method"]] = r["token_ids"]
    for outputs in by_prompt.values():  # fp32: every method's greedy output is plain decoding's
        assert all(ids == outputs["plain"] for ids in outputs.values()), outputs
    assert all(r["prompt_cache"] and 1 <= r["new_tokens"] <= 12 for r in rows)
    assert all(r["decode_tokens"] == r["new_tokens"] - 1 and r["decode_ms"] is not None for r in rows)
    assert all(r["prompt_prefill_ms"] > 0 for r in rows)
    from adaspec.backends.cpu import cpu_label

    assert {r["cpu"] for r in rows} == {cpu_label()} and cpu_label()  # rows say which machine measured them
    assert all(r["prefill_ms"] is not None for r in rows if r["controller"] != "hf")
    report = markdown_report(rows, "hybrid/goodput")
    assert "## Target check" in report and "### a, temperature 0" in report and "### b, temperature 1" in report
    # a bounded draft catch-up: recorded in each row; a file holds rows of one bound only
    with pytest.raises(ConfigError, match="--draft-catch-up 0, this run uses 4"):
        run_compare(**kw, draft_catch_up=4)
    bounded = tmp_path / "bounded.jsonl"
    run_compare(**{**kw, "out": bounded, "methods": ["plain", "goodput"], "temperatures": [0.0]}, draft_catch_up=4)
    rows = read_results(bounded)
    assert {r["draft_catch_up"] for r in rows} == {4} and len(rows) == 3 * 2
    for pid in ("0", "1", "2"):  # still plain decoding's output
        assert len({tuple(r["token_ids"]) for r in rows if r["prompt_id"] == pid}) == 1
