"""``adaspec map``: maps and report from a small synthetic results file with a known cost law."""

from __future__ import annotations

import json
import random
import re
import statistics
from pathlib import Path

import pytest

from adaspec.bench.costmodel import FittedCostModel
from adaspec.controllers.costmodel import expected_tokens
from adaspec.bench.report import analyse, findings, to_html
from adaspec.cli import main
from adaspec.compare import read_results

SETTING = {"target": "big", "dtype": "bfloat16", "threads": 2, "backend": "torch", "batch": 1}
DRAFT = "small"


def t_verify(n, ctx):
    return 200 + 8 * (n - 1) + 0.02 * ctx + 0.006 * (n - 1) * ctx


def t_draft(ctx):
    return 70 + 0.01 * ctx


def synthetic_rows(seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = [{"kind": "meta", "key": "meta-1", "argv": ["adaspec", "bench", "--quick"],
             "machine": {"cpu": "Test CPU", "cores": 2, "cpu_flags": "", "memory_bytes": 24 * 2**30, "torch": "x"}},
            {"kind": "memory", "key": "mem-1", **SETTING, "target_param_bytes": 3 * 2**30,
             "target_rss_delta_bytes": 3 * 2**30, "target_kv_bytes_per_token": 28672,
             "drafts": {DRAFT: {"param_bytes": 2**30, "rss_delta_bytes": int(1.1 * 2**30),
                                "kv_bytes_per_token": 12288}, "ngram": {"param_bytes": 0, "rss_delta_bytes": 0,
                                                                        "kv_bytes_per_token": 0}}}]
    i = 0
    for ctx in (256, 1024, 2048):
        for n in (1, 2, 3, 5, 9):
            rows.append({"kind": "micro", "key": f"m{i}", "micro_key": "mt", **SETTING, "model": "big",
                         "role": "target", "measure": "forward", "context": ctx, "n": n, "ms": t_verify(n, ctx),
                         "samples": []})
            i += 1
        rows.append({"kind": "micro", "key": f"m{i}", "micro_key": "md", **SETTING, "model": DRAFT, "role": "draft",
                     "measure": "forward", "context": ctx, "n": 1, "ms": t_draft(ctx), "samples": []})
        i += 1
    rows.append({"kind": "micro", "key": "mo", "micro_key": "mo", **SETTING, "model": "big", "role": "target",
                 "measure": "overhead", "context": 256, "n": 1, "ms": 2.0, "samples": []})
    model = FittedCostModel({n: (200 + 8 * (n - 1), 0.02 + 0.006 * (n - 1)) for n in (1, 2, 3, 5, 9)},
                      {DRAFT: (70.0, 0.01)}, 2.0)

    def point(sweep, drafter, k, ctx, alpha, cost_ms=None, temp=0.0, controller="fixed", plain_fraction=0.0):
        nonlocal i
        i += 1
        mean_ctx = ctx + 16
        cost = cost_ms if drafter == "calibrated" else (None if drafter == "ngram" else drafter)
        speedup = model.speedup(alpha, k, mean_ctx, cost, plain_fraction) * (1 + rng.uniform(-0.02, 0.02))
        steps = 20
        spec_steps = round(steps * (1 - plain_fraction))
        accepted = round(alpha * 40)
        plain_tpot = model.plain_step_ms(mean_ctx)
        return {"kind": "point", "key": f"p{i}", **SETTING, "sweep": sweep, "drafter": drafter, "k": k,
                "controller": controller, "context": ctx, "prompt_tokens": ctx, "temperature": temp,
                "workload": "humaneval", "alpha_dial": alpha if drafter == "calibrated" else None,
                "cost_ms": cost_ms, "alpha_l": alpha, "alpha": alpha * 0.8, "tau": expected_tokens(alpha, k),
                "speculation_steps": spec_steps, "accepted_tokens": accepted, "rejections": 40 - accepted,
                "mean_drafted": k, "plain_fraction": plain_fraction, "mean_context": mean_ctx,
                "speedup": speedup, "speedup_e2e": speedup * 0.9, "ttft_ms": 3000.0, "tpot_ms": plain_tpot / speedup,
                "tokens_per_s": 1000 / (plain_tpot / speedup), "decode_tokens_per_s": 1000 / (plain_tpot / speedup),
                "cpu_s_per_token": 0.4, "energy_j_per_token": None,
                "energy_source": "not measurable here", "step_draft_ms": k * (cost_ms or 0),
                "step_verify_ms": model.verify_ms(k + 1, mean_ctx), "step_other_ms": 2.0, "new_tokens": 32,
                "steps": steps, "offpath_positions": 0 if drafter == "calibrated" else None}

    for alpha in (0.4, 0.6, 0.8, 0.95):
        for k in (2, 4, 8):
            rows.append(point("alpha-k", "calibrated", k, 256, alpha, cost_ms=t_draft(272)))
    for ctx in (1024, 2048):
        for k in (2, 4):
            rows.append(point("context-k", "calibrated", k, ctx, 0.8, cost_ms=t_draft(ctx + 16)))
    rows.append(point("real", DRAFT, 4, 256, 0.9))
    rows.append(point("real", "ngram", 4, 256, 0.6, plain_fraction=0.5))
    rows.append({"kind": "plain", "key": "g1", **SETTING, "context": 256, "temperature": 0.0, "step_verify_ms": 205.0,
                 "step_other_ms": 2.0, "tpot_ms": 207.0, "decode_tokens_per_s": 1000 / 207})
    return rows


@pytest.fixture
def results(tmp_path) -> Path:
    path = tmp_path / "bench.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in synthetic_rows()))
    return path


def test_report_from_synthetic_results(results, tmp_path, capsys):
    report = tmp_path / "docs" / "boundary.md"
    notes = tmp_path / "notes.md"
    notes.write_text("## What it means\n\nWritten by a person.\n")
    assert main(["map", str(results), "--report", str(report), "--img-dir", str(tmp_path / "docs" / "img"),
                 "--html", str(tmp_path / "docs" / "b.html"), "--notes", str(notes)]) == 0
    assert "wrote" in capsys.readouterr().out
    out = {"figures": {"bfloat16-t2-torch": {
        name: tmp_path / "docs" / "img" / f"boundary-bfloat16-t2-torch-{suffix}.png"
        for name, suffix in (("alpha_k", "alpha-k"), ("context_k", "context-k"), ("alpha_curves", "speedup-vs-alpha"),
                             ("verify_cost", "verify-cost"), ("time_split", "time-split"))}},
           "analyses": analyse(read_results(results))}
    md = report.read_text()
    for needle in ("## Overview", "Minimum α at which speculation pays", "Best K per context", "Context range where speculation pays",
                   "Memory cost of the draft", "Against the rules of thumb", "pays above ~70% acceptance",
                   "draft 1/10–1/20 of the target", "adaspec bench --quick", f"adaspec map {results}",
                   "not measurable here", f"--notes {notes}"):
        assert needle in md, needle
    # the notes come after the overview and before the first setting's section
    assert md.index("## Overview") < md.index("## What it means\n\nWritten by a person.") < md.index("### Findings")
    figs = out["figures"]["bfloat16-t2-torch"]
    assert set(figs) == {"alpha_k", "context_k", "alpha_curves", "verify_cost", "time_split"}
    for path in figs.values():
        assert path.stat().st_size < 150_000 and path.read_bytes()[:4] == b"\x89PNG"
        assert f"]({Path('img') / path.name})" in md  # linked relative to the report
    html = (tmp_path / "docs" / "b.html").read_text()
    assert "<table" in html and "<img" in html and "<h2>" in html
    # The numbers the report states are the cost model's.
    (a,) = out["analyses"]
    assert a.median_error < 0.03  # synthetic points are the law ± 2%
    assert a.reference_alpha == pytest.approx(0.9, abs=0.02)  # the real draft's measured α
    f = findings(a)
    for k in (1, 2, 4, 8):
        want = a.model.min_alpha(k, a.map_context + 16, f["cal_cost_ms"])
        assert f["min_alpha"][k] == pytest.approx(want)
        assert re.search(rf"K = {k}: {want:.2f}", md)


def test_analysis_ignores_settings_without_micro(results):
    rows = read_results(results)
    rows = [r for r in rows if r["kind"] != "micro"]
    assert analyse(rows) == []


def test_map_cli_error(tmp_path, results):
    assert main(["map", str(tmp_path / "missing.jsonl"), "--report", str(tmp_path / "r.md")]) == 2
    assert main(["map", str(results), "--report", str(tmp_path / "r.md"), "--notes", str(tmp_path / "no.md")]) == 2


def test_html_conversion():
    html = to_html("# T\n\n- a **b**\n\n| x | y |\n|---|---|\n| 1 | `2` |\n\n```bash\nls <x>\n```\n", "T")
    assert "<h1>T</h1>" in html and "<li>a <b>b</b></li>" in html and "<td><code>2</code></td>" in html
    assert "ls &lt;x&gt;" in html


def test_profile_advice_on_tiny_models(tmp_path, monkeypatch):
    from bench_tiny import tiny_loader

    from adaspec.bench.profile import format_advice, profile_workload

    monkeypatch.setattr("adaspec.bench.prompts.corpus_text",
                        lambda max_chars=600_000: "Some real background text, sentence after sentence. " * 200)
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"prompt": f"def add_{i}(a, b):\n    return a + b\n" * 3}) + "\n"
                                for i in range(4)))
    advice = profile_workload(str(workload), target="tiny-target", drafts=["tiny-draft", "ngram"], sample=2,
                              max_new_tokens=12, loader=tiny_loader, threads=1, bootstrap=200)
    assert advice["enable"] in ("yes", "no", "marginal") and advice["sample"] == 2
    assert advice["prompt_ids"] == ["0", "2"]  # the sample, spread over the 4 prompts, named for a compare run
    assert {c["drafter"] for c in advice["candidates"]} == {"tiny-draft", "ngram"}
    lo, hi = advice["ci95"]
    assert lo <= hi and advice["reason"]
    rec = advice["recommended"]
    assert (rec["k"] == 0) == (advice["enable"] == "no")
    json.dumps(advice)
    assert "expected speedup" in format_advice(advice)
    if advice["confirmed_speedups"] is not None:  # the model said speculate: measured as it will run
        assert len(advice["confirmed_speedups"]) == 2 and advice["basis"].startswith("measured")
        assert advice["expected_speedup"] == pytest.approx(statistics.fmean(advice["confirmed_speedups"]), abs=2e-3)
    model_only = profile_workload(str(workload), target="tiny-target", drafts=["ngram"], sample=2,
                                  max_new_tokens=12, loader=tiny_loader, threads=1, bootstrap=200, confirm_tokens=0)
    assert model_only["confirmed_speedups"] is None and model_only["basis"].startswith("cost model")
    assert model_only["expected_speedup"] == model_only["model_speedup"]


def test_profile_with_the_suffix_drafter_confirms_on_a_fresh_cache(tmp_path, monkeypatch):
    """The probes fill the suffix drafter's cache with answers to the sampled prompts; the confirmation must not
    draft from them (it would replay its own answers), so it starts from an empty cache that then lives across the
    confirmation's prompts."""
    from bench_tiny import tiny_loader

    import adaspec.bench.profile as advise

    monkeypatch.setattr("adaspec.bench.prompts.corpus_text",
                        lambda max_chars=600_000: "Some real background text, sentence after sentence. " * 200)
    monkeypatch.setattr(advise, "decide", lambda k, ci: "yes")  # always confirm
    seen = {}
    confirm = advise._confirm

    def spy(plain, backend, drafter, *args, **kwargs):
        seen["before"] = drafter.cache.responses
        out = confirm(plain, backend, drafter, *args, **kwargs)
        seen["after"] = drafter.cache.responses
        return out

    monkeypatch.setattr(advise, "_confirm", spy)
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"prompt": f"def add_{i}(a, b):\n    return a + b\n" * 3}) + "\n"
                                for i in range(4)))
    advice = advise.profile_workload(str(workload), target="tiny-target", drafts=["suffix"], sample=2,
                                     max_new_tokens=12, loader=tiny_loader, threads=1, bootstrap=50,
                                     confirm_tokens=12)
    assert [c["drafter"] for c in advice["candidates"]] == ["suffix"] and advice["recommended"]["drafter"] == "suffix"
    assert seen == {"before": 0, "after": 2}  # a fresh cache, kept across the two confirmation prompts


def test_profile_decision_and_reasons():
    from adaspec.bench.profile import MARGIN, _why_not, decide

    assert decide(0, [1.2, 1.3]) == "no"  # no K beats plain decoding
    assert decide(3, [0.8, 0.95]) == "no"
    assert decide(3, [1.0 + MARGIN + 0.01, 1.5]) == "yes"
    assert decide(2, [1.02, 1.05]) == "marginal"  # above 1, but within the cost model's own error
    assert decide(2, [0.97, 1.10]) == "marginal"
    # verify(n) = 100 + 60 (n - 1) ms: K = 1 with a free draft pays when 2α/(1+α)... i.e. (1 + α) / 1.6 >= 1: α >= 0.6
    model = FittedCostModel({n: (100.0 + 60 * (n - 1), 0.0) for n in (1, 2, 3, 5, 9)}, {"big-draft": (80.0, 0.0)}, 0.0)
    lookup = {"drafter": "ngram", "alpha": 0.4, "draft_ms_per_token": 0.0}
    assert re.search(r"ngram: acceptance 0\.40 on code is below the 0\.60 that even K = 1 needs",
                     _why_not(model, lookup, 256, "code", 100.0))
    # enough acceptance, but it drafted too rarely (an n-gram that seldom matches) for any K to clear 1
    rare = {**lookup, "alpha": 0.9, "drafting_steps_share": 0.1, "predicted_speedup": 1.0, "ci95": [0.9, 0.99]}
    assert _why_not(model, rare, 256, "code", 100.0) == (
        "ngram: acceptance 0.90 on code meets the 0.60 K = 1 needs, but it drafts on 10% of steps and its predicted "
        "speedup is 1.00 (95 % interval 0.90-0.99)")
    heavy = {"drafter": "big-draft", "alpha": 0.99, "draft_ms_per_token": 80.0}
    assert "big-draft: cannot pay at any acceptance (a draft token costs 0.80 of a 100 ms step and verify(2) 1.60" \
        in _why_not(model, heavy, 256, "code", 100.0)
