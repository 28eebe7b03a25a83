"""Fault suite (issue 41): a LIVE ``adaspec serve`` subprocess on the zoo's small test model (smollm2-135m-instruct,
llama.cpp runtime, ``--max-batch 2 --max-queue 2``, an API key) driven as a hostile client would.

Each case checks that every answer has a clear status (never a 500), and afterwards that the server is healthy,
every slot is free (``running == 0`` and ``waiting == 0`` on ``/health`` and ``/metrics``) and a canary greedy
request returns the text it returned at the start. Marked slow (it needs the zoo model); it runs in about a
minute on 2 cores. Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import httpx  # noqa: E402

pytestmark = pytest.mark.slow

KEY = "fault-suite-key"
AUTH = {"authorization": f"Bearer {KEY}"}
MODEL = "smollm2-135m-instruct"
CANARY = {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0,
          "speculation": {"drafter": "none"}}
MAX_SCORED = 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    def __init__(self, url: str, proc: subprocess.Popen, log: Path) -> None:
        self.url, self.proc, self.log = url, proc, log
        self.canary_text: str | None = None

    def post(self, path: str = "/v1/completions", body=None, *, raw: bytes | None = None, headers=None,
             timeout: float = 60) -> httpx.Response:
        h = {**AUTH, **(headers or {})}
        if raw is not None:
            return httpx.post(self.url + path, content=raw, headers={"content-type": "application/json", **h},
                              timeout=timeout)
        return httpx.post(self.url + path, json=body, headers=h, timeout=timeout)

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=10).json()

    def gauges(self) -> tuple[float, float]:
        text = httpx.get(self.url + "/metrics", headers=AUTH, timeout=10).text
        got = {}
        for line in text.splitlines():
            for name in ("running", "waiting"):
                if line.startswith(f"adaspec:num_requests_{name}{{"):
                    got[name] = float(line.rsplit(" ", 1)[1])
        return got["running"], got["waiting"]

    def iteration_buckets(self) -> dict[str, float]:
        """Cumulative counts of the tokens-per-forward histogram, by upper bound."""
        text = httpx.get(self.url + "/metrics", headers=AUTH, timeout=10).text
        out = {}
        for line in text.splitlines():
            if line.startswith("adaspec:iteration_tokens_total_bucket{"):
                le = line.split('le="', 1)[1].split('"', 1)[0]
                out[le] = float(line.rsplit(" ", 1)[1])
        return out

    def canary(self) -> str:
        r = self.post(body=CANARY)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    def check_clean(self) -> None:
        """Healthy, every slot free, the canary's text unchanged."""
        assert self.proc.poll() is None, "the server died:\n" + self.log.read_text()[-3000:]
        deadline = time.monotonic() + 30
        while True:
            h = self.health()
            if h["status"] == "ok" and h["running"] == 0 and h["waiting"] == 0 and self.gauges() == (0, 0):
                break
            assert time.monotonic() < deadline, f"slots still held: {h}"
            time.sleep(0.05)
        assert self.canary() == self.canary_text
        assert "Traceback" not in self.log.read_text(), self.log.read_text()[-3000:]


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Served:
    port = _free_port()
    log = tmp_path_factory.mktemp("faults") / "serve.log"
    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("ADASPEC_API_KEY", None)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "adaspec", "serve", "--target", MODEL, "--backend", "llamacpp",
                                 "--draft", "ngram", "--threads", "1", "--port", str(port), "--api-key", KEY,
                                 "--max-batch", "2", "--max-queue", "2", "--no-warmup", "--prefill-chunk", "32",
                                 "--max-scored-tokens", str(MAX_SCORED), "--request-timeout", "120",
                                 "--default-max-tokens", "4", "--max-tokens-limit", "256",
                                 "--log-level", "warning"], stdout=out, stderr=subprocess.STDOUT, env=env)
    srv = Served(f"http://127.0.0.1:{port}", proc, log)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, "adaspec serve exited:\n" + log.read_text()[-3000:]
            try:
                if srv.health()["status"] == "ok":
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "adaspec serve did not start:\n" + log.read_text()[-3000:]
            time.sleep(0.2)
        srv.canary_text = srv.canary()
        assert srv.canary_text
        yield srv
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _no_500(responses) -> None:
    for r in responses:
        assert r.status_code < 500 or (r.status_code == 503 and r.json()["error"]["code"] == "queue_full"), r.text
        if r.status_code >= 400:
            err = r.json()["error"]
            assert err["message"] and err["type"], r.text


# --------------------------------------------------------------------------------------------------------------


def test_the_typed_name_and_the_runtime_name_are_served(served):
    for name in (MODEL, f"{MODEL}@llamacpp"):
        r = served.post(body={**CANARY, "model": name})
        assert r.status_code == 200 and r.json()["model"] == MODEL
    assert httpx.get(served.url + "/v1/models", headers=AUTH, timeout=10).json()["data"][0]["id"] == MODEL
    served.check_clean()


def test_auth_and_host_on_every_route(served):
    routes = [("GET", "/v1/models"), ("GET", f"/v1/models/{MODEL}"), ("GET", "/metrics"),
              ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/openapi.json"),
              ("GET", "/docs"), ("GET", "/nope"), ("DELETE", "/v1/models")]
    for method, path in routes:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": KEY}):
            r = httpx.request(method, served.url + path, headers=headers, json=CANARY, timeout=10)
            assert r.status_code == 401, (method, path, headers, r.status_code)
        r = httpx.request(method, served.url + path, headers={**AUTH, "host": "rebound.example"}, json=CANARY,
                          timeout=10)
        assert r.status_code == 403, (method, path)
    assert httpx.get(served.url + "/health", headers={"origin": "http://rebound.example"}, timeout=10).status_code \
        == 403
    assert httpx.get(served.url + "/health", timeout=10).status_code == 200
    served.check_clean()


def test_a_burst_beyond_batch_and_queue(served):
    async def run():
        async with httpx.AsyncClient(base_url=served.url, headers=AUTH, timeout=120) as http:
            bodies = [{"prompt": f"{i} burst", "max_tokens": 3, "stream": i % 2 == 1} for i in range(10)]
            return await asyncio.gather(*(http.post("/v1/completions", json=b) for b in bodies))

    responses = asyncio.run(run())
    _no_500(responses)
    codes = [r.status_code for r in responses]
    assert codes.count(200) >= 2 and codes.count(503) >= 1, codes  # 2 running + 2 waiting; the rest refused
    served.check_clean()


def test_disconnects_mid_stream_under_batching(served):
    async def run():
        async with httpx.AsyncClient(base_url=served.url, headers=AUTH, timeout=120) as http:
            async def dropped(i: int) -> None:
                async with http.stream("POST", "/v1/completions", json={
                        "prompt": f"{i} Count:", "max_tokens": 200, "ignore_eos": True, "stream": True}) as r:
                    assert r.status_code == 200
                    seen = 0
                    async for line in r.aiter_lines():
                        seen += line.startswith("data: {")
                        if seen >= 2:
                            return  # leaves mid-stream

            async def kept() -> str:
                r = await http.post("/v1/completions", json={"prompt": "Kept:", "max_tokens": 8, "temperature": 0})
                assert r.status_code == 200, r.text
                return r.json()["choices"][0]["finish_reason"]

            results = await asyncio.gather(dropped(0), kept(), dropped(1))
            assert results[1] == "length"

    asyncio.run(run())
    # a non-streaming client that gives up while its long prompt is being prefilled
    with pytest.raises(httpx.ReadTimeout):
        served.post(body={"prompt": "word " * 600, "max_tokens": 4}, timeout=0.5)
    served.check_clean()


def test_malformed_and_fuzzed_bodies(served):
    raw = [b"", b"{", b"[]", b"null", b"42", b'"x"', b"{}", b'{"prompt": }', b"\xff\xfe\x00", b"[" * 50000 + b"]" * 50000,
           b'{"prompt": "a", "max_tokens": NaN}', b'{"prompt": "a", "temperature": Infinity}',
           b'{"prompt": {"$ref": "x"}}', b'{"prompt": "a", "prompt": [1, 2]}', b'{"prompt": [[[[1]]]]}',
           b'{"messages": "hi"}', b'{"prompt": "a\\u0000b", "max_tokens": 2}']
    responses = [served.post(raw=body) for body in raw]
    responses += [served.post("/v1/chat/completions", raw=body) for body in raw]
    rng = random.Random(41)
    base = {"prompt": "fuzz", "max_tokens": 2, "temperature": 0.5, "stop": ["x"], "logprobs": 1, "n": 1}
    values = [None, True, -1, 0, 1, 2 ** 63, -2 ** 63, 1e308, -1e-308, "", "x" * 300, [], {}, [1, "a"], {"a": 1},
              "\u202e", "../../etc/passwd"]
    for _ in range(40):
        body = dict(base)
        for _ in range(rng.randint(1, 3)):
            body[rng.choice(list(base) + ["echo", "seed", "top_p", "top_k", "logit_bias", "speculation", "user",
                                          "stream", "min_p", "best_of", "suffix"])] = rng.choice(values)
        responses.append(served.post(body=body))
    _no_500(responses)
    assert all(r.status_code in (200, 400, 413, 422) for r in responses), [r.status_code for r in responses]
    served.check_clean()


def test_extreme_numbers_and_lone_surrogates(served):
    bodies = [{"prompt": "a", "max_tokens": 2 ** 31}, {"prompt": "a", "max_tokens": -1}, {"prompt": "a", "n": 0},
              {"prompt": "a", "n": 10 ** 18}, {"prompt": "a", "seed": 2 ** 64}, {"prompt": "a", "seed": -2 ** 64},
              {"prompt": "a", "temperature": 1e308}, {"prompt": "a", "top_k": 2 ** 40}, {"prompt": "a", "top_p": 0},
              {"prompt": "a", "logprobs": 10 ** 9}, {"prompt": [2 ** 40], "max_tokens": 1},
              {"prompt": "a", "max_tokens": 1, "seed": 2 ** 64 - 1, "temperature": 2, "top_k": -1},
              {"prompt": "a", "repetition_penalty": 1e-300}, {"prompt": "a", "presence_penalty": -2.0000001}]
    responses = [served.post(body=b) for b in bodies]
    for path, raw in (("/v1/completions", b'{"prompt": "a\\ud800", "max_tokens": 2}'),
                      ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\udfff"}]}'),
                      ("/v1/completions", b'{"prompt": "a", "stop": ["\\ud800"]}')):
        r = served.post(path, raw=raw)
        assert r.status_code == 400 and r.json()["error"]["param"] in ("prompt", "messages", "stop"), r.text
    _no_500(responses)
    assert [r.status_code for r in responses][:11] == [400] * 11
    served.check_clean()


def test_path_like_model_and_drafter_names(served):
    names = ["../../etc/passwd", "/etc/passwd", "~/.ssh/id_rsa", "hf:org/model", "C:\\x.gguf", "x.gguf",
             f"{MODEL}@torch", "file:///etc/passwd", "%2e%2e%2f", "a" * 256]
    responses = [served.post(body={**CANARY, "model": n}) for n in names]
    assert all(r.status_code in (400, 404) for r in responses), [r.status_code for r in responses]
    drafters = names + ["layerskip:1", "layerskip:99999999999999999999", "ngram+../x", "hybrid", "A+B"]
    more = [served.post(body={**CANARY, "speculation": {"drafter": d}}) for d in drafters]
    assert all(r.status_code == 400 and r.json()["error"]["param"] in ("speculation", "speculation.drafter")
               for r in more), [(r.status_code, r.text[:100]) for r in more]
    r = httpx.get(served.url + "/v1/models/..%2f..%2fetc%2fpasswd", headers=AUTH, timeout=10)
    assert r.status_code == 404
    _no_500(responses + more)
    served.check_clean()


def test_oversized_lists_and_n_logprobs_extremes(served):
    bodies = [{"prompt": "a", "logit_bias": {str(i): 1 for i in range(1025)}},
              {"prompt": "a", "stop": ["s"] * 17}, {"prompt": "a", "stop": "x" * 257},
              {"prompt": "a", "n": 9}, {"prompt": "a", "n": 8},  # 8 > 2 running + 2 waiting places
              {"prompt": "a", "logprobs": 21}]
    responses = [served.post(body=b) for b in bodies]
    assert [r.status_code for r in responses] == [400] * 6, [r.text[:120] for r in responses]
    ok = served.post(body={"prompt": "a b c", "max_tokens": 3, "n": 3, "logprobs": 20, "echo": True,
                           "logit_bias": {str(i): -100 for i in range(1024)}, "stop": ["zz"] * 16})
    assert ok.status_code == 200, ok.text
    choices = ok.json()["choices"]
    assert len(choices) == 3 and all(len(c["logprobs"]["top_logprobs"][-1]) >= 1 for c in choices)
    assert len({json.dumps(c["logprobs"]["token_logprobs"][:3]) for c in choices}) == 1  # one scoring, shared
    full = served.post(body={"prompt": "a", "max_tokens": 2, "n": 4})  # 4 places: 1 running (cap), 3 > queue 2
    assert full.status_code == 503 and full.json()["error"]["code"] == "queue_full"
    served.check_clean()


def test_long_prompt_prefill_during_other_streams(served):
    async def run():
        async with httpx.AsyncClient(base_url=served.url, headers=AUTH, timeout=120) as http:
            async def stream() -> tuple[int, str | None]:
                chunks, finish = 0, None
                async with http.stream("POST", "/v1/completions", json={
                        "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "stream": True}) as r:
                    assert r.status_code == 200
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            obj = json.loads(line[6:])
                            chunks += 1
                            finish = obj["choices"][0]["finish_reason"] or finish
                return chunks, finish

            async def long() -> int:
                await asyncio.sleep(0.2)
                r = await http.post("/v1/completions", json={"prompt": "lorem ipsum " * 150, "max_tokens": 2})
                assert r.status_code == 200, r.text
                return r.json()["usage"]["prompt_tokens"]

            return await asyncio.gather(stream(), long())

    before = served.iteration_buckets()
    (chunks, finish), prompt_tokens = asyncio.run(run())
    assert finish in ("length", "stop") and chunks >= 2 and prompt_tokens > 500
    after = served.iteration_buckets()
    steps = after["+Inf"] - before["+Inf"]
    # chunked prefill: no forward held more than 4 chunks of 32 tokens (the whole prompt would be one forward)
    assert steps >= prompt_tokens // 128 and after["128.0"] - before["128.0"] == steps
    served.check_clean()


def test_echo_scoring_limits(served):
    r = served.post(body={"prompt": "word " * (MAX_SCORED + 10), "max_tokens": 0, "echo": True, "logprobs": 5})
    assert r.status_code == 413 and r.json()["error"]["param"] == "echo"
    assert "--max-scored-tokens" in r.json()["error"]["message"]
    r = served.post(body={"prompt": "word " * 20, "max_tokens": 0, "echo": True, "logprobs": 5, "n": 2})
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == r.json()["usage"]["prompt_tokens"] and lp["token_logprobs"][0] is None
    with httpx.stream("POST", served.url + "/v1/completions", headers=AUTH, timeout=60, json={
            "prompt": "word " * 20, "max_tokens": 2, "echo": True, "logprobs": 1, "n": 2, "stream": True}) as s:
        first = {}
        for line in s.iter_lines():
            if line.startswith("data: {"):
                c = json.loads(line[6:])["choices"][0]
                if c["index"] not in first:  # a choice's first chunk: the echoed prompt and its scores
                    first[c["index"]] = c["logprobs"]["token_logprobs"]
    assert first[0] == first[1] and first[0][1:] == pytest.approx(lp["token_logprobs"][1:], abs=1e-4)
    served.check_clean()


SOAK_S = 20.0  # the CI version of docs/results/server/xeon-avx512-2c/2026-12-03-hardening's 30-minute soak
SOAK_BAD = [b'{"prompt": "a\\ud800", "max_tokens": 2}', b"{", b'{"prompt": "a", "n": 99}',
            b'{"prompt": [999999999]}', b'{"prompt": "a", "logit_bias": {"-1": 5}}',
            b'{"prompt": "a", "speculation": {"drafter": "../x"}}']


def test_a_short_soak_of_mixed_traffic(served):
    """Three clients for SOAK_S seconds (at most 60 requests each): greedy requests, streams dropped after two
    chunks, bad input, n = 2 (one prompt prefilled for both choices), echo scoring. Every answer is expected
    (200, 4xx for bad input, 503 queue_full), and the server ends clean."""
    unexpected: list[str] = []
    counts = {"ok": 0, "bad": 0, "busy": 0, "dropped": 0}

    async def client(seed: int) -> None:
        rng = random.Random(seed)
        deadline = time.monotonic() + SOAK_S
        async with httpx.AsyncClient(base_url=served.url, headers=AUTH, timeout=60) as http:
            for i in range(60):
                if time.monotonic() > deadline:
                    return
                kind = rng.choice(["greedy", "stream", "bad", "n2", "echo"])
                if kind == "stream":
                    async with http.stream("POST", "/v1/completions", json={
                            "prompt": f"{seed}.{i} Count:", "max_tokens": 64, "ignore_eos": True,
                            "stream": True}) as r:
                        if r.status_code == 503:
                            counts["busy"] += 1
                            continue
                        if r.status_code != 200:
                            unexpected.append(f"stream {r.status_code}")
                            continue
                        seen = 0
                        async for line in r.aiter_lines():
                            seen += line.startswith("data: {")
                            if seen >= 2:
                                break  # leaves mid-stream
                        counts["dropped"] += 1
                    continue
                if kind == "bad":
                    r = await http.post("/v1/completions", content=rng.choice(SOAK_BAD),
                                        headers={"content-type": "application/json"})
                    if 400 <= r.status_code < 500 or r.status_code == 503:
                        counts["bad" if r.status_code != 503 else "busy"] += 1
                    else:
                        unexpected.append(f"bad input answered {r.status_code}: {r.text[:200]}")
                    continue
                body = {"greedy": {"prompt": f"Say {i}:", "max_tokens": 8, "temperature": 0},
                        "n2": {"prompt": "A list of fruits: " * 8, "max_tokens": 6, "n": 2, "seed": i},
                        "echo": {"prompt": "word " * 30, "max_tokens": 0, "echo": True, "logprobs": 2, "n": 2},
                        }[kind]
                r = await http.post("/v1/completions", json=body)
                if r.status_code == 200:
                    counts["ok"] += 1
                elif r.status_code == 503 and r.json()["error"]["code"] == "queue_full":
                    counts["busy"] += 1
                else:
                    unexpected.append(f"{kind} answered {r.status_code}: {r.text[:200]}")

    async def run() -> None:
        await asyncio.gather(*(client(s) for s in range(3)))

    asyncio.run(run())
    assert not unexpected, unexpected
    assert counts["ok"] >= 5 and counts["bad"] >= 1, counts
    served.check_clean()
