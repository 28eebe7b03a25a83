"""Tests of ``adaspec serve`` against live servers on loopback (uvicorn in a thread, a pre-bound 127.0.0.1 socket).

The fast tests use a tiny random-weight Llama built in-process (byte-level BPE tokenizer trained on a few lines, a
ChatML chat template), saved to a temporary folder and loaded through the same code path as a real model; it is
its own draft model, so speculation is accepted and the spec-decode counters move. ``@pytest.mark.slow`` tests use
``smollm2-135m-instruct`` from the zoo. Nothing is downloaded; all traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

import httpx  # noqa: E402
import openai  # noqa: E402
import torch  # noqa: E402
import uvicorn  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from adaspec.cli import main as cli_main  # noqa: E402
from adaspec.server.app import ServerConfig, create_app  # noqa: E402
from adaspec.server.runtime import ModelHost, QueueFull, Scheduler, compress_trace  # noqa: E402

CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CONTEXT = 2048
PROMPT = "Write a Python function that reverses a string."


# --------------------------------------------------------------------------------------------------------------
# Fixtures: a tiny model folder, hosts, live servers
# --------------------------------------------------------------------------------------------------------------


def build_tiny_model(folder: Path) -> Path:
    """A 2-layer random Llama (hidden 64) with a trained byte-level BPE tokenizer and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
              "The quick brown fox jumps over the lazy dog. Hello world, héllo wörld ✓ 你好",
              "Write a Python function that reverses a string. user assistant system"] * 20
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|endoftext|>",
                                 pad_token="<|endoftext|>")
    hf.chat_template = CHATML
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(hf), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT,
                      eos_token_id=hf.eos_token_id, bos_token_id=hf.bos_token_id, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # decisive argmaxes (a random model's logits are near-uniform)
    model.save_pretrained(folder)
    hf.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-llama")))


def make_host(tiny: str, *, draft: str | None = None, controller: str = "fixed", k: int | None = 4) -> ModelHost:
    host = ModelHost.load(tiny, draft or tiny, controller=controller, k=k, dtype="float32", threads=1,
                          progress=False)
    host.warmup(steps=2)
    return host


class LiveServer:
    """uvicorn serving ``app`` on a pre-bound 127.0.0.1 socket, in a daemon thread."""

    def __init__(self, app) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            assert self.thread.is_alive(), "server thread died"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=kw.pop("api_key", "unused"), max_retries=0,
                             timeout=kw.pop("timeout", 60), **kw)


@contextmanager
def live(host: ModelHost, **config) -> Iterator[LiveServer]:
    with LiveServer(create_app(host, ServerConfig(**config))) as srv:
        yield srv


@pytest.fixture(scope="module")
def host(tiny) -> ModelHost:
    h = make_host(tiny)
    yield h
    h.shutdown()


@pytest.fixture(scope="module")
def server(host) -> Iterator[LiveServer]:
    with live(host, max_queue=64) as srv:
        yield srv


def scrape(url: str, **headers) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url + "/metrics", headers=headers, timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(snap: dict, name: str, **labels) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels``."""
    want = {k: str(v) for k, v in labels.items()}
    return sum(v for (n, lab), v in snap.items() if n == name and want.items() <= dict(lab).items())


def wait_until(cond, timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def health(url: str) -> dict:
    return httpx.get(url + "/health", timeout=10).json()


# --------------------------------------------------------------------------------------------------------------
# OpenAI client: stream == non-stream == adaspec generate
# --------------------------------------------------------------------------------------------------------------


def _cli_text(capsys, target: str, draft: str, *extra: str, max_new_tokens: int, chat: bool = True) -> str:
    capsys.readouterr()
    args = ["generate", PROMPT, "--target", target, "--draft", draft, "--dtype", "float32", "--threads", "1",
            "--max-new-tokens", str(max_new_tokens), "--json", *extra]
    if not chat:
        args.append("--no-chat")
    assert cli_main(args) == 0
    return json.loads(capsys.readouterr().out)["text"]


def test_openai_client_stream_equals_nonstream_equals_generate(server, tiny, capsys):
    client = server.client()
    kw = dict(model=client.models.list().data[0].id, temperature=0, max_tokens=24)
    chat = client.chat.completions.create(messages=[{"role": "user", "content": PROMPT}], **kw)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        messages=[{"role": "user", "content": PROMPT}], stream=True, **kw) if c.choices)
    assert chat.choices[0].message.content == streamed
    assert chat.usage.completion_tokens >= 1
    assert chat.model_extra["speculation"]["draft_tokens"] > 0  # it did speculate
    assert streamed == _cli_text(capsys, tiny, tiny, "--controller", "fixed", "--k", "4", max_new_tokens=24)

    comp = client.completions.create(prompt=PROMPT, **kw)
    streamed = "".join(c.choices[0].text for c in client.completions.create(prompt=PROMPT, stream=True, **kw))
    assert comp.choices[0].text == streamed
    assert streamed == _cli_text(capsys, tiny, tiny, "--controller", "fixed", "--k", "4", max_new_tokens=24,
                                 chat=False)

    # Plain decoding per request gives the same greedy text (lossless), and the usage chunk comes when asked for.
    chunks = list(client.chat.completions.create(
        messages=[{"role": "user", "content": PROMPT}], stream=True, stream_options={"include_usage": True},
        extra_body={"speculation": {"drafter": "none"}}, **kw))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat.choices[0].message.content
    assert chunks[-1].usage.total_tokens == chat.usage.total_tokens
    final = [c for c in chunks if c.choices and c.choices[0].finish_reason][0]
    assert final.model_extra["speculation"]["draft_tokens"] == 0


def test_prefix_cache_reports_cached_tokens_and_keeps_the_text(server):
    """With --max-batch 1 the target's cache outlives a request: a prompt that repeats the one before prefills only
    its last token, says so in OpenAI's usage.prompt_tokens_details.cached_tokens, and answers the same text."""
    client = server.client()
    kw = dict(model=client.models.list().data[0].id, temperature=0, max_tokens=12,
              extra_body={"speculation": {"drafter": "none"}})
    before = scrape(server.url)
    text = f"{PROMPT} (asked once in this module)"  # no earlier test's stored copy holds it
    other = client.chat.completions.create(messages=[{"role": "user", "content": "Count to ten, please."}], **kw)
    first = client.chat.completions.create(messages=[{"role": "user", "content": text}], **kw)
    again = client.chat.completions.create(messages=[{"role": "user", "content": text}], **kw)
    shared = first.usage.prompt_tokens_details.cached_tokens  # the chat template's opening, shared with `other`
    assert 0 <= shared < first.usage.prompt_tokens - 1 and other.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    assert again.choices[0].message.content == first.choices[0].message.content
    after = scrape(server.url)
    answers = (other, first, again)

    def moved(name):
        return value(after, name) - value(before, name)

    assert moved("adaspec:prefix_cache_queries_total") == sum(r.usage.prompt_tokens for r in answers)
    assert moved("adaspec:prefix_cache_hits_total") == sum(r.usage.prompt_tokens_details.cached_tokens
                                                           for r in answers)


def test_interleaved_conversations_each_reuse_their_own_prompt(server):
    """Stored copies (--prefix-cache-mib, on by default): a conversation whose request follows another one's finds
    its own earlier sequence again, prefills only its last token and answers the same text."""
    client = server.client()
    kw = dict(model=client.models.list().data[0].id, temperature=0, max_tokens=8,
              extra_body={"speculation": {"drafter": "none"}})
    a = [{"role": "user", "content": "Name three colours of the rainbow, one per line."}]
    b = [{"role": "user", "content": "Spell the word banana backwards."}]
    first = client.chat.completions.create(messages=a, **kw)
    client.chat.completions.create(messages=b, **kw)
    again = client.chat.completions.create(messages=a, **kw)
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    assert again.choices[0].message.content == first.choices[0].message.content


def test_stop_seed_and_sampling_fields(server):
    client = server.client()
    base = client.completions.create(model=health(server.url)["model"], prompt=PROMPT, max_tokens=16, temperature=0)
    text = base.choices[0].text
    assert len(text) >= 4
    cut = text[2:4]
    stopped = client.completions.create(model=base.model, prompt=PROMPT, max_tokens=16, temperature=0, stop=[cut])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == text[:text.index(cut)]
    a, b = (client.completions.create(model=base.model, prompt=PROMPT, max_tokens=12, temperature=0.9, top_p=0.9,
                                      seed=7).choices[0].text for _ in range(2))
    assert a == b  # same seed, same sample


# --------------------------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [{"controller": "fixed", "k": 3}, {"drafter": "ngram", "controller": "fixed", "k": 2},
                                  {"drafter": "layerskip:1", "controller": "adaptive"}])
def test_metrics_move_by_exactly_the_request_counts(server, spec):
    before = scrape(server.url)
    r = httpx.post(server.url + "/v1/completions", timeout=60, json={
        "prompt": PROMPT * 2, "max_tokens": 40, "temperature": 0, "speculation": spec})
    assert r.status_code == 200, r.text
    body = r.json()
    s = body["speculation"]
    after = scrape(server.url)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("adaspec:spec_decode_num_drafts_total") == s["speculation_steps"]
    assert delta("adaspec:spec_decode_num_draft_tokens_total") == s["draft_tokens"]
    assert delta("adaspec:spec_decode_num_accepted_tokens_total") == s["accepted_tokens"]
    assert delta("adaspec:spec_decode_num_plain_steps_total") == s["plain_steps"]
    for pos, n in enumerate(s["accepted_per_position"]):
        assert delta("adaspec:spec_decode_num_accepted_tokens_per_pos_total", position=pos) == n
    assert delta("adaspec:spec_decode_num_accepted_tokens_per_pos_total") == s["accepted_tokens"]
    assert delta("adaspec:generation_tokens_total") == body["usage"]["completion_tokens"]
    assert delta("adaspec:prompt_tokens_total") == body["usage"]["prompt_tokens"]
    reason = body["choices"][0]["finish_reason"]
    assert delta("adaspec:request_success_total", finished_reason=reason) == 1
    assert delta("adaspec:requests_total", outcome=reason) == 1
    assert delta("adaspec:e2e_request_latency_seconds_count") == 1
    assert delta("adaspec:time_to_first_token_seconds_count") == 1
    assert delta("adaspec:request_queue_time_seconds_count") == 1
    if s["accepted_tokens"]:
        assert s["acceptance_rate"] == pytest.approx(s["accepted_tokens"] / s["draft_tokens"], abs=1e-4)
    assert value(after, "adaspec:spec_decode_k") >= 0
    assert value(after, "adaspec:spec_decode_active") in (0.0, 1.0)
    assert set(s["time_ms"]) == {"queue", "prefill", "draft", "verify", "other", "total"}
    assert s["speedup_estimate"] is not None and s["speedup_estimate"] > 0
    assert value(after, "adaspec:num_requests_running") == 0


def test_fallback_is_visible(server):
    """A drafter that is never right makes the adaptive controller switch speculation off: K gauge 0, active 0,
    and a fallback counted."""
    before = scrape(server.url)
    r = httpx.post(server.url + "/v1/completions", timeout=60, json={
        "prompt": "The quick brown fox", "max_tokens": 60, "temperature": 0, "ignore_eos": True,
        "speculation": {"drafter": "layerskip:1", "controller": "adaptive", "k": 2}}).json()
    s = r["speculation"]
    after = scrape(server.url)
    if s["k_trace"]["fallbacks"]:
        assert value(after, "adaspec:spec_decode_num_fallbacks_total") - value(
            before, "adaspec:spec_decode_num_fallbacks_total") == s["k_trace"]["fallbacks"]
        assert "0x" in s["k_trace"]["compressed"]
    else:  # the truncated draft agreed often enough to pay: speculation stayed on
        assert s["acceptance_rate"] >= 0.2
    assert value(after, "adaspec:spec_decode_active") == (1.0 if value(after, "adaspec:spec_decode_k") > 0 else 0.0)


# --------------------------------------------------------------------------------------------------------------
# Concurrency, queue overflow, disconnects, timeouts
# --------------------------------------------------------------------------------------------------------------


def test_16_clients_x_4_requests_all_answered(server):
    before = scrape(server.url)

    async def client(i: int, http: httpx.AsyncClient) -> list[str]:
        ids = []
        for j in range(4):
            body = {"prompt": f"{i} {j} {PROMPT}", "max_tokens": 4, "temperature": 0}
            if (i + j) % 2:
                async with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                    assert r.status_code == 200
                    lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
                assert lines[-1] == "data: [DONE]"
                ids.append(json.loads(lines[0][6:])["id"])
            else:
                r = await http.post("/v1/completions", json=body)
                assert r.status_code == 200, r.text
                ids.append(r.json()["id"])
        return ids

    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=120,
                                     limits=httpx.Limits(max_connections=32)) as http:
            return await asyncio.gather(*(client(i, http) for i in range(16)))

    ids = [x for batch in asyncio.run(run()) for x in batch]
    assert len(ids) == 64 and len(set(ids)) == 64
    after = scrape(server.url)
    answered = sum(value(after, "adaspec:requests_total", outcome=o)
                   - value(before, "adaspec:requests_total", outcome=o) for o in ("stop", "length"))
    assert answered == 64
    assert value(after, "adaspec:requests_total", outcome="rejected") == value(before, "adaspec:requests_total",
                                                                             outcome="rejected")
    assert health(server.url)["running"] == 0 and health(server.url)["waiting"] == 0


def test_queue_overflow_answers_503_with_retry_after(host):
    with live(host, max_queue=2) as srv:
        async def one(http):
            return await http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 80, "ignore_eos": True,
                                                            "temperature": 0, "speculation": {"drafter": "none"}})

        async def run():
            async with httpx.AsyncClient(base_url=srv.url, timeout=120) as http:
                return await asyncio.gather(*(one(http) for _ in range(8)))

        responses = asyncio.run(run())
        codes = sorted(r.status_code for r in responses)
        assert set(codes) <= {200, 503}, codes
        assert codes.count(200) >= 3 and codes.count(503) >= 1, codes
        for r in responses:
            if r.status_code == 503:
                assert int(r.headers["retry-after"]) >= 1
                assert r.json()["error"]["code"] == "queue_full"
        snap = scrape(srv.url)
        assert value(snap, "adaspec:requests_total", outcome="rejected") == codes.count(503)
        assert health(srv.url) == {**health(srv.url), "running": 0, "waiting": 0}


def test_scheduler_is_fifo_and_bounded():
    async def run():
        s = Scheduler(max_waiting=2)
        first = s.reserve()
        assert first.done()
        a, b = s.reserve(), s.reserve()
        with pytest.raises(QueueFull):
            s.reserve()
        s.abandon(a)  # a waiter leaves: its place frees
        c = s.reserve()
        s.release()
        assert b.done() and not c.done()
        s.release()
        assert c.done()
        s.release()
        assert not s.busy and s.waiting == 0

    asyncio.run(run())


LONG = {"prompt": PROMPT, "max_tokens": 1800, "ignore_eos": True, "temperature": 0,
        "speculation": {"drafter": "none"}}


def test_disconnect_mid_stream_frees_the_slot(server):
    before = scrape(server.url)
    http = httpx.Client(base_url=server.url, timeout=60)
    with http.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as r:
        assert r.status_code == 200
        seen, lines = 0, r.iter_lines()  # keep the iterator referenced: closing it closes the connection
        for line in lines:
            seen += line.startswith("data: ")
            if seen >= 3:
                break
        assert health(server.url)["running"] == 1
        # A second client queues behind it, then gives up (client-side timeout closes its connection).
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/v1/completions", json={**LONG, "max_tokens": 4}, timeout=0.5)
        wait_until(lambda: health(server.url)["waiting"] == 0, what="the queued client to leave the queue")
    http.close()  # mid-stream disconnect
    wait_until(lambda: health(server.url)["running"] == 0, what="the slot to be freed")
    after = scrape(server.url)
    assert value(after, "adaspec:requests_total", outcome="cancelled") - value(
        before, "adaspec:requests_total", outcome="cancelled") == 2
    assert value(after, "adaspec:generation_tokens_total") == value(before, "adaspec:generation_tokens_total")
    # The freed model answers the next request.
    r = httpx.post(server.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 3}, timeout=60)
    assert r.status_code == 200


def test_disconnect_non_streaming_cancels_generation(server):
    before = scrape(server.url)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=LONG, timeout=0.5)
    wait_until(lambda: health(server.url)["running"] == 0, what="the slot to be freed")
    after = scrape(server.url)
    assert value(after, "adaspec:requests_total", outcome="cancelled") - value(
        before, "adaspec:requests_total", outcome="cancelled") == 1


def test_request_timeout(host):
    with live(host, request_timeout=0.4) as srv:
        r = httpx.post(srv.url + "/v1/completions", json=LONG, timeout=60)
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
        with httpx.stream("POST", srv.url + "/v1/chat/completions", timeout=60, json={
                **{k: v for k, v in LONG.items() if k != "prompt"}, "stream": True,
                "messages": [{"role": "user", "content": "hi"}]}) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        assert json.loads(lines[-2][6:])["error"]["code"] == "timeout"
        assert value(scrape(srv.url), "adaspec:requests_total", outcome="timeout") == 2
        assert health(srv.url)["running"] == 0


# --------------------------------------------------------------------------------------------------------------
# Bad input, auth, body limit
# --------------------------------------------------------------------------------------------------------------

C, CC = "/v1/completions", "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]
BAD = [
    (C, b"{not json", 400, "not valid JSON"),
    (C, b"[1, 2]", 400, "valid dictionary"),
    (C, b"", 400, "needs a JSON object body"),
    (C, {"max_tokens": 4}, 400, "prompt: Field required"),
    (C, {"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    (C, {"prompt": "x", "max_tokens": 0}, 400, "only allowed with echo"),
    (C, {"prompt": "x", "max_tokens": 10**12}, 400, "max_tokens"),
    (C, {"prompt": "x", "max_tokens": CONTEXT + 1}, 400, "max_tokens"),
    (C, {"prompt": "x", "max_tokens": "many"}, 400, "max_tokens"),
    (C, {"prompt": "x", "temperature": "hot"}, 400, "temperature"),
    (C, {"prompt": "x", "temperature": -0.5}, 400, "temperature"),
    (C, {"prompt": "x", "top_p": 0}, 400, "top_p"),
    (C, {"prompt": "x", "stream": "yes please"}, 400, "stream"),
    (C, {"prompt": "x", "stop": [1, 2]}, 400, "stop"),
    (C, {"prompt": "x", "stop": ["a"] * 17}, 400, "stop"),
    (C, {"prompt": "x", "seed": 2**70}, 400, "seed"),
    (C, {"prompt": "x", "n": 9}, 400, "n=9 is out of range"),
    (C, {"prompt": "x", "logprobs": 21}, 400, "logprobs"),
    (C, {"prompt": "x", "frequency_penalty": 2.5}, 400, "frequency_penalty"),
    (C, {"prompt": "x", "presence_penalty": -2.1}, 400, "presence_penalty"),
    (C, {"prompt": "x", "repetition_penalty": 0}, 400, "repetition_penalty"),
    (C, {"prompt": "x", "min_p": 1.5}, 400, "min_p"),
    (C, {"prompt": "x", "logit_bias": {"5": 101}}, 400, "outside [-100, 100]"),
    (C, {"prompt": "x", "logit_bias": {"abc": 1}}, 400, "token ids"),
    (C, {"prompt": "x", "logit_bias": {"²": 1}}, 400, "token ids"),
    (C, {"prompt": "x", "logit_bias": {"999999": 1}}, 400, "out of range"),
    (C, {"prompt": "x", "max_tokens": 0, "echo": False}, 400, "echo"),
    (C, {"prompt": "x", "unknown_field": 1}, 400, "unknown_field"),
    (C, {"prompt": "x", "model": "gpt-4o"}, 404, "does not exist"),
    (C, {"prompt": "x", "model": 7}, 400, "model"),
    (C, {"prompt": ""}, 400, "empty"),
    (C, {"prompt": ["a", "b"]}, 400, "batched prompts"),
    (C, {"prompt": [10**9]}, 400, "out of range"),
    (C, {"prompt": [5] * CONTEXT}, 400, "context length"),
    (C, {"prompt": [5] * (CONTEXT - 10), "max_tokens": 20}, 400, "context length"),
    (C, {"prompt": "x", "speculation": {"drafter": "gpt2"}}, 400, "not available"),
    (C, {"prompt": "x", "speculation": {"drafter": "layerskip:99"}}, 400, "layerskip"),
    (C, {"prompt": "x", "speculation": {"controller": "magic"}}, 400, "controller"),
    (C, {"prompt": "x", "speculation": {"k": -1}}, 400, "speculation.k"),
    (C, {"prompt": "x", "speculation": {"K": 2}}, 400, "speculation.K"),
    (CC, {"messages": []}, 400, "messages"),
    (CC, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "role"),
    (CC, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
     "messages"),
    (CC, {"messages": [{"role": "user", "content": "word " * 3000}]}, 400, "context length"),
    (CC, {"messages": MSG, "n": 0}, 400, "n=0"),
    (CC, {"messages": MSG, "top_logprobs": 2}, 400, "needs logprobs"),
    (CC, {"messages": MSG, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    (CC, {"messages": MSG, "tools": [{"type": "function"}]}, 400, "tools[0]"),
    (CC, {"messages": MSG, "max_tokens": 5, "max_completion_tokens": 6}, 400, "disagree"),
    (CC, {"messages": MSG, "response_format": {"type": "yaml"}}, 400, "response_format"),
    (CC, {"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "objectx"}}}}, 400, "objectx"),
    (CC, {"messages": MSG, "tool_choice": "required"}, 400, "needs tools"),
    ("/v1/models/nope", None, 404, "does not exist"),
    ("/v1/nothing", {"x": 1}, 404, "no route"),
]


@pytest.mark.parametrize("path,body,status,needle", BAD, ids=[f"{i}" for i in range(len(BAD))])
def test_bad_input_answers_4xx_with_openai_error(server, path, body, status, needle):
    if body is None:
        r = httpx.get(server.url + path, timeout=30)
    elif isinstance(body, bytes):
        r = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"}, timeout=30)
    else:
        r = httpx.post(server.url + path, json=body, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert needle.lower() in err["message"].lower(), err["message"]


def test_bad_requests_never_hurt_the_server(server):
    assert httpx.post(server.url + C, content=b"\xff\xfe\x00garbage", timeout=30).status_code == 400
    assert httpx.post(server.url + C, json={"prompt": "x", "temperature": 1e-300, "max_tokens": 3},
                      timeout=30).status_code == 200  # treated as greedy, no NaN
    assert httpx.get(server.url + C, timeout=30).status_code == 405
    assert health(server.url)["status"] == "ok"


def test_body_size_limit(host):
    with live(host, max_body_bytes=2000) as srv:
        r = httpx.post(srv.url + C, json={"prompt": "x" * 5000}, timeout=30)
        assert r.status_code == 413 and "limit of 2000 bytes" in r.json()["error"]["message"]

        def chunked():  # no Content-Length: counted as it arrives
            for _ in range(10):
                yield b" " * 500

        r = httpx.post(srv.url + C, content=chunked(), headers={"content-type": "application/json"}, timeout=30)
        assert r.status_code == 413
        assert httpx.post(srv.url + C, json={"prompt": "x", "max_tokens": 2}, timeout=30).status_code == 200


def test_api_key_is_enforced_on_every_route_but_health(host):
    with live(host, api_key="s3cret") as srv:
        assert httpx.get(srv.url + "/health").status_code == 200
        for method, path in [("GET", "/v1/models"), ("GET", "/metrics"), ("POST", C), ("POST", CC),
                             ("GET", "/openapi.json"), ("GET", "/nothing")]:
            r = httpx.request(method, srv.url + path, json={"prompt": "x"})
            assert r.status_code == 401, path
            assert r.json()["error"]["code"] == "invalid_api_key"
            r = httpx.request(method, srv.url + path, headers={"authorization": "Bearer wrong"})
            assert r.status_code == 401, path
        assert httpx.get(srv.url + "/metrics", headers={"authorization": "Bearer s3cret"}).status_code == 200
        good = srv.client(api_key="s3cret")
        assert good.models.list().data[0].id == host.name
        assert good.completions.create(model=host.name, prompt="x", max_tokens=2).usage.completion_tokens >= 1
        with pytest.raises(openai.AuthenticationError):
            srv.client(api_key="nope").models.list()


def test_models_and_health(server, host):
    models = httpx.get(server.url + "/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == host.name
    assert models["data"][0]["max_model_len"] == CONTEXT
    assert httpx.get(server.url + f"/v1/models/{host.name}").json()["id"] == host.name
    assert health(server.url)["status"] == "ok"


def test_compress_trace():
    assert compress_trace([4, 4, 4, 0]) == "4x3 0"
    assert compress_trace([]) == ""


# --------------------------------------------------------------------------------------------------------------
# Schema-driven fuzzing: no 5xx
# --------------------------------------------------------------------------------------------------------------


def test_schemathesis_fuzz_finds_no_server_error(host):
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    budget_s = 25.0
    with live(host, max_tokens_limit=8, max_queue=64) as srv:
        schema = schemathesis.openapi.from_url(srv.url + "/openapi.json")
        strategy = st.one_of(schema.as_strategy(schemathesis.GenerationMode.POSITIVE),
                             schema.as_strategy(schemathesis.GenerationMode.NEGATIVE))
        started = time.monotonic()
        calls = []

        @settings(max_examples=150, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def fuzz(case):
            if time.monotonic() - started > budget_s:
                return  # time bound: the remaining examples pass without a call
            response = case.call(base_url=srv.url, timeout=60)
            calls.append(response.status_code)
            assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])

        fuzz()
        assert len(calls) >= 20
        assert health(srv.url)["status"] == "ok"


# --------------------------------------------------------------------------------------------------------------
# The real small model (slow): the OpenAI client against smollm2-135m-instruct
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_openai_stream_equals_nonstream_equals_generate(capsys):
    model = "smollm2-135m-instruct"
    h = ModelHost.load(model, "ngram", controller="adaptive", dtype="float32", threads=2, progress=False)
    try:
        with live(h) as srv:
            client = srv.client()
            kw = dict(model=model, temperature=0, max_tokens=32)
            msgs = [{"role": "user", "content": PROMPT}]
            full = client.chat.completions.create(messages=msgs, **kw)
            streamed = "".join(c.choices[0].delta.content or ""
                               for c in client.chat.completions.create(messages=msgs, stream=True, **kw) if c.choices)
            assert full.choices[0].message.content == streamed
            assert len(streamed) > 20
            assert streamed == _cli_text(capsys, model, "ngram", max_new_tokens=32)
            spec = full.model_extra["speculation"]
            assert spec["drafter"] == "ngram" and spec["steps"] >= 1
    finally:
        h.shutdown()


def test_serve_cli_flags(capsys):
    from adaspec.cli import build_parser
    from adaspec.server.main import _is_loopback

    args = build_parser().parse_args(["serve", "--port", "0", "--api-key", "k", "--allow-drafter", "a",
                                      "--allow-drafter", "b"])
    assert args.host == "127.0.0.1" and args.allow_drafter == ["a", "b"] and args.func.__name__ == "cmd_serve"
    assert cli_main(["serve", "--max-queue", "-1"]) == 2  # rejected before any model is loaded
    assert "--max-queue must be >= 0" in capsys.readouterr().err
    assert _is_loopback("127.0.0.1") and _is_loopback("::1") and _is_loopback("localhost")
    assert not _is_loopback("0.0.0.0") and not _is_loopback("example.org")
    assert args.draft_catch_up is None  # the default: the draft model sees the whole sequence
    for command in ("serve", "generate", "compare"):
        extra = ["hello"] if command == "generate" else []
        assert build_parser().parse_args([command, *extra, "--draft-catch-up", "64"]).draft_catch_up == 64
        assert build_parser().parse_args([command, *extra, "--draft-catch-up", "0"]).draft_catch_up is None
    with pytest.raises(SystemExit):  # refused by the parser, before any model is loaded
        cli_main(["generate", "hi", "--draft-catch-up", "1"])
    assert "--draft-catch-up: 0 (no bound) or at least 2 tokens, got 1" in capsys.readouterr().err


def test_request_schema_offers_every_controller():
    """The per-request ``speculation.controller`` choices are exactly the engine's controllers."""
    import typing

    from adaspec.controllers import CONTROLLERS
    from adaspec.server.protocol import SpeculationOptions

    literal = typing.get_args(SpeculationOptions.model_fields["controller"].annotation)[0]
    assert set(typing.get_args(literal)) == set(CONTROLLERS)


# --------------------------------------------------------------------------------------------------------------
# Strict mode (issue 16): a request field and a server default
# --------------------------------------------------------------------------------------------------------------


def test_strict_request_repeats_and_equals_plain_strict(server):
    client = server.client()

    def complete(**extra) -> str:
        r = client.completions.create(model=None, prompt="def fibonacci(n):", max_tokens=24, temperature=0,
                                      extra_body=extra)
        return r.choices[0].text

    plain = complete(strict=True, speculation={"drafter": "none"})
    outs = {complete(strict=True, speculation={"controller": "fixed", "k": k}) for k in (1, 3, 6)}
    outs.add(complete(strict=True))
    assert outs == {plain}


def test_strict_request_field_is_validated(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "strict": "maybe"},
                   timeout=30)
    assert r.status_code == 400 and "strict" in r.text


def test_server_strict_default_sets_the_backend_per_request(host):
    seen = []
    backend = host.target.backend
    original = backend.forward

    def spy(ids, num_logits=1):
        seen.append(backend.batch_invariant)
        return original(ids, num_logits)

    backend.forward = spy
    try:
        with live(host, strict=True) as srv:
            srv.client().completions.create(model=None, prompt="hello", max_tokens=4, temperature=0)
            assert seen and all(seen)
            seen.clear()
            srv.client().completions.create(model=None, prompt="hello", max_tokens=4, temperature=0,
                                            extra_body={"strict": False})
            assert seen and not any(seen)
    finally:
        del backend.forward
    assert backend.batch_invariant is False


def test_loadtest_repeat_counts_changed_answers(server):
    from adaspec.server.loadtest import markdown, run_repeat

    model = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]["id"]
    r = run_repeat(server.url, model, prompts=2, repeats=3, max_tokens=8, strict=True, api_key=None,
                   deadline=time.monotonic() + 120, timeout=60)
    assert r["errors"] == 0 and r["repeats_compared"] == 4 and r["changed"] == 0 and r["changed_rate"] == 0.0
    assert [p["answers"] for p in r["per_prompt"]] == [3, 3]
    table = markdown({"model": "m", "max_tokens": 8, "machine": "x", "repeat": [r]})
    assert "| strict | 2 × 3 | 0/4 (0.0%) | 0/2 | 0 |" in table


# --------------------------------------------------------------------------------------------------------------
# Sampling controls and logprobs (issue 13)
# --------------------------------------------------------------------------------------------------------------


def _engine_result(host: ModelHost, ids: list[int], **cfg):
    from adaspec.engine import GenerationConfig, SpeculativeEngine

    engine = SpeculativeEngine(host.target.backend, None, None, tokenizer=host.tokenizer)
    return engine.generate(ids, GenerationConfig(**cfg))


def test_logprobs_from_both_routes_with_the_openai_client(server, host):
    client = server.client()
    r = client.completions.create(model=None, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=2,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    ids = host.encode_text(PROMPT)
    want = _engine_result(host, ids, max_new_tokens=8, ignore_eos=True, logprobs=2)
    assert len(lp.tokens) == len(lp.token_logprobs) == 8 == r.usage.completion_tokens
    assert lp.token_logprobs == pytest.approx([t.logprob for t in want.logprobs], abs=1e-4)
    assert all(1 <= len(top) <= 2 and max(top.values()) <= 0 for top in lp.top_logprobs)  # (pieces may collide)
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(8)]
    c = client.chat.completions.create(model=None, messages=[{"role": "user", "content": PROMPT}], max_tokens=6,
                                       temperature=0, logprobs=True, top_logprobs=3)
    content = c.choices[0].logprobs.content
    assert len(content) == 6 and all(len(e.top_logprobs) == 3 for e in content)
    assert all(e.top_logprobs[0].logprob >= e.logprob for e in content)  # greedy: the top one is chosen
    assert all(e.token == e.top_logprobs[0].token for e in content)
    # streamed: the same logprobs, chunk by chunk
    streamed = []
    for ch in client.chat.completions.create(model=None, messages=[{"role": "user", "content": PROMPT}],
                                             max_tokens=6, temperature=0, logprobs=True, top_logprobs=3,
                                             stream=True):
        if ch.choices and ch.choices[0].logprobs is not None:
            streamed += ch.choices[0].logprobs.content
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-6)


def test_echo_logprobs_score_the_prompt(server, host):
    """A log-likelihood request (as evaluation harnesses send): echo + logprobs + max_tokens 0."""
    text = "def add(a, b): return a + b"
    r = httpx.post(server.url + "/v1/completions", json={"prompt": text, "max_tokens": 0, "echo": True,
                                                          "logprobs": 1, "temperature": 0}, timeout=60).json()
    choice = r["choices"][0]
    ids = host.encode_text(text)
    assert choice["text"] == text and r["usage"]["completion_tokens"] == 0
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(ids) and lp["token_logprobs"][0] is None
    want = _engine_result(host, ids, max_new_tokens=1, prompt_logprobs=1)
    assert lp["token_logprobs"][1:] == pytest.approx([t.logprob for t in want.prompt_logprobs[1:]], abs=1e-4)
    # with max_tokens 2: the prompt's logprobs, then the completion's
    r = httpx.post(server.url + "/v1/completions", json={"prompt": text, "max_tokens": 2, "echo": True,
                                                          "logprobs": 0, "temperature": 0,
                                                          "ignore_eos": True}, timeout=60).json()
    lp = r["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(ids) + 2 and r["choices"][0]["text"].startswith(text)
    # streamed echo: the prompt (with its logprobs) first
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60, json={
            "prompt": text, "max_tokens": 2, "echo": True, "logprobs": 0, "temperature": 0, "ignore_eos": True,
            "stream": True}) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    assert chunks[0]["choices"][0]["text"] == text
    assert chunks[0]["choices"][0]["logprobs"]["token_logprobs"][1:] == pytest.approx(lp["token_logprobs"][1:len(ids)],
                                                                                      abs=1e-6)


def test_penalties_and_bias_change_the_output_as_the_engine_does(server, host):
    body = {"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    plain = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    ids = host.encode_text(PROMPT)
    controls = dict(frequency_penalty=1.5, presence_penalty=0.5, repetition_penalty=1.2)
    for spec in ({"drafter": "none"}, {"controller": "fixed", "k": 3}):
        r = httpx.post(server.url + "/v1/completions", json={**body, **controls, "speculation": spec},
                       timeout=60).json()
        want = _engine_result(host, ids, max_new_tokens=16, ignore_eos=True, **controls)
        assert r["choices"][0]["text"] == want.text != plain["choices"][0]["text"]
    banned = _engine_result(host, ids, max_new_tokens=16, ignore_eos=True).token_ids[0]
    r = httpx.post(server.url + "/v1/completions", json={**body, "logit_bias": {str(banned): -100}},
                   timeout=60).json()
    want = _engine_result(host, ids, max_new_tokens=16, ignore_eos=True, logit_bias={banned: -100})
    assert r["choices"][0]["text"] == want.text and banned not in want.token_ids


def test_cli_generate_takes_the_controls_and_prints_logprobs(server, tiny, capsys):
    capsys.readouterr()
    args = ["generate", PROMPT, "--target", tiny, "--draft", tiny, "--dtype", "float32", "--threads", "1",
            "--max-new-tokens", "8", "--json", "--no-chat", "--frequency-penalty", "1.5", "--logit-bias", "5:-100",
            "--logprobs", "2"]
    assert cli_main(args) == 0
    out = json.loads(capsys.readouterr().out)
    r = httpx.post(server.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                                                          "frequency_penalty": 1.5, "logit_bias": {"5": -100}},
                   timeout=60).json()
    assert out["text"] == r["choices"][0]["text"]
    assert len(out["logprobs"]) == 8 and all(len(t["top"]) == 2 for t in out["logprobs"])
    assert cli_main(args[:-2] + ["--logit-bias", "five"]) == 2
    assert "ID:BIAS" in capsys.readouterr().err


def test_n_choices_sample_with_their_own_seeds(server, host):
    from adaspec.engine import GenerationConfig, SpeculativeEngine

    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "seed": 11, "n": 3, "ignore_eos": True,
            "speculation": {"drafter": "none"}}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    assert [c["index"] for c in r["choices"]] == [0, 1, 2] and r["usage"]["completion_tokens"] == 24
    ids = host.encode_text(PROMPT)
    engine = SpeculativeEngine(host.target.backend, None, None, tokenizer=host.tokenizer)
    want = [engine.generate(ids, GenerationConfig(max_new_tokens=8, temperature=1.0, seed=11 + i, ignore_eos=True)).text
            for i in range(3)]
    assert [c["text"] for c in r["choices"]] == want and len(set(want)) > 1
    chat = server.client().chat.completions.create(model=None, messages=[{"role": "user", "content": "hi"}], n=2,
                                                   max_tokens=4, temperature=0)
    assert len(chat.choices) == 2 and chat.choices[0].message.content == chat.choices[1].message.content
    # streamed: the choices interleave, each with its own index and finish chunk; the text equals the non-streamed
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True,
                                                                   "stream_options": {"include_usage": True}},
                      timeout=60) as st:
        events = [json.loads(line[6:]) for line in st.iter_lines() if line.startswith("data: {")]
    texts = ["", "", ""]
    finishes = []
    for e in events:
        for c in e["choices"]:
            texts[c["index"]] += c["text"]
            if c["finish_reason"]:
                finishes.append(c["index"])
    assert texts == want and sorted(finishes) == [0, 1, 2]
    assert events[-1]["usage"]["completion_tokens"] == 24


def test_n_beyond_the_servers_places_is_a_400(host):
    with live(host, max_queue=1) as srv:
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, "n": 3}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "n" and "places" in r.text
        assert health(srv.url)["running"] == 0 and health(srv.url)["waiting"] == 0


def test_cli_num_return_sequences_equals_the_servers_n(server, tiny, capsys):
    capsys.readouterr()
    args = ["generate", PROMPT, "--target", tiny, "--draft", "none", "--dtype", "float32", "--threads", "1",
            "--max-new-tokens", "6", "--json", "--no-chat", "--temperature", "1", "--seed", "3",
            "--num-return-sequences", "3"]
    assert cli_main(args) == 0
    out = json.loads(capsys.readouterr().out)
    r = httpx.post(server.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 6, "temperature": 1,
                                                          "seed": 3, "n": 3, "speculation": {"drafter": "none"}},
                   timeout=60).json()
    assert [c["text"] for c in out["choices"]] == [c["text"] for c in r["choices"]]
    assert cli_main(args[:-1] + ["0"]) == 2
    assert "num_return_sequences must be >= 1" in capsys.readouterr().err


def test_observed_controller_is_the_inner_controller_to_the_engine():
    """The server wraps each engine's controller to watch its steps. The wrapper must not change what the engine
    does: the goodput controller's per-step drafter choice (``choose_drafter``, which ``route`` looks up), its
    warm-up calibration and the draft cache's bookkeeping (``set_synced``) all reach it, and it is asked for one
    decision per step, not two (its decisions move probe counters). Before, none of these reached it."""
    from conftest import MarkovBackend, markov_table

    from adaspec.controllers import FixedController, GoodputController
    from adaspec.drafters import ModelDrafter, NgramDrafter
    from adaspec.drafters.multi import MultiDrafter
    from adaspec.engine import GenerationConfig, SpeculativeEngine
    from adaspec.server.runtime import ObservedController

    assert not ObservedController(FixedController(2)).routes_drafters  # the inner controller's capabilities
    assert ObservedController(GoodputController()).routes_drafters
    table = markov_table(16, seed=3, scale=3.0)
    inner = GoodputController()
    calls = {"decide": 0, "set_synced": 0}
    decide, set_synced = inner.decide, inner.set_synced

    def counted_decide(options):
        calls["decide"] += 1
        return decide(options)

    def counted_set_synced(synced, catch_up=None):
        calls["set_synced"] += 1
        set_synced(synced, catch_up)
    inner.decide, inner.set_synced = counted_decide, counted_set_synced
    decisions: list[int] = []
    next_k = inner.next_k
    inner.next_k = lambda: (decisions.append(next_k()), decisions[-1])[1]
    observed = ObservedController(inner)
    seen: list[tuple[int, int]] = []
    observed.listener = lambda step, k: seen.append((step.k, k))
    drafter = MultiDrafter({"ngram": NgramDrafter(), "draft": ModelDrafter(MarkovBackend(table, "draft"))})
    engine = SpeculativeEngine(MarkovBackend(table, "target"), drafter, observed)
    engine.warmup()
    assert inner.costs.seeded  # calibrate() reached the goodput controller
    calls.update(decide=0, set_synced=0)
    result = engine.generate([1, 2, 3, 4, 1, 2, 3, 4, 1, 2], GenerationConfig(max_new_tokens=40, ignore_eos=True))
    steps = len(result.stats.steps)
    assert calls == {"decide": steps, "set_synced": 1}
    assert [k for _, k in seen[-steps:]] == decisions[-steps:]  # the controller's choices, one per step
    assert any(s.drafter == "draft" for s in result.stats.steps)  # routed: the draft model, not only lookups
    # a clamp near max_new_tokens (K cut to the tokens left) is not the controller switching speculation off
    fixed = ObservedController(FixedController(4))
    reported: list[tuple[int, int]] = []
    fixed.listener = lambda step, k: reported.append((step.k, k))
    never = MarkovBackend(-table, "never right")  # proposes the target's least likely tokens
    SpeculativeEngine(MarkovBackend(table, "target"), ModelDrafter(never), fixed).generate(
        [1, 2, 3], GenerationConfig(max_new_tokens=10, ignore_eos=True))
    assert [k for _, k in reported] == [4] * len(reported) and reported[-1][0] < 4  # ran clamped, reported as 4


def test_the_observed_controller_forwards_every_hook_the_base_class_defines():
    """A hook the base :class:`Controller` defines is a no-op there, so the wrapper's ``__getattr__`` never sees it:
    each must be forwarded by name, or the server's controllers silently lose it (``set_forced`` was)."""
    import inspect

    from adaspec.controllers import GoodputController
    from adaspec.controllers.base import Controller
    from adaspec.server.runtime import ObservedController

    hooks = {name for name, member in vars(Controller).items()
             if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property))}
    assert {"set_forced", "set_synced", "next_k", "update"} <= hooks
    assert hooks <= set(vars(ObservedController)), hooks - set(vars(ObservedController))
    inner = GoodputController()
    ObservedController(inner).set_forced(5)
    assert inner.forced == 5


def test_server_names_stay_importable_from_runtime_and_app():
    """runtime.py and app.py were split by job (settings, host, jobs, batch_runner, service, ...); the names scripts
    and users import from them are the same objects as where they live now."""
    from adaspec import spec_setting
    from adaspec.server import app, batch_runner, generation_thread, host, jobs, runtime, settings

    assert runtime.ModelHost is host.ModelHost
    assert runtime.Job is jobs.Job and runtime.EngineHandle is jobs.EngineHandle
    assert runtime.ObservedController is jobs.ObservedController
    assert runtime.BatchRunner is batch_runner.BatchRunner
    assert runtime.GenerationThread is generation_thread.GenerationThread
    assert runtime.PLAIN is settings.PLAIN and runtime.SpecSettings is settings.SpecSettings
    assert settings.SpecSettings is spec_setting.SpecSetting and settings.PLAIN is spec_setting.PLAIN
    assert runtime.DEFAULT_PREFILL_CHUNK == settings.DEFAULT_PREFILL_CHUNK
    assert app.ServerConfig is settings.ServerConfig
    import adaspec.server

    assert adaspec.server.ServerConfig is settings.ServerConfig and adaspec.server.ModelHost is host.ModelHost
    assert adaspec.server.create_app is app.create_app
