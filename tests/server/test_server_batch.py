"""``adaspec serve --max-batch N``: continuous batching over live servers on loopback (issue 12).

A tiny random-weight Llama in fp32 (its own draft model) from :mod:`test_server`: batched rows run on their own
PyTorch caches, so every answer must equal the unbatched server's, whatever else is in the batch. Also: a client
that disconnects frees its row while the others go on, a failing row fails only its own request, a full queue
answers 503 + Retry-After, and the per-batch-size metrics count what happened.
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

import httpx  # noqa: E402
from test_server import PROMPT, build_tiny_model, health, live, make_host, scrape, value, wait_until  # noqa: E402

from adaspec.drafters.ngram import NgramDrafter  # noqa: E402
from adaspec.server.runtime import ModelHost  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-llama-batch")))


@pytest.fixture(scope="module")
def single(tiny) -> ModelHost:
    h = make_host(tiny)
    yield h
    h.shutdown()


@pytest.fixture(scope="module")
def batched(tiny) -> ModelHost:
    h = ModelHost.load(tiny, tiny, controller="fixed", k=4, dtype="float32", threads=1, progress=False, max_batch=4)
    h.warmup(steps=2)
    h.calibrate_batch()
    yield h
    h.shutdown()


REQUESTS = [  # (prompt, speculation, stream)
    (f"{i} {PROMPT}", spec, i % 2 == 1)
    for i, spec in enumerate([None, {"drafter": "none"}, {"drafter": "ngram", "controller": "fixed", "k": 3},
                              {"controller": "goodput"}, None, {"drafter": "ngram"}, {"controller": "fixed", "k": 2},
                              {"drafter": "none"}])
]


async def _ask(http: httpx.AsyncClient, prompt: str, spec: dict | None, stream: bool, max_tokens: int = 12,
               **extra) -> tuple[int, str]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, **extra}
    if spec is not None:
        body["speculation"] = spec
    if not stream:
        r = await http.post("/v1/completions", json=body)
        return r.status_code, (r.json()["choices"][0]["text"] if r.status_code == 200 else r.text)
    text = ""
    async with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                obj = json.loads(line[6:])
                if "error" in obj:
                    return 500, json.dumps(obj)
                text += obj["choices"][0]["text"]
    return r.status_code, text


def _all(url: str, requests) -> list[tuple[int, str]]:
    async def run():
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=32)) as http:
            return await asyncio.gather(*(_ask(http, *r) for r in requests))

    return asyncio.run(run())


def test_batched_answers_equal_unbatched_answers_and_metrics_count_the_batch(single, batched):
    with live(single, max_queue=64) as srv:
        want = _all(srv.url, REQUESTS)
    with live(batched, max_queue=64) as srv:
        before = scrape(srv.url)
        got = _all(srv.url, REQUESTS)
        after = scrape(srv.url)
        assert health(srv.url)["max_batch"] == 4
        wait_until(lambda: health(srv.url)["running"] == 0, what="every row to leave")
    assert all(code == 200 for code, _ in want) and got == want

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    sizes = {int(dict(lab)["batch_size"]) for (n, lab), v in after.items()
             if n == "adaspec:batch_steps_total" and v > value(before, n, **dict(lab))}
    assert max(sizes) >= 2 and sizes <= {1, 2, 3, 4}  # rows really decoded together, never more than 4
    emitted = sum(delta("adaspec:batch_generation_tokens_total", batch_size=b) for b in sizes)
    assert emitted == delta("adaspec:generation_tokens_total") == 8 * 12
    assert delta("adaspec:iteration_tokens_total_count") == sum(
        delta("adaspec:batch_steps_total", batch_size=b) for b in sizes)
    drafted = sum(delta("adaspec:batch_draft_tokens_total", batch_size=b) for b in sizes)
    assert drafted == sum(delta("adaspec:spec_decode_num_draft_tokens_total", drafter=d)
                          for d in {dict(lab).get("drafter") for (n, lab) in after if "drafter" in dict(lab)}) > 0
    assert delta("adaspec:requests_total", outcome="length") == 8


def test_disconnect_frees_one_row_and_the_others_finish(single, batched):
    with live(single) as srv:
        want = _all(srv.url, [(PROMPT, None, False, 24)])[0]
    with live(batched) as srv:
        before = scrape(srv.url)
        long = {"prompt": PROMPT, "max_tokens": 1800, "ignore_eos": True, "temperature": 0, "stream": True}

        async def run():
            async with httpx.AsyncClient(base_url=srv.url, timeout=120) as http:
                async def leaver():
                    async with http.stream("POST", "/v1/completions", json=long) as r:
                        seen = 0
                        async for line in r.aiter_lines():
                            seen += line.startswith("data: ")
                            if seen >= 3:
                                return  # closes the connection mid-stream
                stayer = asyncio.ensure_future(_ask(http, PROMPT, None, False, 24))
                await asyncio.sleep(0.2)
                # bad requests while the batch runs: answered 400 before they reach it
                bad = await http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": -1})
                huge = await http.post("/v1/completions", json={"prompt": "word " * 3000, "max_tokens": 4})
                await leaver()
                return await stayer, bad, huge

        got, bad, huge = asyncio.run(run())
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
        assert huge.status_code == 400 and huge.json()["error"]["code"] == "context_length_exceeded"
        wait_until(lambda: health(srv.url)["running"] == 0, what="the rows to be freed")
        after = scrape(srv.url)
    assert got == want
    assert value(after, "adaspec:requests_total", outcome="cancelled") - value(
        before, "adaspec:requests_total", outcome="cancelled") == 1


class _Exploding(NgramDrafter):
    """Raises on its third proposal (a bug in one request's drafter)."""

    name = "boom"

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def for_sequence(self, seq: int) -> _Exploding:
        return _Exploding()

    def propose(self, *args, **kwargs):
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("drafter exploded")
        return super().propose(*args, **kwargs)


def test_a_failing_row_fails_only_its_request(single, batched):
    batched._model_drafters["boom"] = _Exploding()
    try:
        reqs = [(f"{i} {PROMPT}", {"drafter": "ngram", "controller": "fixed", "k": 3}, False, 16) for i in range(3)]
        with live(single) as srv:
            want = _all(srv.url, reqs)
        with live(batched) as srv:
            got = _all(srv.url, [reqs[0], (reqs[1][0], {"drafter": "boom", "controller": "fixed", "k": 3}, False, 16),
                                 reqs[2], (reqs[1][0], {"drafter": "boom", "controller": "fixed", "k": 3}, True, 16)])
            snap = scrape(srv.url)
            wait_until(lambda: health(srv.url)["running"] == 0, what="the rows to be freed")
    finally:
        del batched._model_drafters["boom"]
    assert [got[0], got[2]] == [want[0], want[2]]
    assert got[1][0] == 500 and "RuntimeError" in got[1][1]
    assert got[3][0] == 500 and "server_error" in got[3][1]  # the streamed error event
    assert value(snap, "adaspec:requests_total", outcome="error") >= 2


async def _holding(url: str, n: int, check) -> None:
    """Open ``n`` long streamed requests, wait until the server runs 4 of them (the rest queued), run ``check()``
    while they hold their places, then disconnect them."""
    long = {"max_tokens": 2000, "ignore_eos": True, "temperature": 0, "stream": True,
            "speculation": {"drafter": "none"}}
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        async def hold(i: int, stop: asyncio.Event) -> None:
            async with http.stream("POST", "/v1/completions", json={**long, "prompt": f"{i} {PROMPT}"}) as r:
                assert r.status_code == 200
                await stop.wait()

        stop = asyncio.Event()
        tasks = [asyncio.ensure_future(hold(i, stop)) for i in range(n)]
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            h = (await http.get("/health")).json()
            if h["running"] == 4 and h["waiting"] == n - 4:
                break
            assert asyncio.get_running_loop().time() < deadline, f"the long requests did not take their places: {h}"
            await asyncio.sleep(0.02)
        await check(http)
        stop.set()
        await asyncio.gather(*tasks)


def test_batched_queue_overflow_answers_503_and_strict_mismatch_400(batched):
    """Places are held by long streams (deterministic, whatever the machine's speed): 4 running + the queue."""
    async def full(http) -> None:
        responses = await asyncio.gather(*(http.post("/v1/completions", json={
            "prompt": f"x{i} {PROMPT}", "max_tokens": 4, "speculation": {"drafter": "none"}}) for i in range(3)))
        codes = [r.status_code for r in responses]
        assert codes == [503, 503, 503], codes
        assert all(int(r.headers["retry-after"]) >= 1 for r in responses)
        assert all(r.json()["error"]["code"] == "queue_full" for r in responses)

    with live(batched, max_queue=1) as srv:
        asyncio.run(_holding(srv.url, 5, full))
        wait_until(lambda: health(srv.url)["running"] == 0, what="the held places to be freed")
        got = _all(srv.url, [(f"{i} {PROMPT}", {"drafter": "none"}, False, 8) for i in range(5)])
        assert [c for c, _ in got] == [200] * 5  # the freed places serve again
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, "strict": True},
                       timeout=60)
        assert r.status_code == 400 and "strict" in r.json()["error"]["message"]
        assert health(srv.url)["running"] == 0
    with live(batched, max_queue=0) as srv:
        async def two_busy(http) -> None:
            responses = await asyncio.gather(*(http.post("/v1/completions", json={
                "prompt": f"y{i} {PROMPT}", "max_tokens": 4}) for i in range(2)))
            busy = [r for r in responses if r.status_code == 503]
            assert len(busy) == 2 and all(int(r.headers["retry-after"]) >= 1 for r in busy)
            assert all(r.json()["error"]["code"] == "queue_full" for r in busy)

        asyncio.run(_holding(srv.url, 4, two_busy))


def test_loadtest_against_the_batched_server(batched):
    import time

    from adaspec.server.loadtest import markdown, run_config

    with live(batched, max_queue=16) as srv:
        model = httpx.get(srv.url + "/v1/models", timeout=10).json()["data"][0]["id"]
        runs = []
        for mode, spec in (("ngram", {"drafter": "ngram", "controller": "goodput"}), ("plain", {"drafter": "none"})):
            r = run_config(srv.url, model, concurrency=4, requests=6, max_tokens=8, speculation=spec, api_key=None,
                           deadline=time.monotonic() + 120, timeout=60)
            runs.append({**r, "mode": mode})
    for r in runs:
        assert r["ok"] == 6 and r["errors"] == {}
        assert all(rec["tokens"] >= 1 and 0 < rec["ttft_s"] <= rec["latency_s"] for rec in r["records"])
        assert r["ttft_p50_s"] is not None and r["tokens_per_s"] > 0
    assert runs[0]["mean_alpha"] is not None and runs[1]["mean_alpha"] is None
    table = markdown({"model": "m", "speculation_default": {}, "max_tokens": 8, "machine": "x", "runs": runs})
    assert "| ngram | 4 | 0 | 6 | 6 |" in table and "| plain | 4 | 0 | 6 | 6 |" in table


def test_n_choices_and_logprobs_through_the_batch(single, batched):
    # sampling: which random numbers a token uses depends on K, and the batch caps K by measured timings, so the
    # choices sample without speculation here (greedy speculative rows are compared in the first test)
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 1.0, "seed": 5, "n": 3, "logprobs": 1,
            "ignore_eos": True, "speculation": {"drafter": "none"}}
    with live(single) as srv:
        want = httpx.post(srv.url + "/v1/completions", json=body, timeout=60).json()
    with live(batched) as srv:
        got = httpx.post(srv.url + "/v1/completions", json=body, timeout=60).json()
        wait_until(lambda: health(srv.url)["running"] == 0, what="the rows to be freed")
    assert [c["text"] for c in got["choices"]] == [c["text"] for c in want["choices"]]
    for a, b in zip(got["choices"], want["choices"]):
        assert a["logprobs"]["token_logprobs"] == pytest.approx(b["logprobs"]["token_logprobs"], abs=1e-4)


@pytest.mark.parametrize("max_batch", [1, 3])
def test_every_forward_runs_on_the_one_generation_thread(tiny, max_batch):
    """adaspec serve's start-up warm-up and calibration and every request's forwards run on the host's generation
    thread: a GGUF runtime's OpenMP gives each thread that starts a forward its own team, and two teams on a small
    machine make libgomp sleep between the steps of every forward (ModelHost.on_generation_thread)."""
    host = ModelHost.load(tiny, tiny, controller="fixed", k=3, dtype="float32", threads=1, progress=False,
                          max_batch=max_batch)
    threads: set[str] = set()
    backends = {host.target.backend} | {d.backend for d in host._model_drafters.values()}
    calls = {"forward": 0, "forward_batch": 0}
    for backend in backends:
        for method in ("forward", "forward_batch", "forward_tree"):
            real = getattr(backend, method, None)
            if real is None:
                continue

            def recorded(*args, _real=real, _method=method, **kw):
                threads.add(threading.current_thread().name)
                calls[_method] = calls.get(_method, 0) + 1
                return _real(*args, **kw)

            setattr(backend, method, recorded)
    try:
        host.on_generation_thread(host.warmup, 2)
        if max_batch > 1:
            host.on_generation_thread(host.calibrate_batch)
        with live(host, max_queue=8) as srv:
            got = _all(srv.url, REQUESTS[:3])
        assert all(code == 200 for code, _ in got)
        if max_batch > 1:
            with pytest.raises(RuntimeError, match="batch loop holds the generation thread"):
                host.on_generation_thread(host.warmup, 2)  # would wait forever behind the loop
    finally:
        host.shutdown()
    assert calls["forward"] > 0 and (max_batch == 1 or calls["forward_batch"] > 0), calls  # batched rows: batch calls
    assert len(threads) == 1 and next(iter(threads)).startswith("adaspec-generate"), threads


def test_a_batched_host_never_shut_down_lets_the_process_exit(tiny):
    """The generation thread is a daemon: a program that starts a batched server's loop and never calls
    host.shutdown() still exits (a ThreadPoolExecutor worker would be joined at exit, forever)."""
    import subprocess
    import sys

    code = ("import sys; from adaspec.server.runtime import ModelHost; from adaspec.server.app import create_app\n"
            f"h = ModelHost.load({tiny!r}, 'ngram', controller='fixed', k=2, dtype='float32', threads=1, "
            "progress=False, max_batch=2)\n"
            "create_app(h)\n"  # starts the batch loop on the generation thread
            "assert h.runner is not None\n"
            "print('started', flush=True)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "started" in out.stdout, out.stderr[-2000:]


def test_serve_warms_up_on_the_generation_thread(tiny, monkeypatch):
    """`adaspec serve` itself (uvicorn stubbed out) runs its warm-up and batch calibration on the generation thread."""
    import uvicorn

    from adaspec.cli import build_parser

    seen: list[tuple[str, str]] = []
    for name in ("warmup", "calibrate_batch"):
        real = getattr(ModelHost, name)

        def spy(self, *a, _real=real, _name=name, **kw):
            seen.append((_name, threading.current_thread().name))
            return _real(self, *a, **kw)

        monkeypatch.setattr(ModelHost, name, spy)
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: None)
    args = build_parser().parse_args(["serve", "--target", tiny, "--draft", "ngram", "--backend", "torch",
                                      "--dtype", "float32", "--threads", "1", "--max-batch", "2"])
    assert args.func(args) == 0
    assert [n for n, _ in seen] == ["warmup", "calibrate_batch"]
    assert all(t.startswith("adaspec-generate") for _, t in seen), seen
