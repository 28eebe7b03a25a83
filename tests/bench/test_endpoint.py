"""``adaspec bench --endpoint``, ``adaspec map`` on endpoint results and ``adaspec advise --for``.

Live servers on 127.0.0.1 only: ``adaspec serve`` with the tiny random Llama of test_server.py (its own draft model,
so every draft token is accepted and the counters can be checked exactly), small FastAPI fakes for servers that are
not OpenAI-compatible or have no ``/metrics``, and (slow) llama-cpp-python's own OpenAI server with the zoo's
smollm2-135m-instruct GGUF, prompt lookup on vs off. vLLM's and SGLang's ``/metrics`` formats are fixtures written
from their documentation and source (cited at each fixture).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

import httpx  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse  # noqa: E402
from test_server import LiveServer, build_tiny_model, live, make_host  # noqa: E402

from adaspec.bench import engine_metrics  # noqa: E402
from adaspec.bench.costmodel import alpha_for_tau  # noqa: E402
from adaspec.bench.endpoint import (EndpointConfig, EndpointError, RequestResult, open_loop,  # noqa: E402
                                    run_endpoint_bench, summarise)
from adaspec.bench.endpoint_report import make_endpoint_report  # noqa: E402
from adaspec.bench.advise import (advise_files, engine_config, fit_level, predicted_speedup,  # noqa: E402
                                         ranges)
from adaspec.cli import main as cli_main  # noqa: E402
from adaspec.errors import ConfigError  # noqa: E402

PROMPTS = ["Write a Python function that reverses a string.", "Write a Python function that adds two numbers.",
           "Write a Python function that checks for palindromes."]


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("wl") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    return str(path)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``adaspec serve`` on the tiny model, its own draft (K = 4, fixed controller)."""
    host = make_host(str(build_tiny_model(tmp_path_factory.mktemp("tiny"))))
    with live(host, max_queue=64) as srv:
        yield srv
    host.shutdown()


def _cfg(url: str, workload: str, **kw) -> EndpointConfig:
    return EndpointConfig(url=url, baseline_body={"speculation": {"drafter": "none"}}, workload=workload, prompts=3,
                          max_tokens=12, **kw)


def _rows(path: Path, kind: str = "endpoint") -> list[dict]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == kind]


def test_adaspec_serve_on_vs_off_with_exact_counters(served, workload, tmp_path):
    out = tmp_path / "ep.jsonl"
    result = run_endpoint_bench(_cfg(served.url, workload, concurrency=[1, 2]), out, log=lambda m: None)
    assert (result["run"], result["done"], result["stopped"]) == (4, 0, False)
    rows = _rows(out)
    assert sorted((r["arm"], r["concurrency"]) for r in rows) == [("baseline", 1), ("baseline", 2),
                                                                   ("speculative", 1), ("speculative", 2)]
    for r in rows:
        assert r["completed"] == r["requests"] == {1: 3, 2: 4}[r["concurrency"]] and r["failed"] == 0
        assert r["tokens_counted"] == "usage"
        assert r["output_tokens"] == sum(d[2] for d in r["requests_detail"])
        assert r["throughput_tok_s"] == pytest.approx(r["output_tokens"] / r["wall_s"], rel=1e-3)
        assert 0 < r["ttft_ms"]["p50"] <= r["e2e_ms"]["p50"]
        spec = r["spec"]
        assert spec["source"] == "counters" and spec["engine"] == "adaspec"
        if r["arm"] == "baseline":  # speculation off per request: the counters do not move
            assert spec["draft_tokens"] == 0 and "no draft tokens" in spec["note"]
        else:  # the tiny model drafts for itself: every draft token is accepted
            assert spec["draft_tokens"] > 0 and spec["accepted"] == spec["draft_tokens"]
            assert spec["acceptance_rate"] == 1.0
            assert spec["mean_acceptance_length"] == pytest.approx(1 + spec["mean_draft_length"])
            # fixed K = 4, 12 tokens per answer: the prefill's token, two steps of 4 drafts + 1, one plain step
            assert spec["mean_draft_length"] == 4.0 and spec["drafts"] == 2 * r["completed"]
            assert sum(spec["acceptance_per_pos"]) * spec["drafts"] == pytest.approx(spec["accepted"])
    # resumes: nothing left to measure; a line cut by a kill is measured again
    again = run_endpoint_bench(_cfg(served.url, workload, concurrency=[1, 2]), out, log=lambda m: None)
    assert (again["run"], again["done"], again["key"]) == (0, 4, result["key"])
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:40] + "\n")
    assert run_endpoint_bench(_cfg(served.url, workload, concurrency=[1, 2]), out,
                              log=lambda m: None)["run"] == 1

    report = make_endpoint_report([out], tmp_path / "endpoint.md")
    text = report["report"].read_text()
    assert "## Speculation on vs off" in text and "| 2 clients |" in text and "1.000" in text
    assert set(report["figures"]) == {"speedup-closed", "throughput-latency", "acceptance-per-position"}
    assert all(p.stat().st_size > 5000 for p in report["figures"].values())

    advice = advise_files([out], "vllm")
    assert [lv["concurrency"] for lv in advice["levels"]] == [1, 2]
    assert all(lv["alpha"] == 1.0 for lv in advice["levels"])
    # whether speculation is advised depends on the speeds measured (a busy machine may say off): the command says
    # what the levels say either way
    command = advice["config"]["command"]
    speculate = any(lv["k"] != 0 for lv in advice["levels"])
    assert ("--speculative-config" in command) == speculate, (advice["levels"], command)
    if speculate:
        assert json.loads(command.split("--speculative-config ", 1)[1].strip("'"))["method"] == "ngram"


def test_cli_bench_endpoint_then_map_and_advise(served, workload, tmp_path, capsys):
    out = tmp_path / "cli.jsonl"
    assert cli_main(["bench", "--endpoint", served.url + "/v1",
                     "--baseline-body", '{"speculation": {"drafter": "none"}}',
                     "--workload", workload, "--prompts", "2", "--max-tokens", "8", "--out", str(out)]) == 0
    assert "2 configurations measured" in capsys.readouterr().out
    meta = _rows(out, "meta")[0]
    assert "--baseline-body" in meta["argv"] and meta["models"]["speculative"]
    assert cli_main(["map", str(out), "--report", str(tmp_path / "r.md")]) == 0
    assert "Produced by" in (tmp_path / "r.md").read_text()
    assert cli_main(["advise", str(out), "--for", "llamacpp"]) == 0
    assert "llama-server -m" in capsys.readouterr().out
    prof = tmp_path / "profile.jsonl"
    assert cli_main(["profile", workload, "--endpoint", served.url, "--baseline-body",
                     '{"speculation": {"drafter": "none"}}', "--sample", "3", "--max-new-tokens", "8", "--out",
                     str(prof), "--json", "--rounds", "2"]) == 0
    p = json.loads(capsys.readouterr().out)
    assert p["prompts"] == 3 and p["acceptance_rate"] == 1.0 and p["enable"] in ("yes", "no", "marginal")
    assert p["ci95"][0] <= p["speedup"] <= p["ci95"][1]
    assert sorted((r["arm"], r["round"]) for r in _rows(prof)) == [("baseline", 0), ("baseline", 1),
                                                                   ("speculative", 0), ("speculative", 1)]
    assert cli_main(["bench", "--endpoint", served.url, "--settle", "-1"]) == 2
    assert "--settle takes seconds >= 0, not -1.0" in capsys.readouterr().err
    assert cli_main(["profile", workload, "--interleave"]) == 2
    assert "give --endpoint URL" in capsys.readouterr().err


def test_profile_widens_its_random_sample_until_the_precision_is_reached(served, workload, tmp_path, capsys):
    """--precision: one prompt cannot show a spread, so the profile measures the rest of the workload in a second
    pass, prompts the first pass did not send (one seeded order); --pick first takes the file's first prompts."""
    prof = tmp_path / "widen.jsonl"
    argv = ["profile", workload, "--endpoint", served.url, "--baseline-body", '{"speculation": {"drafter": "none"}}',
            "--max-new-tokens", "6", "--confirm-tokens", "6", "--out", str(prof), "--json"]
    assert cli_main([*argv, "--sample", "1", "--precision", "0.001"]) == 0
    captured = capsys.readouterr()
    p = json.loads(captured.out)
    assert (p["prompts"], p["passes"], p["workload_prompts"], p["precision_target"]) == (3, 3, 3, 0.001)
    assert p["precision_reached"] is False  # three prompts cannot reach ±0.1 %: the workload ran out
    # each pass at most doubles the sample: 1, then 1 more, then the last
    assert "1 prompt(s): no spread yet, short of ±0.1%; measuring prompts 2-2 of 3" in captured.err
    assert "; measuring prompts 3-3 of 3" in captured.err
    passes = [sorted({d[0] for d in r["requests_detail"]}) for r in _rows(prof) if r["arm"] == "speculative"]
    assert [len(ids) for ids in passes] == [1, 1, 1] and sorted(sum(passes, [])) == ["p0", "p1", "p2"]
    assert p["precision"] == pytest.approx((p["ci95"][1] - p["ci95"][0]) / 2 / p["speedup"], abs=2e-3)
    first = tmp_path / "first.jsonl"
    argv[argv.index(str(prof))] = str(first)
    assert cli_main([*argv, "--sample", "1", "--pick", "first"]) == 0
    p = json.loads(capsys.readouterr().out)
    assert (p["prompts"], p["passes"], p["precision"]) == (1, 1, None)
    assert [d[0] for d in _rows(first)[0]["requests_detail"]] == ["p0"]
    assert cli_main([*argv, "--precision", "1.5"]) == 2
    assert "--precision takes a fraction" in capsys.readouterr().err
    assert cli_main(["profile", workload, "--precision", "0.1"]) == 2
    assert "give --endpoint URL" in capsys.readouterr().err
    assert cli_main(["profile", workload, "--pick", "first"]) == 2
    assert "give --endpoint URL" in capsys.readouterr().err


def test_select_prompts_draws_disjoint_passes_of_one_random_order():
    from adaspec.bench.endpoint import select_prompts

    items = list(range(40))
    first, second = select_prompts(items, 10, "random", 0, seed=3), select_prompts(items, 15, "random", 10, seed=3)
    assert first == sorted(first) and second == sorted(second)  # file order kept
    assert len(first) == 10 and len(second) == 15 and not set(first) & set(second)
    assert sorted(first + second) == select_prompts(items, 25, "random", 0, seed=3)  # nested: one sample, widened
    assert first != list(range(10)) and select_prompts(items, 10, "random", 0, seed=4) != first
    assert select_prompts(items, 5, "first", 2) == [2, 3, 4, 5, 6]
    assert select_prompts(items, 100, "random") == items  # the whole workload, in file order
    with pytest.raises(ConfigError, match="40 prompts: none left after skipping 40"):
        select_prompts(items, 1, "random", 40)


def test_prompts_needed_is_the_smallest_sample_reaching_the_precision():
    from adaspec.bench.advise import prompts_needed
    from adaspec.quality.stats import t975

    ratios = [2.0, 4.0, 3.0, 2.5, 3.5]  # mean 3, sd 0.791: rel. spread 0.264
    n = prompts_needed(ratios, 0.10)
    rel = 0.7905694 / 3 / 0.10
    assert t975(n - 1) * rel / n ** 0.5 <= 1 < t975(n - 2) * rel / (n - 1) ** 0.5
    assert n == 30
    assert prompts_needed(ratios, 0.50) == 4  # 4.30 × 0.527 / √3 = 1.31 > 1; 3.18 × 0.527 / √4 = 0.84
    assert prompts_needed([3.0, 3.0], 0.10) == 2 and prompts_needed([3.0], 0.10) is None
    with pytest.raises(ValueError, match="precision must be > 0"):
        prompts_needed(ratios, 0)


# ----------------------------------------------------------------------------------------------------------------
# Servers that are not adaspec: fakes for the fault paths, llama-cpp-python's server (slow)
# ----------------------------------------------------------------------------------------------------------------


def fake_app(*, metrics: bool = False, html: bool = False, models: bool = True, delay_s: float = 0.0,
             no_stream_options: bool = False, chunk: dict | None = None) -> FastAPI:
    """A minimal OpenAI-style streaming server: 4 chunks of one word each, optionally llama-server timings."""
    app = FastAPI()

    @app.get("/v1/models")
    def _models():
        return {"object": "list", "data": [{"id": "fake", "object": "model"}]} if models else HTMLResponse("no", 404)

    @app.post("/v1/chat/completions")
    def _chat(body: dict):
        if html:
            return HTMLResponse("<html>hello</html>")
        if no_stream_options and "stream_options" in body:
            return JSONResponse({"error": {"message": "unknown field stream_options"}}, status_code=400)

        def gen():
            for i in range(4):
                time.sleep(delay_s)
                piece = chunk or {"choices": [{"index": 0, "delta": {"content": f"w{i} "}, "finish_reason": None}]}
                yield f"data: {json.dumps(piece)}\n\n"
            yield "data: " + json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
                                         "timings": {"draft_n": 6, "draft_n_accepted": 3}}) + "\n\n"
            yield "data: [DONE]\n\n"
        return StreamingResponse(gen(), media_type="text/event-stream")

    if metrics:
        @app.get("/metrics")
        def _metrics():
            return HTMLResponse("this is { not prometheus", media_type="text/plain")
    return app


def test_server_without_metrics_gives_a_labelled_partial_result(workload, tmp_path):
    with LiveServer(fake_app()) as srv:
        out = tmp_path / "fake.jsonl"
        run_endpoint_bench(EndpointConfig(url=srv.url, workload=workload, prompts=2, max_tokens=4), out,
                           log=lambda m: None)
    (row,) = _rows(out)
    assert row["completed"] == 2 and row["tokens_counted"] == "chunks" and row["output_tokens"] == 8
    assert row["itl_ms"] is not None and row["tpot_ms"]["p50"] >= 0
    # no /metrics: acceptance comes from the responses' llama-server timings, labelled as such
    assert row["spec"]["source"] == "responses" and row["spec"]["acceptance_rate"] == 0.5
    assert row["spec"]["draft_tokens"] == 12 and "no /metrics (HTTP 404)" in row["spec"]["note"]


def test_a_server_refusing_stream_options_is_measured_without_them(workload, tmp_path):
    with LiveServer(fake_app(no_stream_options=True)) as srv:
        out = tmp_path / "old.jsonl"
        run_endpoint_bench(EndpointConfig(url=srv.url, workload=workload, prompts=1, requests=2), out,
                           log=lambda m: None)
    (row,) = _rows(out)
    assert row["completed"] == 2 and row["failed"] == 0 and row["tokens_counted"] == "chunks"
    assert _rows(out, "meta")[0]["config"]["stream_usage"] is False


def test_odd_replies_are_failed_requests_and_reasoning_counts_as_output(workload, tmp_path):
    with LiveServer(fake_app(chunk={"choices": 5, "timings": {"draft_n": [1]}})) as srv:
        out = tmp_path / "odd.jsonl"  # malformed chunks are skipped, not fatal; the final chunk ends an empty answer
        run_endpoint_bench(EndpointConfig(url=srv.url, workload=workload, requests=2), out, log=lambda m: None)
    (row,) = _rows(out)
    assert (row["completed"], row["failed"], row["output_tokens"]) == (2, 0, 0)
    assert row["response_timings"]["draft_tokens"] == 12  # the final chunks' counts; the lists were not read
    reasoning = {"choices": [{"index": 0, "delta": {"reasoning_content": "hmm "}, "finish_reason": None}]}
    with LiveServer(fake_app(chunk=reasoning, delay_s=0.01)) as srv:
        out = tmp_path / "reasoning.jsonl"
        run_endpoint_bench(EndpointConfig(url=srv.url, workload=workload, requests=2), out, log=lambda m: None)
    (row,) = _rows(out)
    assert row["completed"] == 2 and row["output_tokens"] == 8  # 4 reasoning chunks per answer are its output
    assert row["itl_ms"] is not None and row["decode_tok_s"] is not None


def test_a_configuration_cut_by_the_time_limit_is_kept_but_measured_again(workload, tmp_path):
    out = tmp_path / "cut.jsonl"
    with LiveServer(fake_app(delay_s=0.05)) as srv:
        cfg = EndpointConfig(url=srv.url, workload=workload, prompts=1, requests=20)
        first = run_endpoint_bench(cfg, out, log=lambda m: None, time_limit_s=1.0)
        assert first["stopped"] and first["run"] == 0
        partial = _rows(out, "endpoint_partial")
        assert len(partial) == 1 and 0 < partial[0]["completed"] < 20 and not _rows(out)
        again = run_endpoint_bench(cfg, out, log=lambda m: None)
    assert (again["run"], again["stopped"]) == (1, False) and _rows(out)[0]["completed"] == 20


def test_settling_decodes_full_requests_before_measuring(workload, tmp_path):
    logs = []
    with LiveServer(fake_app(delay_s=0.02)) as srv:
        out = tmp_path / "settled.jsonl"
        run_endpoint_bench(EndpointConfig(url=srv.url, workload=workload, prompts=2, requests=2), out,
                           log=logs.append, settle_s=0.3)
        (line,) = [m for m in logs if "settled for 0.3 s" in m]
        logs.clear()  # the same command again: nothing left to measure, so nothing to settle
        again = run_endpoint_bench(EndpointConfig(url=srv.url, workload=workload, prompts=2, requests=2), out,
                                   log=logs.append, settle_s=30.0)
    rates = [float(x) for x in line.split(": ")[-1].split()]
    # 4 chunks 20 ms apart, one token each: 3 tokens after the first in at least 60 ms (50 tokens/s at most)
    assert len(rates) >= 2 and all(0 < r <= 50 for r in rates)
    assert _rows(out)[0]["completed"] == 2
    assert again["run"] == 0 and not [m for m in logs if "settled" in m]
    with LiveServer(fake_app(delay_s=0.02)) as srv:  # the time limit bounds the settling too
        t0 = time.monotonic()
        cut = run_endpoint_bench(EndpointConfig(url=srv.url, workload=workload, prompts=2, requests=2),
                                 tmp_path / "short.jsonl", log=lambda m: None, settle_s=60.0, time_limit_s=1.0)
    assert cut["stopped"] and time.monotonic() - t0 < 10
    with pytest.raises(ConfigError, match="--settle takes seconds >= 0"):
        run_endpoint_bench(EndpointConfig(url="http://x:1", workload=workload), out, settle_s=float("inf"))
    with LiveServer(fake_app(html=True)) as srv:
        from adaspec.bench.endpoint import settle
        from adaspec.bench.endpoint_client import Arm
        from adaspec.workloads import load_workload

        with httpx.Client() as client, pytest.raises(EndpointError, match="failed a settling request"):
            settle(client, Arm("speculative", srv.url), EndpointConfig(url=srv.url, workload=workload), "fake",
                   load_workload(workload)[:1], 0.1)


def test_interleaved_arms_answer_each_prompt_back_to_back(workload, tmp_path):
    """--interleave at one client: prompt i goes to both servers before prompt i + 1, the first server alternating;
    each arm's row counts only its own requests; one server for both arms is refused."""
    seen: list[tuple[str, str]] = []

    def recording(name: str) -> FastAPI:
        app = fake_app()
        route = next(r for r in app.routes if getattr(r, "path", "") == "/v1/chat/completions")
        inner = route.endpoint

        def chat(body: dict):
            seen.append((name, body["messages"][-1]["content"][:40]))
            return inner(body)
        app.router.routes.remove(route)
        app.post("/v1/chat/completions")(chat)
        return app

    with LiveServer(recording("spec")) as a, LiveServer(recording("base")) as b:
        out = tmp_path / "inter.jsonl"
        cfg = EndpointConfig(url=a.url, baseline=b.url, workload=workload, prompts=3, max_tokens=4, interleave=True)
        run_endpoint_bench(cfg, out, log=lambda m: None)
    measured = seen[2:]  # after one warm-up request per arm
    assert [name for name, _ in measured] == ["spec", "base", "base", "spec", "spec", "base"]
    assert [text for _, text in measured][0::2] == [text for _, text in measured][1::2]  # each pair: one prompt
    assert len({text for _, text in measured}) == 3
    rows = {r["arm"]: r for r in _rows(out)}
    assert rows["speculative"]["completed"] == rows["baseline"]["completed"] == 3
    assert _rows(out, "meta")[0]["config"]["interleave"] is True
    with pytest.raises(ConfigError, match="--interleave needs the baseline on its own server"):
        EndpointConfig(url="http://x:1", baseline_body={}, interleave=True).validate()
    with pytest.raises(ConfigError, match="--interleave alternates the arms at one client"):
        EndpointConfig(url="http://x:1", baseline="http://y:2", concurrency=[2, 4], interleave=True).validate()
    with LiveServer(fake_app(delay_s=0.05)) as a, LiveServer(fake_app(delay_s=0.05)) as b:
        cut = tmp_path / "cut.jsonl"  # a pair cut by the time limit: both arms' requests are kept
        cfg = EndpointConfig(url=a.url, baseline=b.url, workload=workload, prompts=1, requests=100, interleave=True)
        assert run_endpoint_bench(cfg, cut, log=lambda m: None, time_limit_s=2.0)["stopped"]
    partial = {r["arm"]: r for r in _rows(cut, "endpoint_partial")}
    assert set(partial) == {"speculative", "baseline"} and not _rows(cut)
    assert 0 < partial["baseline"]["completed"] < 100
    assert partial["speculative"]["completed"] == partial["baseline"]["completed"]  # a pair is never split


def test_unparsable_metrics_are_a_note_not_a_crash(workload, tmp_path):
    with LiveServer(fake_app(metrics=True)) as srv:
        out = tmp_path / "bad-metrics.jsonl"
        run_endpoint_bench(EndpointConfig(url=srv.url, workload=workload, prompts=1, max_tokens=4, requests=1), out,
                           log=lambda m: None)
    (row,) = _rows(out)
    assert row["completed"] == 1 and "not Prometheus text format" in row["spec"]["note"]


def test_non_openai_and_unreachable_servers_are_clear_errors(workload, tmp_path):
    with LiveServer(fake_app(html=True)) as srv:
        with pytest.raises(EndpointError, match="failed a one-request check: .*not an OpenAI response|no OpenAI"):
            run_endpoint_bench(EndpointConfig(url=srv.url, workload=workload), tmp_path / "x.jsonl")
    with LiveServer(fake_app(models=False)) as srv:
        with pytest.raises(EndpointError, match="not an OpenAI-compatible server.*give --model"):
            run_endpoint_bench(EndpointConfig(url=srv.url, workload=workload), tmp_path / "x.jsonl")
        out = tmp_path / "named.jsonl"  # with --model it needs no model list
        run_endpoint_bench(EndpointConfig(url=srv.url, workload=workload, model="fake", prompts=1, requests=1), out)
        assert _rows(out)[0]["completed"] == 1
    with pytest.raises(EndpointError, match="cannot reach http://127.0.0.1:9 .*ConnectError"):
        run_endpoint_bench(EndpointConfig(url="http://127.0.0.1:9", workload=workload), tmp_path / "x.jsonl")
    assert not (tmp_path / "x.jsonl").exists()  # nothing measured, nothing written
    with pytest.raises(ConfigError, match="not an http"):
        run_endpoint_bench(EndpointConfig(url="ftp://x", workload=workload), tmp_path / "x.jsonl")
    for bad in ("http://127.0.0.1:80a", "http://[::1"):
        with pytest.raises(ConfigError, match="not a valid URL"):
            run_endpoint_bench(EndpointConfig(url=bad, workload=workload), tmp_path / "x.jsonl")
    for bad, what in (([1.5], "--concurrency"), ([0], "--concurrency")):
        with pytest.raises(ConfigError, match=what):
            EndpointConfig(url="http://x", concurrency=bad).validate()
    with pytest.raises(ConfigError, match="finite"):
        EndpointConfig(url="http://x", rates=[float("nan")]).validate()
    twice = EndpointConfig(url="http://x", concurrency=[2, 2, 1])
    twice.validate()
    assert twice.concurrency == [2, 1]
    with pytest.raises(ConfigError, match="--concurrency"):
        EndpointConfig(url="http://x", concurrency=[0]).validate()
    with pytest.raises(ConfigError, match="--rate"):
        EndpointConfig(url="http://x", rates=[-1.0]).validate()


def test_open_loop_poisson_arrivals_and_time_limit(workload, tmp_path):
    calls: list[float] = []

    def call(i: int) -> RequestResult:
        calls.append(time.monotonic())
        return RequestResult(str(i), ok=True, ttft_s=0.001, e2e_s=0.002, tokens=2, chunks=[0.001, 0.002])

    t0 = time.monotonic()
    results = open_loop(call, 12, rate=40.0, seed=3, deadline=t0 + 30, max_inflight=4)
    assert len(results) == 12 and all(r.late_s >= 0 for r in results)
    # seeded exponential gaps: the 12th arrival is at the seed's cumulative sum (mean 12 / 40 s)
    import random
    rng = random.Random(3)
    last = sum(rng.expovariate(40.0) for _ in range(12))
    assert max(calls) - t0 == pytest.approx(last, abs=0.05)
    short = open_loop(call, 1000, rate=40.0, seed=3, deadline=time.monotonic() + 0.3, max_inflight=4)
    assert 3 <= len(short) <= 30  # bounded by the deadline, not the count

    with LiveServer(fake_app(delay_s=0.002)) as srv:
        out = tmp_path / "open.jsonl"
        run_endpoint_bench(EndpointConfig(url=srv.url, workload=workload, prompts=3, concurrency=[], rates=[20.0],
                                          requests=6), out, log=lambda m: None)
    (row,) = _rows(out)
    assert row["load"] == "open" and row["rate"] == 20.0 and row["completed"] == 6 and row["late_ms"] is not None


def test_summarise_goodput_and_percentiles():
    rs = [RequestResult(str(i), ok=True, ttft_s=t, e2e_s=t + 0.09, tokens=10, tokens_from_usage=True,
                        chunks=[t + 0.01 * j for j in range(10)]) for i, t in enumerate([0.1, 0.2, 0.3, 0.4])]
    rs.append(RequestResult("bad", error="HTTP 500: boom"))
    s = summarise(rs, wall_s=2.0, slo_ttft_ms=250, slo_tpot_ms=10.0 + 1e-6)
    assert s["completed"] == 4 and s["failed"] == 1 and s["errors"] == {"HTTP 500: boom": 1}
    assert s["throughput_tok_s"] == 20.0 and s["request_rate"] == 2.0
    assert s["tpot_ms"]["p50"] == pytest.approx(10.0) and s["itl_ms"]["p50"] == pytest.approx(10.0)
    assert s["decode_tok_s"] == pytest.approx(36 / 0.36, rel=1e-3)
    assert s["ttft_ms"]["p50"] in (200.0, 300.0) and s["ttft_ms"]["p95"] == 400.0
    assert s["goodput"]["requests"] == 2 and s["goodput"]["req_s"] == 1.0


def _free_port_url() -> tuple[str, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}", port


@pytest.mark.slow
def test_llama_cpp_python_server_prompt_lookup_on_vs_off(workload, tmp_path):
    pytest.importorskip("llama_cpp")
    pytest.importorskip("sse_starlette", reason="llama-cpp-python's server extra is not installed")
    from adaspec.models.resolve import resolve_gguf

    _, gguf, _ = resolve_gguf("smollm2-135m-instruct", progress=False)
    procs, urls = [], []
    try:
        for extra in ([], ["--draft_model", "prompt-lookup-decoding", "--draft_model_num_pred_tokens", "4"]):
            url, port = _free_port_url()
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port",
                 str(port), "--n_ctx", "1024", "--n_threads", "1", "--verbose", "false", *extra],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
            urls.append(url)
        for proc, url in zip(procs, urls):
            deadline = time.monotonic() + 120
            while True:
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                try:
                    if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "llama_cpp.server did not start"
                time.sleep(0.5)
        out = tmp_path / "llamacpp.jsonl"
        run_endpoint_bench(EndpointConfig(url=urls[1], baseline=urls[0], workload=workload, prompts=2,
                                          max_tokens=12), out, log=lambda m: None)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)
    rows = {r["arm"]: r for r in _rows(out)}
    assert set(rows) == {"speculative", "baseline"}
    for r in rows.values():
        assert r["completed"] == 2 and r["failed"] == 0 and r["output_tokens"] > 6
        assert r["spec"]["source"] == "none" and "no /metrics (HTTP 404)" in r["spec"]["note"]
    report = make_endpoint_report([out], tmp_path / "llamacpp.md")
    assert "no /metrics" in report["report"].read_text() and report["figures"]["throughput-latency"].exists()
    advice = advise_files([out], "llamacpp")
    assert advice["levels"][0]["basis"] == "measured speedup only"


# ----------------------------------------------------------------------------------------------------------------
# /metrics formats of other engines (fixtures written from their documentation and source)
# ----------------------------------------------------------------------------------------------------------------

# vLLM V1 (docs.vllm.ai/en/stable/usage/metrics.html; vllm/v1/spec_decode/metrics.py, SpecDecodingProm): counters
# with the engine label, per-position counter labelled "position"; prometheus-client adds _total and _created.
VLLM_BEFORE = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="llama-8b"} 100.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="llama-8b"} 1.7e+09
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="llama-8b"} 300.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="llama-8b"} 150.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="llama-8b",position="0"} 80.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="llama-8b",position="1"} 45.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="llama-8b",position="2"} 25.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="llama-8b"} 400.0
"""


def _vllm_after() -> str:
    text = VLLM_BEFORE
    for old, new in (("} 100.0", "} 140.0"), ("} 300.0", "} 420.0"), ("} 150.0", "} 210.0"), ("} 80.0", "} 112.0"),
                     ("} 45.0", "} 63.0"), ("} 25.0", "} 35.0")):
        text = text.replace(old, new)
    return text


def test_vllm_counters_give_alpha_tau_and_per_position():
    before, after = engine_metrics.parse(VLLM_BEFORE), engine_metrics.parse(_vllm_after())
    assert before.engine == "vllm" and before.counters == {"drafts": 100, "draft_tokens": 300, "accepted": 150}
    assert before.per_pos == {0: 80, 1: 45, 2: 25} and before.generation_tokens == 400
    s = engine_metrics.spec_stats(before, after)
    assert (s["drafts"], s["draft_tokens"], s["accepted"]) == (40, 120, 60)
    assert s["acceptance_rate"] == 0.5 and s["mean_acceptance_length"] == 2.5 and s["mean_draft_length"] == 3.0
    assert s["acceptance_per_pos"] == [0.8, 0.45, 0.25]
    assert engine_metrics.spec_stats(after, before)["note"].startswith("the counters went down")


# SGLang (python/sglang/srt/metrics/collector.py, SchedulerMetricsCollector): gauges per TP/DP rank.
SGLANG = """# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{dp_rank="0",engine_type="unified",model_name="qwen",tp_rank="0"} 2.5
sglang:spec_accept_length{dp_rank="1",engine_type="unified",model_name="qwen",tp_rank="0"} 3.5
# TYPE sglang:spec_accept_rate gauge
sglang:spec_accept_rate{dp_rank="0",engine_type="unified",model_name="qwen",tp_rank="0"} 0.4
sglang:spec_accept_rate{dp_rank="1",engine_type="unified",model_name="qwen",tp_rank="0"} 0.6
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="qwen"} 3.0
"""


def test_sglang_gauges_are_read_as_a_labelled_window():
    s = engine_metrics.spec_stats(engine_metrics.parse(SGLANG), engine_metrics.parse(SGLANG))
    assert s["source"] == "window" and s["engine"] == "sglang"
    assert s["mean_acceptance_length"] == 3.0 and s["acceptance_rate"] == pytest.approx(0.5)
    assert "not differenced" in s["note"]


def test_metrics_without_spec_series_and_garbage():
    plain = "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 12\n"
    assert engine_metrics.spec_stats(None, engine_metrics.parse(plain))["note"].startswith("the server's /metrics")
    with pytest.raises(engine_metrics.MetricsFormatError):
        engine_metrics.parse("metric{label=unquoted} x y z")
    # no scrape before the run: the counters since the server started are not the run's
    assert "no /metrics scrape before" in engine_metrics.spec_stats(None, engine_metrics.parse(VLLM_BEFORE))["note"]
    odd = VLLM_BEFORE.replace('position="2"', 'position="a"')
    assert engine_metrics.parse(odd).per_pos == {0: 80, 1: 45}  # an unreadable position label is skipped
    nan = engine_metrics.parse(_vllm_after().replace("} 420.0", "} NaN"))
    assert engine_metrics.spec_stats(engine_metrics.parse(VLLM_BEFORE), nan)["note"] == "the counters are not finite numbers"


def test_alpha_from_tau_inverts_leviathan_eq1():
    for alpha in (0.0, 0.3, 0.7, 0.95):
        for k in (1, 3, 6):
            tau = (1 - alpha ** (k + 1)) / (1 - alpha)
            assert alpha_for_tau(tau, k) == pytest.approx(alpha, abs=1e-6)
    assert alpha_for_tau(5.0, 4) == 1.0 and alpha_for_tau(1.0, 4) == 0.0


def test_advice_fit_reproduces_the_measured_point_and_picks_k():
    alpha, cost = fit_level(speedup=1.5, tau=2.8, k_bar=4)
    assert predicted_speedup(alpha, cost, 4) == pytest.approx(1.5)
    assert cost == pytest.approx((2.8 / 1.5 - 1) / 4)
    # cheap drafts and high α favour longer drafts than expensive ones
    best = {c: max(range(9), key=lambda k: predicted_speedup(0.8, c, k)) for c in (0.02, 0.3)}
    assert best[0.02] > best[0.3] >= 1
    lv = [{"concurrency": 1, "k": 5}, {"concurrency": 4, "k": 3}, {"concurrency": 8, "k": 3},
          {"concurrency": 16, "k": 0}]
    assert ranges(lv, 4) == [[1, 3, 5], [4, 15, 3], [16, 512, 0]]
    assert ranges([{"concurrency": 1, "k": 4}, {"concurrency": 1024, "k": 0}], 4) == [[1, 1023, 4], [1024, 1024, 0]]
    assert ranges([{"concurrency": 600, "k": 0}], 4) == [[1, 600, 0]]
    conf = engine_config("vllm", {"levels": [dict(e, k_measured=4.0) for e in lv]}, model="m", method="draft",
                         draft="d")
    spec = json.loads(conf["command"].split("--speculative-config ", 1)[1].strip("'"))
    assert spec == {"method": "draft_model", "model": "d", "num_speculative_tokens": 5,
                    "num_speculative_tokens_per_batch_size": [[1, 3, 5], [4, 15, 3], [16, 512, 0]]}
    sg = engine_config("sglang", {"levels": [dict(e, k_measured=4.0) for e in lv]}, model="m")
    assert "--speculative-num-steps 5" in sg["command"] and any("16 concurrent" in n for n in sg["notes"])
    off = engine_config("llamacpp", {"levels": [{"concurrency": 1, "k": 0, "k_measured": 3.0}]}, model="m")
    assert off["command"] == "llama-server -m m.gguf"


def test_profile_endpoint_pairs_prompts_across_arms():
    from adaspec.bench.advise import paired_speedups, profile_endpoint

    rows = [{"kind": "endpoint", "arm": "speculative", "spec": {"acceptance_rate": 0.5},
             "requests_detail": [["a", True, 11, 100, 1100], ["b", True, 11, 100, 600], ["c", False, 0, None, None],
                                 ["d", True, 11, 100, 1100], ["e", True, 11, 100, 1100]]},
            {"kind": "endpoint", "arm": "baseline",
             "requests_detail": [["a", True, 11, 100, 2100], ["b", True, 11, 100, 2100], ["c", True, 5, 10, 50],
                                 ["d", True, 11, 100, 2600], ["e", True, 11, 100, 3100]]}]
    # prompt c: the speculative arm failed it, not paired
    assert sorted(paired_speedups(rows)) == pytest.approx([2.0, 2.5, 3.0, 4.0])
    p = profile_endpoint(rows)
    # Student's t: 2.875 ± 3.182 × 0.854 / 2
    assert p["prompts"] == 4 and p["speedup"] == 2.875
    assert p["ci95"] == pytest.approx([2.875 - 1.359, 2.875 + 1.359], abs=2e-3)
    assert p["enable"] == "yes" and p["acceptance_rate"] == 0.5
    slower = [dict(rows[0], arm="baseline"), dict(rows[1], arm="speculative")]
    assert profile_endpoint(slower)["enable"] == "no"
    two = [dict(r, requests_detail=r["requests_detail"][:2]) for r in rows]  # speedups 2 and 4: t(1) = 12.7
    assert profile_endpoint(two)["enable"] == "marginal"


def test_paired_speedups_take_each_arms_median_over_rounds():
    """A request caught in a slow spell (the baseline's 2nd round of prompt a: 10 tokens in 2 s instead of 1 s)
    does not move the prompt's speedup: each arm's per-prompt median rate is paired."""
    from adaspec.bench.advise import paired_speedups

    def row(arm, rnd, e2e_a, e2e_b):
        return {"kind": "endpoint", "arm": arm, "round": rnd,
                "requests_detail": [["a", True, 11, 100, e2e_a], ["b", True, 11, 100, e2e_b]]}

    rows = [row("speculative", r, 600, 350) for r in range(3)]
    rows += [row("baseline", 0, 1100, 1100), row("baseline", 1, 2100, 1100), row("baseline", 2, 1100, 1000)]
    assert paired_speedups(rows) == pytest.approx([2.0, 4.0])  # a: 10/0.5 over 10/1.0; b: 10/0.25 over 10/1.0


def test_levels_with_failed_requests_give_no_advice_and_are_flagged(tmp_path):
    from adaspec.bench.advise import advise
    from adaspec.errors import AdaspecError

    def row(arm, failed):
        return {"kind": "endpoint", "arm": arm, "load": "closed", "concurrency": 2, "rate": None, "round": 0,
                "throughput_tok_s": 10.0 if arm == "speculative" else 5.0, "completed": 4 - failed,
                "failed": failed, "errors": {"boom": failed} if failed else {}, "spec": {"note": "no /metrics"},
                "url": "http://x", "model": "m"}
    with pytest.raises(AdaspecError, match="without failed requests"):
        advise([row("speculative", 0), row("baseline", 3)])
    path = tmp_path / "f.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [row("speculative", 0), row("baseline", 3)]) + "\n")
    text = make_endpoint_report([path], tmp_path / "f.md")["report"].read_text()
    assert "| 2 clients (3 failed requests) | 2.00× |" in text and "boom ×3" in text
    assert "- baseline: no /metrics" in text


def test_structured_workload_sends_constraints_and_grades_answers(served, tmp_path):
    """--workload structured: each task goes with its schema or forced tool (chat only); streamed content and
    tool-call pieces are put back together and graded (schema validity, exact fields)."""
    from adaspec.bench.endpoint import request_body, structured_summary
    from adaspec.bench.endpoint_client import _read_answer
    from adaspec.structured_workload import load_tasks

    tasks = load_tasks(3)
    cfg = EndpointConfig(url=served.url, workload="structured", prompts=3, max_tokens=24, concurrency=[1])
    sig, answer, tool = (request_body(cfg, "m", t) for t in tasks)
    assert sig["response_format"]["json_schema"]["schema"] == tasks[0].schema and "tools" not in sig
    assert answer["response_format"]["json_schema"]["strict"] is True
    assert tool["tool_choice"] == "required" and tool["tools"][0]["function"]["name"] == "translate"
    with pytest.raises(ConfigError, match="--api chat"):
        EndpointConfig(url=served.url, workload="structured", api="completions").validate()

    right = [RequestResult(t.id, ok=True, finish_reason="stop") for t in tasks]
    right[0].text = json.dumps(tasks[0].expected)
    right[1].text = json.dumps({"reasoning": "r", "answer": tasks[1].expected["answer"] + 1})  # valid, wrong
    arguments = json.dumps(tasks[2].expected)
    for i, delta in enumerate([{"tool_calls": [{"index": 0, "function": {"name": "translate", "arguments": ""}}]},
                               {"tool_calls": [{"index": 0, "function": {"arguments": arguments[:10]}}]},
                               {"tool_calls": [{"index": 0, "function": {"arguments": arguments[10:]}}]}]):
        _read_answer(right[2], delta)
    cut = RequestResult(tasks[0].id, ok=True, finish_reason="length", text=right[0].text)
    assert structured_summary(tasks, right) == {"answers": 3, "valid": 1.0, "exact_fields": round(2 / 3, 4)}
    assert structured_summary(tasks, [cut])["valid"] == 0.0  # cut by the budget: never valid

    out = tmp_path / "structured.jsonl"
    run_endpoint_bench(cfg, out, log=lambda m: None)
    row, = _rows(out)
    assert row["completed"] == 3 and row["failed"] == 0 and row["workload"] == "structured"
    assert row["structured"]["answers"] == 3 and 0.0 <= row["structured"]["valid"] <= 1.0


def test_structured_workload_by_category():
    """``structured:CATEGORY[,CATEGORY]`` takes some of the categories (tool calls one after another share their
    system prompt: what a prefix cache is measured on); an unknown one is named."""
    from adaspec.bench.endpoint import structured_tasks
    from adaspec.structured_workload import load_tasks

    tools = structured_tasks("structured:tool-translate", 4)
    assert [t.category for t in tools] == ["tool-translate"] * 4
    both = structured_tasks("structured:extract-signature,extract-answer", 4)
    assert [t.category for t in both] == ["extract-signature", "extract-answer"] * 2
    assert [t.id for t in structured_tasks("structured", 3)] == [t.id for t in load_tasks(3)]
    EndpointConfig(url="http://x", workload="structured:tool-translate").validate()
    with pytest.raises(ConfigError, match="--api chat"):
        EndpointConfig(url="http://x", workload="structured:tool-translate", api="completions").validate()
    with pytest.raises(ConfigError, match="'tools'"):
        structured_tasks("structured:tools", 2)
