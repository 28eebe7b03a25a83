"""``adaspec eval``: completion extraction, scoring with its cache, the paired analysis and its failure rule, and an
end-to-end run on the zoo's small model (slow)."""

from __future__ import annotations

import json
import pytest

from adaspec.compare import parse_method
from adaspec.errors import AdaspecError, ConfigError
from adaspec.quality import evaluate, scoring
from adaspec.quality.gsm8k import is_correct, reference_answer
from adaspec.quality.evaluate import analyse, humaneval_completion, score_rows
from adaspec.workloads import load_workload

PROBLEMS = scoring.task_problems("humaneval")
FIRST = next(iter(PROBLEMS.values()))  # HumanEval/0 style row: prompt, canonical_solution, test, entry_point


def fenced(code: str, lang: str = "python") -> str:
    return f"Here you go:\n```{lang}\n{code}\n```\nThis works because..."


def test_humaneval_completion_takes_the_block_defining_the_function():
    full = FIRST["prompt"] + FIRST["canonical_solution"]
    text = fenced("import os") + "\n" + fenced(full)
    completion = humaneval_completion(text, FIRST)
    assert f"def {FIRST['entry_point']}(" in completion and "import os" not in completion
    body = humaneval_completion(fenced(FIRST["canonical_solution"].rstrip()), FIRST)  # only a body: kept as is
    assert body == FIRST["canonical_solution"].rstrip() + "\n"
    unterminated = "```python\n" + full  # cut by max_new_tokens before the closing fence
    assert f"def {FIRST['entry_point']}(" in humaneval_completion(unterminated, FIRST)


def test_score_rows_executes_once_and_caches(tmp_path, monkeypatch):
    good = fenced(FIRST["prompt"] + FIRST["canonical_solution"])
    bad = fenced(FIRST["prompt"] + "    return None\n")
    pid = FIRST["task_id"]
    rows = [{"prompt_id": pid, "method": "plain", "text": good}, {"prompt_id": pid, "method": "x", "text": bad},
            {"prompt_id": pid, "method": "y", "text": good}]
    cache = tmp_path / "scores.jsonl"
    scores = score_rows("humaneval", rows, cache, timeout_s=5, progress=False)
    assert sorted(scores.values()) == [False, True]  # two distinct texts, executed once each
    assert len(cache.read_text().splitlines()) == 2

    def boom(*a, **k):
        raise AssertionError("executed again")

    monkeypatch.setattr(scoring, "check_humaneval", boom)
    assert score_rows("humaneval", rows, cache, progress=False) == scores


def test_score_rows_gsm8k(tmp_path):
    prompts = load_workload("gsm8k", 1)
    rows = [{"prompt_id": prompts[0].id, "method": "plain", "text": "She makes 9 * 2 = 18 dollars.\n#### 18"},
            {"prompt_id": prompts[0].id, "method": "x", "text": "The answer is 20."}]
    scores = score_rows("gsm8k", rows, tmp_path / "s.jsonl", progress=False)
    assert sorted(scores.values()) == [False, True]


def _row(pid: str, method: str, tokens: list[int], text: str, margins: list[float], ms: float = 1000.0) -> dict:
    return {"prompt_id": pid, "method": method, "token_ids": tokens, "text": text, "margins": margins,
            "decode_ms": ms, "decode_tokens": len(tokens) - 1}


def test_analyse_pairs_methods_and_flags_large_margin_divergences():
    rows, scores = [], {}
    for i in range(4):
        pid = f"p{i}"
        rows.append(_row(pid, "plain", [1, 2, 3, 4], f"a{i}", [5.0, 0.01, 3.0, 2.0], ms=2000))
        # the default method diverges on p0 at position 1 where plain's margin is 0.01 (numerics)
        spec_tokens = [1, 9, 3, 4] if i == 0 else [1, 2, 3, 4]
        rows.append(_row(pid, "hybrid/goodput", spec_tokens, f"b{i}" if i == 0 else f"a{i}",
                         [5.0, 0.02, 3.0, 2.0], ms=1000))
        # a lossy method diverges at a large margin: reported, never a failure
        rows.append(_row(pid, "hybrid/goodput+topk:2", [1, 2, 7, 4], f"c{i}", [5.0, 0.01, 1.0, 2.0], ms=500))
    for r in rows:
        scores[(r["prompt_id"], scoring.text_hash(r["text"]))] = r["text"].startswith("a") or r["text"] == "c1"
    out = analyse("humaneval", rows, scores, threshold=0.1)
    plain, spec, lossy = out["plain"], out["hybrid/goodput"], out["hybrid/goodput+topk:2"]
    assert plain["accuracy"] == 1.0 and plain["identical"] == 1.0
    assert spec["identical"] == 0.75 and spec["accuracy"] == 0.75
    assert spec["divergences"] == [{"prompt_id": "p0", "position": 1, "ref_margin": 0.01, "margin": 0.02,
                                    "same_score": False, "both_truncated": False}]
    assert spec["large_margin_divergences"] == [] and spec["speedup"] == pytest.approx(2.0)
    assert spec["vs_plain"]["b"] == 1 and spec["vs_plain"]["c"] == 0
    assert lossy["identical"] == 0.0 and lossy["large_margin_divergences"] == []
    assert lossy["accuracy"] == 0.25 and lossy["vs_plain"]["p_mcnemar"] == pytest.approx(0.25)
    # the same divergence at a margin above the threshold is a bug for a lossless method
    strict = analyse("humaneval", rows, scores, threshold=0.001)["hybrid/goodput"]
    assert [d["prompt_id"] for d in strict["large_margin_divergences"]] == ["p0"]


def test_analyse_splits_identity_and_speed_by_machine():
    """A results file resumed on a second machine: identity and speedup per machine, none when all rows share one."""
    rows, scores = [], {}
    for i, cpu in enumerate(["AMD (AVX2)"] * 2 + ["Xeon (AVX-512)"] * 3):
        pid = f"p{i}"
        plain_ms, spec_ms = (2000, 1000) if cpu.startswith("AMD") else (600, 400)
        rows.append(_row(pid, "plain", [1, 2, 3, 4], "a", [5.0, 0.01, 3.0, 2.0], ms=plain_ms) | {"cpu": cpu})
        tokens = [1, 9, 3, 4] if i == 4 else [1, 2, 3, 4]  # one divergence, on the second machine
        rows.append(_row(pid, "ngram/goodput", tokens, "a", [5.0, 0.02, 3.0, 2.0], ms=spec_ms) | {"cpu": cpu})
    scores = {(r["prompt_id"], scoring.text_hash(r["text"])): True for r in rows}
    spec = analyse("humaneval", rows, scores, threshold=0.1)["ngram/goodput"]
    assert spec["identical"] == pytest.approx(0.8)
    amd, xeon = spec["machines"]["AMD (AVX2)"], spec["machines"]["Xeon (AVX-512)"]
    assert (amd["n"], amd["identical"], amd["speedup"]) == (2, 1.0, pytest.approx(2.0))
    assert (xeon["n"], xeon["identical"], xeon["speedup"]) == (3, pytest.approx(2 / 3), pytest.approx(1.5))
    md = evaluate.markdown({"humaneval": analyse("humaneval", rows, scores, threshold=0.1)},
                           {"target": "t", "dtype": "float32", "max_new_tokens": 4, "threads": 2, "noise": 0.1,
                            "noise_width": "3", "threshold": 0.4})
    assert "| ngram/goodput | Xeon (AVX-512) | 3 | 66.7% | 1.50x |" in md
    one = [r | {"cpu": "AMD (AVX2)"} for r in rows]
    assert "machines" not in analyse("humaneval", one, scores, threshold=0.1)["ngram/goodput"]
    # the method added later on another machine, for every prompt: split, and no speedup across machines
    later = [r | {"cpu": "AMD (AVX2)" if r["method"] == "plain" else "Xeon (AVX-512)"} for r in rows]
    split = analyse("humaneval", later, scores, threshold=0.1)["ngram/goodput"]["machines"]
    assert list(split) == ["AMD (AVX2) / Xeon (AVX-512)"] and split["AMD (AVX2) / Xeon (AVX-512)"]["n"] == 5
    assert split["AMD (AVX2) / Xeon (AVX-512)"]["speedup"] != split["AMD (AVX2) / Xeon (AVX-512)"]["speedup"]


def test_gsm8k_analysis_counts_cut_answers_and_scores_stated_answers():
    """Two answers cut mid-way by the token limit: the last-number fallback scores one right by luck, the stated
    score (no fallback) counts both wrong; a finished answer scores the same both ways."""
    problems = scoring.task_problems("gsm8k")
    ref = {pid: reference_answer(problems[pid]["answer"]) for pid in ("0", "1")}
    rows = []
    for pid, r in ref.items():
        wrong = str(int(float(r)) + 1)
        rows.append(_row(pid, "plain", [1, 2, 3], f"so far {wrong}", [1.0, 0.05, 1.0]) | {"finish_reason": "length"})
        lucky = f"so far {r}" if pid == "0" else f"Thus \\boxed{{{r}}}."
        rows.append(_row(pid, "hybrid/goodput", [1, 4, 3], lucky, [1.0, 0.04, 1.0])
                    | {"finish_reason": "length" if pid == "0" else "stop"})
    scores = {(r["prompt_id"], scoring.text_hash(r["text"])): is_correct(r["text"], ref[r["prompt_id"]])
              for r in rows}
    out = analyse("gsm8k", rows, scores, threshold=1.0)
    plain, spec = out["plain"], out["hybrid/goodput"]
    assert plain["truncated"] == 1.0 and spec["truncated"] == 0.5
    assert spec["accuracy"] == 1.0 and (spec["vs_plain"]["c"], spec["vs_plain"]["b"]) == (2, 0)
    assert plain["stated"]["accuracy"] == 0.0 and spec["stated"]["accuracy"] == 0.5
    assert (spec["stated"]["vs_plain"]["c"], spec["stated"]["vs_plain"]["b"]) == (1, 0)
    assert [(d["prompt_id"], d["both_truncated"]) for d in spec["divergences"]] == [("0", True), ("1", False)]
    md = evaluate.markdown({"gsm8k": out}, {"target": "t", "dtype": "gguf", "max_new_tokens": 3, "threads": 2, "noise": 0.1,
                                 "noise_width": "3", "threshold": 0.4})
    assert "| hybrid/goodput | 50.0% |" in md and "| 1/0 |" in md  # the stated-answer table
    header, _, *table = [[c.strip() for c in line.split("|")[1:-1]] for line in md.splitlines()
                         if line.startswith("|")][:4]
    cut, discordant = header.index("cut"), header.index("discordant")
    assert {row[0]: (row[discordant], row[cut]) for row in table} == {"plain": ("0/0", "100.0%"),
                                                                      "hybrid/goodput": ("2/0", "50.0%")}


def test_strict_methods_are_compared_with_plain_strict():
    assert parse_method("hybrid/goodput+strict", "d").reference == "plain+strict"
    assert parse_method("plain+strict", "d").reference == "plain+strict"
    assert parse_method("hybrid/goodput+bild:1.5", "d").lossy == "bild:1.5"
    for bad, msg in [("plain+typical", "needs a drafter"), ("goodput+fast", "neither 'strict'"),
                     ("goodput+topk:2+bild", "one lossy rule"), ("hf:pld+strict", "not to peers")]:
        with pytest.raises(ConfigError, match=msg):
            parse_method(bad, "d")


def test_bad_eval_arguments(tmp_path):
    with pytest.raises(ConfigError, match="unknown task 'mmlu'"):
        evaluate.run_eval(target="t", draft="d", tasks=["mmlu"], methods=["plain"], limit=1, max_new_tokens=4,
                          out_dir=tmp_path)
    with pytest.raises(AdaspecError, match="no meta.json"):
        evaluate.run_eval(target="t", draft="d", tasks=["humaneval"], methods=["plain"], limit=1,
                          max_new_tokens=4, out_dir=tmp_path, generate=False)


@pytest.mark.slow
def test_eval_end_to_end_on_a_real_model(tmp_path):
    """Two HumanEval tasks on SmolLM2-135M (PyTorch fp32, n-gram drafter): every file written, the strict method
    identical to plain+strict, the speculative one scored like plain, a resumed run generating nothing."""
    methods = ["plain", "ngram/fixed:3", "plain+strict", "ngram/fixed:3+strict", "ngram/fixed:3+topk:2"]
    kw = dict(target="smollm2-135m-instruct", draft="ngram", tasks=["humaneval"], methods=methods, limit=2,
              max_new_tokens=24, out_dir=tmp_path, dtype="float32", threads=2, backend="torch", progress=False)
    results, meta, ok = evaluate.run_eval(**kw)
    assert ok and meta["dtype"] == "float32" and 0 < meta["noise"] < 1e-2
    stats = results["humaneval"]
    assert {s["n"] for s in stats.values()} == {2}
    assert stats["ngram/fixed:3+strict"]["identical"] == 1.0
    assert stats["ngram/fixed:3"]["accuracy"] == stats["plain"]["accuracy"] or stats["ngram/fixed:3"]["divergences"]
    for name in ("humaneval.jsonl", "scores.jsonl", "report.md", "summary.json", "speed_quality.png", "meta.json"):
        assert (tmp_path / name).is_file(), name
    rows = (tmp_path / "humaneval.jsonl").read_text().splitlines()
    assert len(rows) == 2 * len(methods) and all(len(json.loads(r)["margins"]) for r in rows)
    evaluate.run_eval(**kw)  # resumes: nothing left to generate
    assert len((tmp_path / "humaneval.jsonl").read_text().splitlines()) == len(rows)


def test_score_rows_gsm8k_cot_uses_the_gsm8k_answers(tmp_path):
    """gsm8k-cot rows are scored against the same GSM8K references as gsm8k, with the chain-of-thought answer form."""
    pid = load_workload("gsm8k-cot", 1)[0].id
    rows = [_row(pid, "plain", [1, 2], "A: She sells 16 - 3 - 4 = 9 eggs. 9 * 2 = 18. The answer is 18.", [1.0, 0.1]),
            _row(pid, "ngram/goodput", [1, 3], "A: 16 - 3 = 13. 13 * 2 = 26. The answer is 26.", [1.0, 0.1])]
    scores = score_rows("gsm8k-cot", rows, tmp_path / "s.jsonl", progress=False)
    assert [scores[(pid, scoring.text_hash(r["text"]))] for r in rows] == [True, False]
    stats = analyse("gsm8k-cot", rows, scores, threshold=1.0)
    assert stats["ngram/goodput"]["stated"]["accuracy"] == 0.0 and stats["plain"]["stated"]["accuracy"] == 1.0


def test_structured_rows_score_validity_and_exact_fields(tmp_path):
    """The structured task is graded at generation (rows carry valid and exact): right = valid with every field
    exact; the report gives the validity rate and the mean share of exact fields."""
    rows = []
    for i, (valid, exact) in enumerate([(True, 1.0), (True, 0.5), (False, 0.0)]):
        rows.append({**_row(f"s{i}", "plain", [1, 2], f"p{i}", [1.0, 1.0]), "valid": valid, "exact": exact})
        rows.append({**_row(f"s{i}", "ngram/goodput", [1, 2], f"p{i}", [1.0, 1.0]), "valid": valid,
                     "exact": exact})
    scores = score_rows("structured", rows, tmp_path / "s.jsonl", progress=False)
    assert [scores[(f"s{i}", scoring.text_hash(f"p{i}"))] for i in range(3)] == [True, False, False]
    stats = analyse("structured", rows, scores, threshold=1.0)
    spec = stats["ngram/goodput"]
    assert spec["accuracy"] == pytest.approx(1 / 3) and spec["identical"] == 1.0
    assert spec["structured"]["valid"] == pytest.approx(2 / 3)
    assert spec["structured"]["exact_fields"] == pytest.approx(0.5)
    report = evaluate.markdown({"structured": stats}, {"target": "t", "dtype": "float32", "max_new_tokens": 8,
                                                       "threads": 1, "noise": 0.0, "noise_width": "3",
                                                       "threshold": 0.0})
    assert "| ngram/goodput | 66.7% |" in report and "| 50.0% |" in report
