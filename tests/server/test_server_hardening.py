"""The server under hostile load (issue 41), in process: slot places under cancellation, per-request slot caps, the
batch runner's admission under ``cancel_all``, lone surrogates, the Host/Origin check, served model names,
``ngram-tree``, bounded prompt scoring shared across ``n``, chunked batch prefill, bounded on-demand drafters and
incremental detokenisation. The live-subprocess fault suite is ``test_server_faults.py``.
"""

from __future__ import annotations

import asyncio
import json
import random
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

import httpx  # noqa: E402
import torch  # noqa: E402
from test_server import PROMPT, build_tiny_model, health, live, make_host, scrape, value, wait_until  # noqa: E402

from adaspec.backends import TorchBackend  # noqa: E402
from adaspec.batch import BatchEngine  # noqa: E402
from adaspec.engine import GenerationConfig, SpeculativeEngine  # noqa: E402
from adaspec.errors import ConfigError  # noqa: E402
from adaspec.server.admission import Place, QueueFull, Scheduler, SlotTimeout, reserve_places  # noqa: E402
from adaspec.server.hostcheck import normalise_host, parse_allowed_hosts  # noqa: E402
from adaspec.server.limits import lone_surrogate  # noqa: E402
from adaspec.server.runtime import ModelHost  # noqa: E402
from adaspec.text import TextStream  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-hardening")))


@pytest.fixture(scope="module")
def host(tiny) -> ModelHost:
    h = make_host(tiny)
    yield h
    h.shutdown()


@pytest.fixture(scope="module")
def batched(tiny) -> ModelHost:
    h = ModelHost.load(tiny, tiny, controller="fixed", k=4, dtype="float32", threads=1, progress=False, max_batch=4,
                       prefill_chunk=8)
    h.warmup(steps=2)
    yield h
    h.shutdown()


def _post(url: str, path: str = "/v1/completions", **body) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=60)


# --------------------------------------------------------------------------------------------------------------
# 1. Places: no slot leaks under cancellation; per-request caps; the runner's admission under cancel_all
# --------------------------------------------------------------------------------------------------------------


def test_a_place_cancelled_as_its_slot_arrives_gives_the_slot_back():
    """The slot is handed over and the waiting choice cancelled in the same loop iteration (a sibling choice failed):
    the cancellation is not swallowed and the slot comes back (asyncio.wait_for on Python <= 3.11 could return the
    slot instead of raising, starting a generation nobody reads)."""
    async def run():
        s = Scheduler(max_waiting=4, slots=1)
        holder = s.reserve()
        place = Place(s, s.reserve("r"), "r")
        task = asyncio.ensure_future(place.acquire(time.monotonic() + 30))
        await asyncio.sleep(0)  # waiting on its ticket
        s.release()  # the holder leaves: the slot passes to the place's ticket ...
        task.cancel()  # ... as its request gives up
        await asyncio.gather(task, return_exceptions=True)
        assert holder.done() and task.cancelled()
        assert s.busy == 0 and s.waiting == 0 and place.state == "gone"

    asyncio.run(run())


def test_choices_cancelled_at_every_point_leave_no_slot_behind():
    async def run():
        s = Scheduler(max_waiting=8, slots=2)
        for cancel_after in range(4):  # loop iterations before the request is torn down
            places = reserve_places(s, 3, owner=object())

            async def choice(p: Place) -> None:
                await p.acquire(time.monotonic() + 30)
                p.hand_over()  # a generation holds it; it ends (cancelled or not) and releases it
                try:
                    await asyncio.sleep(0)
                finally:
                    p.release_slot()

            tasks = [asyncio.ensure_future(choice(p)) for p in places]
            for _ in range(cancel_after):
                await asyncio.sleep(0)
            for t in tasks:
                t.cancel()
            for p in places:
                p.give_back()  # what the app's finally does; idempotent
            await asyncio.gather(*tasks, return_exceptions=True)
            assert (s.busy, s.waiting) == (0, 0), cancel_after

    asyncio.run(run())


def test_a_place_times_out_and_reserve_places_is_all_or_none():
    async def run():
        s = Scheduler(max_waiting=1, slots=1)
        first = Place(s, s.reserve())
        await first.acquire(time.monotonic() + 1)
        late = Place(s, s.reserve())
        with pytest.raises(SlotTimeout):
            await late.acquire(time.monotonic() + 0.01)
        assert s.waiting == 0 and s.busy == 1
        with pytest.raises(QueueFull):
            reserve_places(s, 3, owner="x")  # 1 running + 1 waiting place: 3 do not fit
        assert s.waiting == 0 and s.busy == 1
        first.give_back()
        assert s.busy == 0

    asyncio.run(run())


def test_one_request_cannot_take_every_slot():
    async def run():
        s = Scheduler(max_waiting=8, slots=4, per_owner=2)
        greedy = [s.reserve("a") for _ in range(4)]
        assert [t.done() for t in greedy] == [True, True, False, False]
        other = s.reserve("b")  # served at once although "a" queued first: "a" is at its cap
        assert other.done() and s.busy == 3
        s.release("a")  # one of a's slots frees: its next choice takes it
        assert greedy[2].done() and not greedy[3].done()
        s.release("b")
        assert not greedy[3].done()  # a free slot, but "a" holds its 2
        s.release("a")
        assert greedy[3].done()

    asyncio.run(run())


def test_a_freed_slot_goes_to_the_waiting_client_that_holds_the_fewest():
    """Client A's burst fills both slots and queues first; B's one request, queued behind it, gets the next freed
    slot; A's waiters then go in their own order."""
    async def run():
        s = Scheduler(max_waiting=8, slots=2)
        a_running = [s.reserve(object(), "A") for _ in range(2)]
        a_waiting = [s.reserve(object(), "A") for _ in range(3)]
        b = s.reserve(object(), "B")
        assert all(t.done() for t in a_running) and not any(t.done() for t in a_waiting) and not b.done()
        s.release(None, "A")
        assert b.done() and not any(t.done() for t in a_waiting)  # A holds 1, B 0: B first
        s.release(None, "A")
        assert [t.done() for t in a_waiting] == [True, False, False]  # A 1, B 1: FIFO among equals
        s.release(None, "B")
        assert [t.done() for t in a_waiting] == [True, True, False]
        assert (s.busy, s.waiting) == (2, 1)

    asyncio.run(run())


def test_one_client_holds_at_most_its_share_of_the_queue():
    async def run():
        s = Scheduler(max_waiting=4, slots=1, per_client_waiting=2)
        s.reserve(object(), "A")
        for _ in range(2):
            s.reserve(object(), "A")
        with pytest.raises(QueueFull, match="per-client limit"):
            s.reserve(object(), "A")
        s.reserve(object(), "B")  # another client still finds a place
        assert s.waiting == 3
        with pytest.raises(ConfigError, match="per client"):
            Scheduler(max_waiting=4, per_client_waiting=0)

    asyncio.run(run())


def test_n_choices_beyond_the_per_request_cap_queue_and_finish(batched):
    with live(batched, max_queue=16, max_slots_per_request=1) as srv:
        r = _post(srv.url, prompt=PROMPT, max_tokens=6, n=3, temperature=0.8, seed=3, ignore_eos=True)
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"]) == 3
        assert health(srv.url)["running"] == 0 and health(srv.url)["waiting"] == 0


def test_a_failing_choice_with_n_leaves_every_slot_free(host):
    """n = 3 on one slot with a short timeout: the first choice runs, the others time out in the queue (504), and
    the request is torn down while the running choice holds the slot: afterwards nothing is held."""
    long = {"prompt": PROMPT, "max_tokens": 400, "ignore_eos": True, "temperature": 0.5,
            "speculation": {"drafter": "none"}}
    with live(host, max_queue=8, request_timeout=0.3, max_slots_per_request=1) as srv:
        for _ in range(3):
            r = _post(srv.url, **long, n=3)
            assert r.status_code == 504, r.text
            wait_until(lambda: health(srv.url)["running"] == 0 and health(srv.url)["waiting"] == 0,
                       what="every place of the failed request to be given back")
        r = _post(srv.url, prompt=PROMPT, max_tokens=3, temperature=0)
        assert r.status_code == 200


def test_jobs_admitted_while_cancel_all_runs_are_cancelled(batched):
    """cancel_all (server shutdown) from the event loop while the batch thread admits a job: the job being admitted
    is neither in the inbox nor yet a running row; it must still be cancelled."""
    runner_add = batched.batch.add
    calls = []

    def add(*args, **kwargs):
        calls.append(1)
        batched.runner.cancel_all()  # what the event loop does at this moment
        return runner_add(*args, **kwargs)

    with live(batched) as srv:
        before = scrape(srv.url)
        batched.batch.add = add
        try:
            r = _post(srv.url, prompt=PROMPT, max_tokens=200, ignore_eos=True, temperature=0)
        finally:
            del batched.batch.add
        assert calls and r.status_code != 200
        after = scrape(srv.url)
        assert value(after, "adaspec:requests_total", outcome="cancelled") - value(
            before, "adaspec:requests_total", outcome="cancelled") == 1
        wait_until(lambda: health(srv.url)["running"] == 0)


# --------------------------------------------------------------------------------------------------------------
# 2-4. Surrogates, Host/Origin, names
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path,raw,field", [
    ("/v1/completions", '{"prompt": "a\\ud800b", "max_tokens": 2}', "prompt"),
    ("/v1/completions", '{"prompt": "ab", "max_tokens": 2, "stop": ["x", "\\udfff"]}', "stop.1"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi \\ud83d"}], "max_tokens": 2}',
     "messages.0.content"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}',
     "messages.0.content.0.text"),
    ("/v1/completions", '{"prompt": "ab", "max_tokens": 2, "user": "\\ud800"}', "user"),
])
def test_lone_surrogates_are_a_400_naming_the_field(host, path, raw, field):
    with live(host) as srv:
        r = httpx.post(srv.url + path, content=raw.encode(), headers={"content-type": "application/json"},
                       timeout=30)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert f"{field}: " in err["message"]  # pydantic's own check catches length-limited strings first
        assert "surrogate" in err["message"] or "unicode" in err["message"]
        assert err["param"] == field.split(".")[0]
        assert _post(srv.url, prompt="ok", max_tokens=2).status_code == 200


def test_lone_surrogate_finder():
    assert lone_surrogate({"a": ["x", {"b": "\ud800"}]}) == "a.1.b"
    assert lone_surrogate({"\udc00": 1}) == "\udc00"  # keys too
    assert lone_surrogate({"a": "😀 é", "b": [1, 2.5, None]}) is None


def test_host_and_origin_check(host):
    allowed = parse_allowed_hosts(None, "127.0.0.1", True)
    assert set(allowed) == {"localhost", "127.0.0.1", "::1"}
    assert parse_allowed_hosts(None, "0.0.0.0", False) is None
    assert parse_allowed_hosts("*", "127.0.0.1", True) is None
    assert parse_allowed_hosts("Box.Lan,[::1]:80", "127.0.0.1", True) == ("box.lan", "::1")
    assert normalise_host("[::1]:8000") == "::1" and normalise_host("LocalHost:1") == "localhost"
    with live(host, allowed_hosts=allowed, api_key="k") as srv:
        port = srv.url.rsplit(":", 1)[1]
        auth = {"authorization": "Bearer k"}
        ok = httpx.get(srv.url + "/v1/models", headers=auth, timeout=10)
        assert ok.status_code == 200
        assert httpx.get(srv.url + "/v1/models", headers={**auth, "host": f"localhost:{port}"},
                         timeout=10).status_code == 200
        for headers in ({"host": "attacker.example"}, {"host": f"attacker.example:{port}"},
                        {"origin": "http://attacker.example"}, {"origin": "null"}):
            for path in ("/health", "/v1/models", "/metrics"):
                r = httpx.get(srv.url + path, headers={**auth, **headers}, timeout=10)
                assert r.status_code == 403, (path, headers)
                assert r.json()["error"]["code"] == "host_not_allowed"
        assert httpx.get(srv.url + "/health", headers={"origin": f"http://localhost:{port}"},
                         timeout=10).status_code == 200


def test_the_served_name_and_the_runtime_name_are_both_accepted(host):
    with live(host, served_model_name="tiny-typed", model_aliases=("other",)) as srv:
        for name in ("tiny-typed", host.name, "other"):
            r = _post(srv.url, model=name, prompt=PROMPT, max_tokens=2)
            assert r.status_code == 200 and r.json()["model"] == "tiny-typed"
        r = _post(srv.url, model="tiny-typed@nope", prompt=PROMPT, max_tokens=2)
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        assert httpx.get(srv.url + "/v1/models", timeout=10).json()["data"][0]["id"] == "tiny-typed"


def test_serve_flags_reach_the_config():
    from adaspec.cli import build_parser

    args = build_parser().parse_args(["serve", "--target", "smollm2-135m-instruct", "--served-model-name", "a", "b",
                                      "--allowed-hosts", "x.lan", "--prefill-chunk", "64",
                                      "--max-slots-per-request", "2", "--max-scored-tokens", "100",
                                      "--max-queue-per-client", "3"])
    assert args.served_model_name == ["a", "b"] and args.allowed_hosts == "x.lan" and args.prefill_chunk == 64
    assert args.max_slots_per_request == 2 and args.max_scored_tokens == 100 and args.max_queue_per_client == 3
    assert build_parser().parse_args(["serve", "--prefill-step-ms", "500"]).prefill_step_ms == 500.0


def test_a_negative_prefill_budget_is_refused_before_loading(capsys):
    from adaspec.cli import main as cli_main

    assert cli_main(["serve", "--target", "no-such-model", "--prefill-step-ms", "-5"]) == 2
    assert "--prefill-step-ms must be >= 0 (0: fixed chunks), got -5.0" in capsys.readouterr().err
    assert cli_main(["serve", "--target", "no-such-model", "--prefix-cache-mib", "-1"]) == 2
    assert "--prefix-cache-mib must be >= 0 (0: the request before only), got -1" in capsys.readouterr().err


def test_ngram_tree_is_a_servable_drafter(tiny, host, batched):
    assert host.normalise("ngram-tree").drafter == "ngram-tree"
    assert "ngram-tree" in host.available_drafters()
    h = ModelHost.load(tiny, "ngram-tree", controller="fixed", k=3, dtype="float32", threads=1, progress=False)
    try:
        assert h.default.drafter == "ngram-tree"
    finally:
        h.shutdown()
    for srv_host in (host, batched):
        with live(srv_host) as srv:
            r = _post(srv.url, prompt=PROMPT * 2, max_tokens=8, temperature=0,
                      speculation={"drafter": "ngram-tree", "controller": "fixed", "k": 3})
            plain = _post(srv.url, prompt=PROMPT * 2, max_tokens=8, temperature=0, speculation={"drafter": "none"})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]


# --------------------------------------------------------------------------------------------------------------
# 5. Prompt scoring: budget, shared across n, chunked
# --------------------------------------------------------------------------------------------------------------


def test_scoring_budget_is_a_413_naming_the_limit(host):
    with live(host, max_scored_tokens=5) as srv:
        r = _post(srv.url, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
        assert r.status_code == 413
        err = r.json()["error"]
        assert err["param"] == "echo" and "--max-scored-tokens" in err["message"] and "5" in err["message"]
        assert _post(srv.url, prompt="ab", max_tokens=0, echo=True, logprobs=1).status_code == 200
        assert _post(srv.url, prompt=PROMPT, max_tokens=2, echo=True).status_code == 200  # echo alone: no scoring


@pytest.mark.parametrize("which", ["single", "batched"])
def test_echo_scoring_is_shared_across_n_and_chunked(host, batched, which):
    h = host if which == "single" else batched
    body = {"prompt": PROMPT, "max_tokens": 3, "echo": True, "logprobs": 2, "temperature": 0.7, "seed": 1,
            "ignore_eos": True}
    with live(h, max_queue=8) as srv:
        one = _post(srv.url, **body).json()["choices"][0]["logprobs"]
    with live(h, max_queue=8, max_scored_logits_mb=0) as srv:  # < one row of logits: one position per forward
        r = _post(srv.url, **body, n=3)
        assert r.status_code == 200, r.text
        many = r.json()["choices"]
    n_prompt = len(h.encode_text(PROMPT))
    for choice in many:
        lp = choice["logprobs"]
        assert lp["tokens"][:n_prompt] == one["tokens"][:n_prompt]
        assert lp["token_logprobs"][1:n_prompt] == pytest.approx(one["token_logprobs"][1:n_prompt], abs=1e-5)
        assert lp["top_logprobs"][1] == pytest.approx(one["top_logprobs"][1], abs=1e-5)


def test_chunked_scored_prefill_equals_one_forward(tiny):
    host = make_host(tiny)
    try:
        ids = host.encode_text(PROMPT * 3)
        engine = host.engine_for(host.normalise("none")).engine
        cfg = GenerationConfig(max_new_tokens=2, prompt_logprobs=3)
        whole = engine.generate(ids, GenerationConfig(max_new_tokens=2, prompt_logprobs=3,
                                                      prompt_logprobs_chunk=len(ids)))
        for chunk in (1, 7, None):
            got = engine.generate(ids, GenerationConfig(max_new_tokens=2, prompt_logprobs=3,
                                                        prompt_logprobs_chunk=chunk))
            assert got.token_ids == whole.token_ids
            assert [t.token_id for t in got.prompt_logprobs[1:]] == ids[1:]
            assert [t.logprob for t in got.prompt_logprobs[1:]] == pytest.approx(
                [t.logprob for t in whole.prompt_logprobs[1:]], abs=1e-4)
            assert [[i for i, _ in t.top] for t in got.prompt_logprobs[1:]] == [
                [i for i, _ in t.top] for t in whole.prompt_logprobs[1:]]
        assert cfg.prompt_logprobs_chunk is None
    finally:
        host.shutdown()


# --------------------------------------------------------------------------------------------------------------
# 6. Chunked prefill in the batch
# --------------------------------------------------------------------------------------------------------------


def _batch(tiny_model, chunk, **kw) -> BatchEngine:
    return BatchEngine(TorchBackend(tiny_model, "t", max_sequences=2), max_batch=2, prefill_chunk=chunk, **kw)


@pytest.fixture(scope="module")
def tiny_model(tiny):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny, torch_dtype=torch.float32).eval()


def test_a_long_prompt_prefills_in_chunks_between_the_other_rows_steps(tiny_model):
    engine = _batch(tiny_model, 8)
    cfg = GenerationConfig(max_new_tokens=30, ignore_eos=True)
    short = engine.add([5, 6, 7], cfg)
    engine.step()  # the short row prefills and decodes from now on
    long_prompt = [(i * 7) % 300 + 3 for i in range(60)]
    long = engine.add(long_prompt, GenerationConfig(max_new_tokens=3, ignore_eos=True, prompt_logprobs=1))
    steps_until_first = 0
    while True:
        out = engine.step()
        steps_until_first += 1
        assert short in out and out[short].token_ids  # the short row advances at every step
        assert engine.last_tokens <= 8 + 1 + 1  # one prefill chunk plus the short row's token (and no draft)
        if long in out:
            break
    assert steps_until_first == 60 // 8 + 1  # ceil(60 / 8) chunks
    # the chunked row's answer and prompt scores equal an unchunked batch's
    ref = _batch(tiny_model, None)
    want = ref.generate([long_prompt], GenerationConfig(max_new_tokens=3, ignore_eos=True, prompt_logprobs=1))[0]
    rest = {}
    while long not in rest or rest[long].result is None:
        rest.update(engine.step())
    got = rest[long].result
    assert got.token_ids == want.token_ids
    assert [t.logprob for t in got.prompt_logprobs[1:]] == pytest.approx(
        [t.logprob for t in want.prompt_logprobs[1:]], abs=1e-4)


def test_a_row_cancelled_mid_prefill_frees_its_sequence(tiny_model):
    engine = _batch(tiny_model, 4)
    rid = engine.add(list(range(3, 43)), GenerationConfig(max_new_tokens=2))
    engine.step()
    engine.step()
    assert engine.target.seq_len_of(0) == 2 * 4 * 4 and engine.running == 1  # alone: 4 chunks per step
    assert engine.cancel(rid)
    assert engine.running == 0 and engine.target.seq_len_of(0) == 0 and not engine


def test_scored_prefill_chunks_follow_the_scoring_budget(tiny_model):
    engine = _batch(tiny_model, None, max_scored_rows=5)
    rid = engine.add(list(range(3, 23)), GenerationConfig(max_new_tokens=1, prompt_logprobs=0))
    steps = 0
    while True:
        out = engine.step()
        steps += 1
        assert engine.last_tokens <= 5
        if rid in out:
            break
    assert steps == 4 and len(out[rid].result.prompt_logprobs) == 20


def test_n_choices_share_one_prefill_on_the_batched_server(batched):
    with live(batched) as srv:
        m = batched.runner.metrics  # the runner's (it outlives the apps this module's tests start on the host)

        def metric(name: str) -> float:
            return m.registry.get_sample_value(name, {"model_name": m.model_name}) or 0.0

        before = metric("adaspec:shared_prefix_tokens_total")
        steps = metric("adaspec:iteration_seconds_count")
        prompt = PROMPT * 3
        r = _post(srv.url, prompt=prompt, max_tokens=40, temperature=0, n=2)
        assert r.status_code == 200, r.text
        texts = [c["text"] for c in r.json()["choices"]]
        assert texts[0] == texts[1]  # greedy: both choices are the prompt's one answer
        n_prompt = r.json()["usage"]["prompt_tokens"]
        shared = metric("adaspec:shared_prefix_tokens_total") - before
        assert 0 < shared <= n_prompt - 1  # the second choice took the first's prefix, not its own prefill
        assert metric("adaspec:iteration_seconds_count") > steps
        wait_until(lambda: health(srv.url)["running"] == 0)


# --------------------------------------------------------------------------------------------------------------
# 7. Bounded on-demand drafters; draft KV freed with the row
# --------------------------------------------------------------------------------------------------------------


def test_on_demand_drafters_are_bounded_and_their_draft_caches_freed(batched):
    batched.max_dynamic_drafters = 1
    try:
        with live(batched) as srv:
            for n in (1, 2, 1, 2):
                r = _post(srv.url, prompt=PROMPT, max_tokens=6, temperature=0,
                          speculation={"drafter": f"layerskip:{n}", "controller": "fixed", "k": 2})
                assert r.status_code == 200, r.text
                assert batched.dynamic_drafters == [f"layerskip:{n}"]
                assert not any(s.drafter == f"layerskip:{3 - n}" for s in batched._engines)
                dynamic = {fn for fn, _ in batched.batch._drafters if fn not in batched.batch.keep_draft_caches}
                assert len(dynamic) <= 1  # the evicted layerskip's per-slot drafters are gone
                wait_until(lambda: health(srv.url)["running"] == 0)
                for (fn, seq), d in batched.batch._drafters.items():
                    if fn not in batched.batch.keep_draft_caches:
                        assert d.backend.seq_len == 0  # the row's draft KV went with it
    finally:
        batched.max_dynamic_drafters = 4


# --------------------------------------------------------------------------------------------------------------
# 8. Incremental detokenisation
# --------------------------------------------------------------------------------------------------------------


class _Counting:
    def __init__(self, tok) -> None:
        self.tok = tok
        self.decoded = 0

    def decode(self, ids, **kw):
        self.decoded += len(ids)
        return self.tok.decode(ids, **kw)


def test_text_stream_decodes_incrementally_and_equals_a_full_decode(tiny):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    rng = random.Random(0)
    for trial in range(5):
        ids = [rng.randrange(len(tok)) for _ in range(400)]
        counting = _Counting(tok)
        stream = TextStream(counting)
        deltas = []
        i = 0
        while i < len(ids):
            step = rng.randint(1, 4)
            stream.push(ids[i:i + step])
            deltas.append(stream.delta())
            i += step
        deltas.append(stream.delta(final=True))
        full = tok.decode(ids, skip_special_tokens=True)
        assert stream.text == full and "".join(deltas) == full
        assert counting.decoded < 12 * len(ids)  # linear: a full re-decode per push would be ~ len(ids)^2 / 5


def test_text_stream_stops_incrementally_as_before(tiny):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    ids = tok.encode("Hello world, the quick brown fox jumps over the lazy dog")
    for stop in ("quick", "lazy d", "fox j", "world,"):
        stream = TextStream(tok, [stop])
        kept = []
        for t in ids:
            kept += [t] * stream.push([t])
            if stream.stopped:
                break
        assert stream.stopped
        assert stream.text == "Hello world, the quick brown fox jumps over the lazy dog".split(stop)[0]
        assert stop in tok.decode(kept) and stop not in tok.decode(kept[:-1])
