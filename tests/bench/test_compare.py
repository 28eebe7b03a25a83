"""The comparison tool: method parsing, resumable results, and the summary on synthetic rows."""

from __future__ import annotations

import json

import pytest

from adaspec.compare import Method, markdown_report, parse_method, read_results, summarize
from adaspec.errors import AdaspecError, ConfigError
from adaspec.workloads import load_workload


def test_parse_method():
    assert parse_method("plain", "d") == Method(None, "fixed", 0, label="plain")
    assert parse_method("fixed:4", "d") == Method("d", "fixed", 4, label="fixed:4")
    assert parse_method("adaptive", "d") == Method("d", "adaptive", None, label="adaptive")
    assert parse_method("ngram/fixed:3", "d") == Method("ngram", "fixed", 3, label="ngram/fixed:3")
    for bad in ("fixed", "fixed:x", "bogus", "fixed:-1"):
        with pytest.raises(ConfigError):
            parse_method(bad, "d")


def _row(prompt, method, tokens, ms, drafted=0, accepted=0, spec_steps=0, ids=(1, 2, 3), temp=0.0):
    return {"workload": "w", "category": "code", "prompt_id": prompt, "method": method, "temperature": temp,
            "new_tokens": tokens, "total_ms": ms, "draft_tokens": drafted, "accepted_tokens": accepted,
            "speculation_steps": spec_steps, "token_ids": list(ids), "prefill_ms": 10.0, "draft_ms": 20.0,
            "verify_ms": ms - 40.0, "other_ms": 10.0}


def test_summary_values():
    rows = [_row("a", "plain", 100, 10_000), _row("b", "plain", 100, 10_000),
            _row("a", "fixed:4", 100, 5_000, drafted=80, accepted=60, spec_steps=20),
            _row("b", "fixed:4", 100, 5_000, drafted=80, accepted=60, spec_steps=20, ids=(9,)),
            _row("c", "plain", 100, 1)]  # prompt c is incomplete (no fixed:4 row): excluded
    stats = summarize(rows)[("code", 0.0)]
    assert stats["plain"]["prompts"] == 2
    assert stats["plain"]["tokens_per_s"] == pytest.approx(10.0)
    assert stats["fixed:4"]["speedup"] == pytest.approx(2.0)
    assert stats["fixed:4"]["alpha"] == pytest.approx(0.75)
    assert stats["fixed:4"]["tau"] == pytest.approx(4.0)  # (120 accepted + 40 steps) / 40 steps
    assert stats["fixed:4"]["identical"] == pytest.approx(0.5)
    table = markdown_report(rows)
    assert "| fixed:4 | 20.00 | 2.00x | 0.750 | 4.00 | 50% |" in table


def test_read_results_skips_a_truncated_last_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(_row("a", "plain", 1, 1)) + "\n" + '{"workload": "w", "pro')
    assert len(read_results(path)) == 1


def test_workload_from_jsonl(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "one"}\n{"question": "two", "id": "q2"}\n{"turns": ["three", "x"]}\n')
    prompts = load_workload(str(path))
    assert [p.text for p in prompts] == ["one", "two", "three"]
    assert prompts[1].id == "q2" and prompts[0].category == "p"
    assert len(load_workload(str(path), limit=2)) == 2
    with pytest.raises(AdaspecError, match="unknown workload"):
        load_workload(str(tmp_path / "missing.jsonl"))


def test_a_jsonl_workload_keeps_a_conversation(tmp_path):
    """Rows with OpenAI-style messages (an agent's trace with its system prompt) keep them, as the agentic
    workload's own prompts do, so a request sends the whole conversation."""
    path = tmp_path / "trace.jsonl"
    convo = [{"role": "system", "content": "You call tools."}, {"role": "user", "content": "Task: add 2 and 3."}]
    path.write_text(json.dumps({"id": "s:0", "category": "agent", "step": 4, "messages": convo}) + "\n")
    [p] = load_workload(str(path))
    assert p.messages == tuple(convo) and p.text == "Task: add 2 and 3." and p.step == 4 and p.category == "agent"
    assert p.model_input() == convo
    for bad, why in (([], "non-empty list"), ([{"role": "user"}], "message 1 needs"),
                     ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "user's turn")):
        path.write_text(json.dumps({"messages": bad}) + "\n")
        with pytest.raises(AdaspecError, match=why):
            load_workload(str(path))
