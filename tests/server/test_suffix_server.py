"""``adaspec serve`` with the suffix drafter: one cache for every suffix drafter of the server, shared by a request's
batch rows and by later requests, holding only finished responses, with a partition per API key (unless
``--suffix-share``); output identical to plain decoding."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_server import PROMPT, build_tiny_model, health, live, make_host, scrape, value, wait_until  # noqa: E402

from adaspec.drafters.suffix import SuffixDrafter  # noqa: E402
from adaspec.server.auth import key_id, keys_from_cli  # noqa: E402
from adaspec.server.runtime import ModelHost  # noqa: E402
from adaspec.server.suffix_partitions import suffix_partition  # noqa: E402

KEYS = ("key-of-alice", "key-of-bob", "key-of-carol")
ALICE, BOB, CAROL = (suffix_partition(key_id(k)) for k in KEYS)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-suffix")))


@pytest.fixture(scope="module")
def host(tiny):
    h = make_host(tiny, draft="suffix")
    yield h
    h.shutdown()


@pytest.fixture(scope="module", params=[1, 2], ids=["one-at-a-time", "batched"])
def keyed_host(tiny, request):
    """A suffix server whose cache holds 100 tokens, one request at a time or in a batch of 2."""
    h = ModelHost.load(tiny, "suffix", controller="fixed", k=4, dtype="float32", threads=1, progress=False,
                       max_batch=request.param, suffix_tokens=100)
    h.warmup(steps=2)
    yield h
    h.shutdown()


def ask(srv, key: str, prompt: str = PROMPT, max_tokens: int = 24, **extra) -> dict:
    r = httpx.post(srv.url + "/v1/completions", timeout=60, headers={"authorization": f"Bearer {key}"},
                   json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_served_suffix_requests_share_one_cache_and_match_plain(host):
    settings = host.normalise(drafter="suffix")
    handle = host.engine_for(settings)
    drafter = handle.engine.drafter
    assert isinstance(drafter, SuffixDrafter) and "suffix[:KEY=VALUE,...]" in host.available_drafters()
    assert handle.drafter_for(0).cache is drafter.cache is host.suffix.cache  # batched rows draft from it too
    assert drafter.cache.responses == 0  # the warm-up's text was not kept
    body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0}
    with live(host, max_queue=8) as srv:
        plain = httpx.post(srv.url + "/v1/completions", timeout=60,
                           json={**body, "speculation": {"drafter": "none"}}).json()
        runs = [httpx.post(srv.url + "/v1/completions", timeout=60,
                           json={**body, "speculation": {"drafter": "suffix"}}).json() for _ in range(2)]
    assert [r["choices"][0]["text"] for r in runs] == [plain["choices"][0]["text"]] * 2
    assert drafter.cache.responses == 2
    first, second = (r["speculation"] for r in runs)
    assert second["accepted_tokens"] > first["accepted_tokens"]  # the repeat drafts from the first answer


@pytest.mark.parametrize("spec, says", [("suffix:factor=0", "max_spec_factor"), ("suffix:prob=2", "min_token_prob"),
                                         ("suffix:bogus=1", "KEY one of"), ("suffix:depth=x", "depth must be int")])
def test_a_bad_suffix_option_is_a_clear_400(host, spec, says):
    with live(host, max_queue=8) as srv:
        r = httpx.post(srv.url + "/v1/completions", timeout=60, json={
            "prompt": PROMPT, "max_tokens": 4, "speculation": {"drafter": spec}})
    assert r.status_code == 400 and says in r.text


def test_a_key_never_drafts_from_what_another_key_wrote(keyed_host):
    cache = keyed_host.suffix.cache
    cache.clear()
    with live(keyed_host, api_key=KEYS, max_queue=8) as srv:
        first, again = ask(srv, KEYS[0]), ask(srv, KEYS[0])
        other = ask(srv, KEYS[1])
        wrong = httpx.post(srv.url + "/v1/completions", headers={"authorization": "Bearer key-of-eve"},
                           json={"prompt": PROMPT, "max_tokens": 2}, timeout=60)
    assert wrong.status_code == 401 and cache.responses == 3
    spec = [r["speculation"] for r in (first, again, other)]
    assert again["choices"][0]["text"] == first["choices"][0]["text"] == other["choices"][0]["text"]
    assert spec[1]["accepted_tokens"] > spec[0]["accepted_tokens"]  # alice's repeat drafts from her first answer
    # bob's identical request sees none of it: it drafts exactly as alice's first one did, on an empty partition
    assert [(s["draft_tokens"], s["accepted_tokens"]) for s in (spec[0], spec[2])] == [
        (spec[0]["draft_tokens"], spec[0]["accepted_tokens"])] * 2
    assert cache.partitions == [ALICE, BOB] and cache.responses == 3
    assert cache.partition_tokens(ALICE) == 2 * cache.partition_tokens(BOB)
    assert not any(k in p for k in KEYS for p in cache.partitions)  # digests, never the keys


def test_suffix_share_lets_keys_draft_from_each_other(keyed_host):
    cache = keyed_host.suffix.cache
    cache.clear()
    with live(keyed_host, api_key=KEYS, suffix_share=True, max_queue=8) as srv:
        first, other = ask(srv, KEYS[0]), ask(srv, KEYS[1])
    assert other["speculation"]["accepted_tokens"] > first["speculation"]["accepted_tokens"]
    assert cache.partitions == [""] and cache.responses == 2


def test_a_keyless_server_has_one_partition(keyed_host):
    cache = keyed_host.suffix.cache
    cache.clear()
    with live(keyed_host, max_queue=8) as srv:
        ask(srv, "ignored"), ask(srv, "also ignored")
    assert cache.partitions == [""] and cache.responses == 2


def test_the_cache_limit_holds_over_keys_and_the_least_recent_key_goes_first(keyed_host):
    cache = keyed_host.suffix.cache
    cache.clear()
    evicted = cache.evicted
    with live(keyed_host, api_key=KEYS, max_queue=8) as srv:
        for key, prompt in zip(KEYS, ("Hello world", "The quick brown fox", "def fibonacci(n)")):
            ask(srv, key, prompt, max_tokens=40, ignore_eos=True)
            assert cache.tokens <= 100
    # three answers of 40 + 4 context tokens do not fit in 100: alice's (the least recently used) went
    assert cache.partitions == [BOB, CAROL] and cache.evicted == evicted + 1 and cache.tokens == 88


def test_a_cancelled_request_leaves_nothing_in_any_partition(keyed_host):
    cache = keyed_host.suffix.cache
    cache.clear()
    with live(keyed_host, api_key=KEYS, max_queue=8) as srv:
        with httpx.stream("POST", srv.url + "/v1/completions", timeout=60,
                          headers={"authorization": f"Bearer {KEYS[0]}"},
                          json={"prompt": PROMPT, "max_tokens": 1500, "ignore_eos": True, "temperature": 0,
                                "stream": True}) as r:
            seen, lines = 0, r.iter_lines()  # keep the iterator referenced: closing it closes the connection
            for line in lines:
                seen += line.startswith("data: ")
                if seen >= 3:
                    break
        wait_until(lambda: health(srv.url)["running"] == 0, what="the cancelled request to end")
        auth = {"authorization": f"Bearer {KEYS[0]}"}
        assert value(scrape(srv.url, **auth), "adaspec:requests_total", outcome="cancelled") == 1
        assert cache.responses == 0 and cache.tokens == 0
        ask(srv, KEYS[0], max_tokens=8)  # a finished one is kept
    assert cache.responses == 1 and cache.partitions == [ALICE]


def test_a_request_may_not_resize_the_servers_suffix_cache(keyed_host):
    with live(keyed_host, max_queue=8) as srv:
        for spec, key in (("suffix:tokens=999999", "tokens"), ("suffix:depth=8", "depth")):
            r = httpx.post(srv.url + "/v1/completions", timeout=60, json={
                "prompt": PROMPT, "max_tokens": 4, "speculation": {"drafter": spec}})
            assert r.status_code == 400 and f"{key} is the server's suffix cache setting" in r.text
        ok = ask(srv, "unused", max_tokens=4, speculation={"drafter": "suffix:factor=2,tokens=100"})
    assert ok["speculation"]["drafter"] == "suffix:factor=2,tokens=100"
    handle = keyed_host.engine_for(keyed_host.normalise("suffix:factor=2,tokens=100"))
    assert handle.engine.drafter.cache is keyed_host.suffix.cache  # the same cache, whatever the rule


def test_serve_takes_several_keys_from_flags_or_the_environment():
    assert keys_from_cli(["a", "b"], "c,d") == ("a", "b")  # the flags win
    assert keys_from_cli(None, " c, d ,") == ("c", "d")
    assert keys_from_cli(None, None) is None and keys_from_cli([], "") is None
    assert key_id("a") != key_id("b") and len(key_id("a")) == 16 and "a" != key_id("a")


def test_the_servers_cache_takes_its_size_and_depth_from_the_default_spec_or_the_flag():
    from adaspec.drafters.multi import MultiDrafter
    from adaspec.errors import ConfigError
    from adaspec.server.suffix_partitions import ServerSuffixCache

    assert (ServerSuffixCache("suffix:depth=32,tokens=500").cache.max_depth,
            ServerSuffixCache("suffix:depth=32,tokens=500").cache.max_tokens) == (32, 500)
    assert ServerSuffixCache("suffix:tokens=500", max_tokens=9).cache.max_tokens == 9  # the flag wins
    hybrid = MultiDrafter({"suffix": SuffixDrafter(max_tokens=700, max_depth=16)})
    shared = ServerSuffixCache("hybrid-suffix", hybrid)
    assert (shared.cache.max_tokens, shared.cache.max_depth) == (700, 16)
    assert shared.adopt(hybrid).drafters["suffix"].cache is shared.cache
    with pytest.raises(ConfigError, match="depth is 24, but this server's suffix cache has depth 16"):
        shared.adopt(SuffixDrafter())
    with pytest.raises(ConfigError, match="tokens is the server's suffix cache setting"):
        shared.check("suffix:tokens=701")
    shared.check("suffix:tokens=700,depth=16,factor=2,stop=1")  # the server's own values, and the rule: accepted
