"""``adaspec serve`` with the suffix drafter: one cache per drafter spec, shared by a request's batch rows and by later
requests, holding only finished responses; output identical to plain decoding."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_server import PROMPT, build_tiny_model, live, make_host  # noqa: E402

from adaspec.drafters.suffix import SuffixDrafter  # noqa: E402


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    h = make_host(str(build_tiny_model(tmp_path_factory.mktemp("tiny-suffix"))), draft="suffix")
    yield h
    h.shutdown()


def test_served_suffix_requests_share_one_cache_and_match_plain(host):
    settings = host.normalise(drafter="suffix")
    handle = host.engine_for(settings)
    drafter = handle.engine.drafter
    assert isinstance(drafter, SuffixDrafter) and "suffix[:KEY=VALUE,...]" in host.available_drafters()
    assert handle.drafter_for(0).cache is drafter.cache  # batched rows draft from the same cache
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


def test_a_bad_suffix_option_is_a_clear_400(host):
    with live(host, max_queue=8) as srv:
        r = httpx.post(srv.url + "/v1/completions", timeout=60, json={
            "prompt": PROMPT, "max_tokens": 4, "speculation": {"drafter": "suffix:depth=999"}})
    assert r.status_code == 400 and "max_depth" in r.text
