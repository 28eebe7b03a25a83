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
