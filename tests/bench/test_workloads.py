"""Named workloads: packaged data, the ADASPEC_DATA override, and the built code-edit and multi-turn prompts."""

from __future__ import annotations

import ast
import json

import pytest

from adaspec.errors import AdaspecError
from adaspec.workloads import EDITS, NAMES, REVISIONS, Prompt, data_dir, load_workload, plant_bug


@pytest.fixture
def packaged(monkeypatch, tmp_path):
    """No ADASPEC_DATA and a working folder with nothing beside it: only the package's own data can be found."""
    monkeypatch.delenv("ADASPEC_DATA", raising=False)
    monkeypatch.chdir(tmp_path)


def _humaneval_rows() -> dict[str, dict]:
    with open(data_dir() / "humaneval_dev.jsonl", encoding="utf-8") as f:
        return {row["task_id"]: row for row in map(json.loads, f)}


@pytest.mark.parametrize("name", NAMES)
def test_every_named_workload_loads_from_the_package(packaged, name):
    assert data_dir().parts[-2:] == ("adaspec", "data")
    prompts = load_workload(name)
    assert len(prompts) >= 10
    assert all(p.text.strip() and p.id and p.category for p in prompts)
    assert len({p.id for p in prompts}) == len(prompts)
    limited = load_workload(name, limit=3)
    categories = {p.category for p in prompts}
    assert len(limited) == 3 * len(categories)


def test_workload_sizes_and_aliases(packaged):
    assert len(load_workload("humaneval")) == 82
    assert len(load_workload("gsm8k")) == 600
    assert len(load_workload("specbench")) == 480
    for alias in ("rag", "summarization"):
        prompts = load_workload(alias)
        assert len(prompts) == 80 and {p.category for p in prompts} == {alias}
        assert prompts == load_workload(f"specbench:{alias}")
    assert {p.category for p in load_workload("code-edit:fix-bug")} == {"fix-bug"}


def test_categories_differ_between_workloads(packaged):
    """compare summarizes per category: two workloads must not pool different prompts under one name."""
    seen: dict[str, str] = {}
    for name in ("humaneval", "gsm8k", "specbench", "code-edit", "multi-turn", "gsm8k-cot"):
        for category in {p.category for p in load_workload(name)}:
            assert seen.setdefault(category, name) == name, (category, seen[category], name)
    assert len(seen) == 1 + 1 + 13 + len(EDITS) + len(REVISIONS) + 1


def test_data_override_wins(monkeypatch, tmp_path):
    row = {"task_id": "Mine/0", "prompt": "def f(x):\n", "canonical_solution": "    return x < 1\n",
           "entry_point": "f", "test": ""}
    (tmp_path / "humaneval_dev.jsonl").write_text(json.dumps(row) + "\n", encoding="utf-8")
    monkeypatch.setenv("ADASPEC_DATA", str(tmp_path))
    assert data_dir() == tmp_path
    prompts = load_workload("humaneval")
    assert [p.id for p in prompts] == ["Mine/0"]
    assert "def f(x):" in prompts[0].text
    assert load_workload("code-edit")[0].id == "Mine/0:rename"
    with pytest.raises(AdaspecError, match="gsm8k_dev.jsonl"):  # the override wins even for a missing file
        load_workload("gsm8k")
    monkeypatch.setenv("ADASPEC_DATA", str(tmp_path / "missing"))
    with pytest.raises(AdaspecError, match="ADASPEC_DATA"):
        load_workload("humaneval")


def test_code_edit_prompts_repeat_the_code(packaged):
    rows = _humaneval_rows()
    prompts = load_workload("code-edit")
    assert {p.category for p in prompts} == set(EDITS)
    assert prompts[0].id == "HumanEval/0:rename" and prompts[0].category == "rename"
    assert "`numbers` → `numbers_arg`, `threshold` → `threshold_arg`" in prompts[0].text
    for p in prompts:
        task, kind = p.id.rsplit(":", 1)
        assert kind == p.category
        row = rows[task]
        assert "```python\n" in p.text and p.text.endswith("Reply with the complete rewritten function only.")
        assert row["prompt"].strip() in p.text
        if kind != "fix-bug":
            assert row["canonical_solution"].rstrip() in p.text
    assert len([p for p in prompts if p.category == "fix-bug"]) >= 15


def test_fix_bug_prompts_carry_a_real_planted_bug(packaged):
    rows = _humaneval_rows()
    bugs = [p for p in load_workload("code-edit") if p.category == "fix-bug"]
    for p in bugs:
        row = rows[p.id.rsplit(":", 1)[0]]
        code = p.text.split("```python\n", 1)[1].split("\n```", 1)[0]
        canonical = (row["prompt"] + row["canonical_solution"]).lstrip("\n").rstrip()
        assert code != canonical
        assert ast.dump(ast.parse(code)) != ast.dump(ast.parse(canonical))
        assert code.startswith(row["prompt"].strip("\n"))  # the bug is in the body, not the signature or docstring
        assert "exactly one bug" in p.text
        changed = [(a, b) for a, b in zip(canonical.splitlines(), code.splitlines()) if a != b]
        assert len(changed) == 1 and len(code.splitlines()) == len(canonical.splitlines())


def test_plant_bug_is_deterministic_and_skips_strings_and_comments():
    code = "def f(x):\n    # x < 0 here\n    s = '<'\n    return x < 3\n"
    assert plant_bug(code) == "def f(x):\n    # x < 0 here\n    s = '<'\n    return x <= 3\n"
    assert plant_bug(code) == plant_bug(code)
    assert plant_bug("def f(x):\n    return x[0]\n") == "def f(x):\n    return x[1]\n"
    assert plant_bug("def f():\n    return 1 + 2\n", start=20) == "def f():\n    return 1 - 2\n"
    with pytest.raises(AdaspecError):
        plant_bug("def f(x):\n    return g(x)\n")


def test_multi_turn_prompts_are_conversations(packaged):
    rows = _humaneval_rows()
    first_turns = {p.id: p.text for p in load_workload("humaneval")}
    prompts = load_workload("multi-turn")
    assert {p.category for p in prompts} == set(REVISIONS)
    for p in prompts:
        assert p.messages is not None and len(p.messages) == 3
        assert [m["role"] for m in p.messages] == ["user", "assistant", "user"]
        task = p.id.rsplit(":", 1)[0]
        row = rows[task]
        assert p.messages[0]["content"] == first_turns[task]
        assert row["canonical_solution"].rstrip() in p.messages[1]["content"]
        assert p.messages[1]["content"].startswith("```python\n")
        assert p.text == p.messages[2]["content"]
        assert p.text.startswith("Revise your answer: " + REVISIONS[p.category])
    first = prompts[0]
    assert first.model_input() == list(first.messages)
    flat = first.model_input(chat=False)
    assert flat == first.as_text() and flat.startswith("User: Complete the following Python function.")
    assert "\n\nAssistant: ```python\n" in flat and flat.endswith(first.text)


def test_plain_prompt_inputs_are_its_text():
    p = Prompt("1", "c", "hello")
    assert p.messages is None and p.as_text() == "hello"
    assert p.model_input() == "hello" and p.model_input(chat=False) == "hello"
    hash(Prompt("2", "c", "x", ({"role": "user", "content": "x"},)))  # still hashable with messages


def test_unknown_workload_names_the_choices(packaged):
    with pytest.raises(AdaspecError) as err:
        load_workload("no-such-workload")
    for name in ("humaneval", "gsm8k", "specbench", "code-edit", "multi-turn", "rag", "summarization"):
        assert name in str(err.value)
    with pytest.raises(AdaspecError, match="translation"):
        load_workload("specbench:nope")


def test_gsm8k_cot_prompts_are_eight_shot_conversations(packaged):
    """gsm8k-cot: the eight chain-of-thought exemplars (Wei et al. 2022) as chat turns, then the question; ids and
    order as in gsm8k, so both score against the same rows."""
    plain, cot = load_workload("gsm8k"), load_workload("gsm8k-cot")
    assert [p.id for p in cot] == [p.id for p in plain] and len(cot) == 600
    first = cot[0]
    assert first.category == "gsm8k-cot" and len(first.messages) == 17
    assert [m["role"] for m in first.messages] == ["user", "assistant"] * 8 + ["user"]
    assert first.messages[-1]["content"] == first.text == f"Q: {plain[0].text}"
    assert first.messages[0]["content"].startswith("Q: There are 15 trees in the grove.")
    answers = [m["content"] for m in first.messages[1::2]]
    assert answers[0].endswith("The answer is 6.") and answers[-1].endswith("The answer is 8.")
    assert all(a.startswith("A: ") for a in answers)
    assert cot[1].messages[:16] == first.messages[:16]  # a shared prefix: the prompt cache keeps it across questions


def test_gsm8k_cot_exemplars_come_with_the_package(monkeypatch, tmp_path):
    """ADASPEC_DATA replaces the data set, not the prompt format: the exemplars are found without it."""
    import shutil
    shutil.copy(data_dir() / "gsm8k_dev.jsonl", tmp_path / "gsm8k_dev.jsonl")
    monkeypatch.setenv("ADASPEC_DATA", str(tmp_path))
    assert len(load_workload("gsm8k-cot", 2)) == 2
