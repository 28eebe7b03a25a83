"""The ``agentic`` workload: four sessions built from the shipped data, steps in order; compare's per-step report."""

from __future__ import annotations

from adaspec.agentic import CATEGORIES, SQL_QUESTIONS, _sql_questions
from adaspec.compare import markdown_report, step_table
from adaspec.workloads import load_workload


def test_sessions_are_built_in_step_order_from_the_shipped_data():
    prompts = load_workload("agentic")
    by_cat: dict[str, list] = {}
    for p in prompts:
        by_cat.setdefault(p.category, []).append(p)
    assert tuple(by_cat) == CATEGORIES
    for cat, ps in by_cat.items():
        assert [p.step for p in ps] == list(range(len(ps)))
        assert all(p.messages[0]["role"] == "system" and p.messages[-1]["content"] == p.text for p in ps)
        assert len({p.messages[0]["content"] for p in ps}) == 1  # one session: the same instructions every step
    gsm = load_workload("gsm8k", 2)
    assert by_cat["agent-tools"][1].text == f"Task: {gsm[1].text}"
    assert "`has_close_elements`" in by_cat["agent-code"][0].text  # HumanEval/0
    assert len(by_cat["agent-sql"]) == 51 == len(set(_sql_questions()))  # distinct questions only
    assert by_cat["agent-sql"][0].text == SQL_QUESTIONS[0].format(city="Berlin", category="books", year=2022, n=3)
    assert [p.step for p in load_workload("agentic", 3)] == [0, 1, 2] * 4  # --limit keeps the first steps


def test_compare_reports_speedup_per_step():
    def row(method, step, tps, drafted=4, accepted=2):
        return {"workload": "agentic", "category": "agent-sql", "prompt_id": f"agent-sql:{step}", "step": step,
                "method": method, "temperature": 0.0, "token_ids": [1, 2], "total_ms": 1000.0, "new_tokens": 9,
                "decode_ms": 1000.0, "decode_tokens": tps, "draft_tokens": drafted, "accepted_tokens": accepted,
                "speculation_steps": 1}
    rows = [row("plain", 0, 10, 0, 0), row("suffix/goodput", 0, 12), row("plain", 1, 10, 0, 0),
            row("suffix/goodput", 1, 30, 4, 4)]
    table = step_table(rows)[("agent-sql", 0.0)]
    assert table[0]["suffix/goodput"]["speedup"] == 1.2 and table[1]["suffix/goodput"]["speedup"] == 3.0
    assert table[1]["suffix/goodput"]["alpha"] == 1.0
    assert "| 1 | 3.00x (1.00) |" in markdown_report(rows)


def test_compare_gives_each_method_its_own_cache_and_a_resumed_run_refills_it(tmp_path, monkeypatch, qwen, tokenizer):
    import json

    import transformers

    from adaspec.compare import read_results, run_compare

    qwen.save_pretrained(tmp_path / "target")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: tokenizer)
    data = tmp_path / "prompts.jsonl"
    text = "w3 w17 w42 w5 w9 w9 w12 w3"
    data.write_text("".join(json.dumps({"prompt": text, "category": "a", "id": i}) + "\n" for i in range(3)))
    methods = ["plain", "suffix/fixed:4", "suffix/fixed:3"]  # one drafter spec: each method its own cache
    kw = dict(target=str(tmp_path / "target"), draft="ngram", methods=methods, workloads=[str(data)], limit=None,
              max_new_tokens=16, temperatures=[0.0], dtype="float32", threads=1, progress=False,
              backend="torch")
    run_compare(**kw, out=tmp_path / "whole.jsonl")
    run_compare(**kw, out=tmp_path / "resumed.jsonl", time_limit_s=0.0)  # the first prompt only
    run_compare(**kw, out=tmp_path / "resumed.jsonl")

    def stats(name):
        return {(r["prompt_id"], r["method"]): (r["token_ids"], r["draft_tokens"], r["accepted_tokens"])
                for r in read_results(tmp_path / name)}

    whole = stats("whole.jsonl")
    assert stats("resumed.jsonl") == whole  # the resumed run drafted from the same caches
    run_compare(**{**kw, "methods": ["plain", methods[2]]}, out=tmp_path / "alone.jsonl")
    assert stats("alone.jsonl")[("0", methods[2])] == whole[("0", methods[2])]  # it never read fixed:4's answer
    plain = whole[("0", "plain")][0]
    for m in methods[1:]:
        assert [whole[(p, m)][0] for p in "012"] == [plain] * 3
        first, repeat = whole[("0", m)], whole[("1", m)]
        assert repeat[2] / repeat[1] >= 0.8 and repeat[2] > first[2]  # the repeat drafts the first answer (10/12)
