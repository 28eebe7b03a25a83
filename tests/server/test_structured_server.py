"""Structured output and tool calls through the OpenAI-compatible server, with the ``openai`` client, streamed and
not (the tiny random Llama of test_server: its answers are whatever the grammar lets a random model say, so every
check is on the shape: valid JSON for the schema, a well-formed call of an offered tool)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("llguidance")

import openai  # noqa: E402

from adaspec.toolcalls import ToolCallStream, parse_calls, parse_tool_calls, plan_tools  # noqa: E402
from test_server import live, make_host  # noqa: E402

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "size", "kind"],
          "properties": {"name": {"type": "string", "maxLength": 6},
                         "size": {"type": "integer", "minimum": 0, "maximum": 99},
                         "kind": {"enum": ["fruit", "tool", "animal"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "additionalProperties": False,
                                                          "properties": {"city": {"type": "string", "maxLength": 5}},
                                                          "required": ["city"]}}},
         {"type": "function", "function": {"name": "add", "parameters": {
             "type": "object", "additionalProperties": False, "required": ["a", "b"],
             "properties": {"a": {"type": "integer", "maximum": 9, "minimum": 0},
                            "b": {"type": "integer", "maximum": 9, "minimum": 0}}}}}]
MSGS = [{"role": "user", "content": "Write a Python function that reverses a string."}]


@pytest.fixture(scope="module")
def server(tiny):
    host = make_host(tiny, draft="ngram", controller="fixed", k=4)
    with live(host, max_queue=16) as srv:
        yield srv
    host.shutdown()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from test_server import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-llama-structured")))


def streamed(client, **kw) -> tuple[str, list[dict], str]:
    """(content, tool calls, finish reason) of a streamed chat completion, deltas accumulated as clients do."""
    content, calls, finish = "", {}, None
    for c in client.chat.completions.create(stream=True, **kw):
        if not c.choices:
            continue
        d = c.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            slot = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            slot["name"] += tc.function.name or ""
            slot["arguments"] += tc.function.arguments or ""
        finish = c.choices[0].finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


def test_json_schema_round_trip_streamed_and_not(server):
    client = server.client()
    fmt = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}}
    kw = dict(model=None, messages=MSGS, temperature=0, max_tokens=120, response_format=fmt)
    full = client.chat.completions.create(**kw)
    text = full.choices[0].message.content
    assert full.choices[0].finish_reason == "stop"
    value = json.loads(text)
    assert set(value) == {"name", "size", "kind"} and value["kind"] in ("fruit", "tool", "animal")
    assert len(value["name"]) <= 6 and 0 <= value["size"] <= 99
    content, calls, finish = streamed(client, **kw)
    assert (content, calls, finish) == (text, [], "stop")
    assert full.model_extra["speculation"]["steps"] >= 1


def test_json_object_and_sampling(server):
    client = server.client()
    for temperature in (0, 1.0):
        r = client.chat.completions.create(model=None, messages=MSGS, temperature=temperature, seed=1, max_tokens=200,
                                           response_format={"type": "json_object"})
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(r.choices[0].message.content), dict)
        else:  # the token budget ran out inside the object: documented as "length", never presented as complete
            assert r.choices[0].finish_reason == "length"
            assert r.choices[0].message.content.startswith("{")


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_forced_tool_calls_round_trip(server, choice):
    client = server.client()
    kw = dict(model=None, messages=MSGS, temperature=0, max_tokens=120, tools=TOOLS, tool_choice=choice,
              parallel_tool_calls=False)
    full = client.chat.completions.create(**kw)
    msg = full.choices[0].message
    assert full.choices[0].finish_reason == "tool_calls"
    assert len(msg.tool_calls) == 1 and msg.tool_calls[0].type == "function"
    call = msg.tool_calls[0].function
    if isinstance(choice, dict):
        assert call.name == "add"
    assert call.name in ("get_weather", "add")
    args = json.loads(call.arguments)
    assert set(args) == ({"a", "b"} if call.name == "add" else {"city"})
    content, calls, finish = streamed(client, **kw)
    assert finish == "tool_calls" and not content
    assert calls == [{"name": call.name, "arguments": call.arguments}]


def test_tool_call_history_is_rendered(server):
    """An assistant message with earlier tool calls and a tool result are accepted (rendered by the template)."""
    client = server.client()
    history = MSGS + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"}]
    r = client.chat.completions.create(model=None, messages=history, temperature=0, max_tokens=8, tools=TOOLS)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


@pytest.mark.parametrize("kw, needle", [
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}),
     "objectx"),
    (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "nope"),
    (dict(tools=[{"type": "function", "function": {"name": "bad name!"}}]), "tools[0].function.name"),
    (dict(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}), "cannot be combined"),
])
def test_bad_structured_requests_are_400_naming_the_problem(server, kw, needle):
    with pytest.raises(openai.BadRequestError) as e:
        server.client().chat.completions.create(model=None, messages=MSGS, max_tokens=4, **kw)
    assert needle in str(e.value)


# Batched (--max-batch > 1) ----------------------------------------------------------------------------------------
BATCH_BODIES = [
    dict(messages=MSGS, max_tokens=120, response_format={"type": "json_schema", "json_schema": {
        "name": "thing", "schema": SCHEMA, "strict": True}}),
    dict(messages=MSGS, max_tokens=120, tools=TOOLS, tool_choice="required", parallel_tool_calls=False),
    dict(messages=MSGS, max_tokens=24),
    dict(messages=[{"role": "user", "content": "Describe a cat."}], max_tokens=60,
         response_format={"type": "json_object"}),
    dict(messages=MSGS, max_tokens=120, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}}),
    dict(messages=[{"role": "user", "content": "Hello there."}], max_tokens=30, tools=TOOLS),
]


def _chats(url: str, bodies: list[dict], together: bool) -> list[tuple[int, dict]]:
    """Each body's (status, first choice) from /v1/chat/completions, sent all at once or one after another."""
    import asyncio

    import httpx

    async def run():
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            async def ask(body):
                r = await http.post("/v1/chat/completions", json={"temperature": 0, **body})
                return r.status_code, (r.json()["choices"][0] if r.status_code == 200 else r.json())
            if together:
                return await asyncio.gather(*(ask(b) for b in bodies))
            return [await ask(b) for b in bodies]

    return asyncio.run(run())


def test_batched_structured_requests_equal_their_solo_answers(server, tiny):
    """A server with --max-batch 3 decodes structured requests (a schema, forced and named tool calls, any JSON
    object) beside free ones, six at once: each answer equals the one request's answer from the server that runs
    one request at a time; a bad schema is still a 400 naming it."""
    from test_server import scrape, value

    from adaspec.server.runtime import ModelHost

    solo = _chats(server.url, BATCH_BODIES, together=False)
    host = ModelHost.load(tiny, "ngram", controller="fixed", k=4, dtype="float32", threads=1, progress=False,
                          max_batch=3)
    try:
        with live(host, max_queue=16) as srv:
            before = scrape(srv.url)
            got = _chats(srv.url, BATCH_BODIES, together=True)
            after = scrape(srv.url)
            with pytest.raises(openai.BadRequestError, match="objectx"):
                srv.client().chat.completions.create(model=None, messages=MSGS, max_tokens=4, response_format={
                    "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}})
            content, calls, finish = streamed(srv.client(), model=None, temperature=0, **BATCH_BODIES[1])
    finally:
        host.shutdown()
    assert [code for code, _ in solo] == [200] * len(BATCH_BODIES)
    def answer(choice: dict) -> tuple:  # the message without the calls' random ids
        msg = choice["message"]
        calls = [c["function"] for c in msg.get("tool_calls") or []]
        return msg.get("content"), calls, choice["finish_reason"]

    assert [answer(c) for _, c in got] == [answer(c) for _, c in solo]
    assert got[1][1]["finish_reason"] == "tool_calls" and got[4][1]["message"]["tool_calls"][0]["function"][
        "name"] == "add"
    assert finish == "tool_calls" and calls == [{"name": f["function"]["name"], "arguments": f["function"][
        "arguments"]} for f in got[1][1]["message"]["tool_calls"]]
    together = [int(dict(lab)["batch_size"]) for (n, lab), v in after.items()
                if n == "adaspec:batch_steps_total" and v > value(before, n, **dict(lab))]
    assert max(together) >= 2  # the rows really decoded together


# Parsing the model's tool calls (tool_choice "auto") -----------------------------------------------------------
def test_parse_tool_calls():
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "Let me check."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"})]
    assert parse_tool_calls("no calls <tool_call>{broken</tool_call>") == (
        "no calls <tool_call>{broken</tool_call>", [])


def test_tool_call_stream_holds_back_a_partial_tag():
    s = ToolCallStream()
    pieces = ["Hi <tool", "_call>\n", '{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_', "call>\n"]
    content, calls = "", []
    for p in pieces:
        content += s.feed(p)
        calls += s.calls()
    rest, last = s.finish()
    assert content + rest == "Hi " and len(calls + last) == 1
    assert json.loads((calls + last)[0]["function"]["arguments"]) == {"a": 1, "b": 2}


def _stream(pieces, stream_arguments=True):
    """Feed ``pieces`` to a ToolCallStream: (content, the deltas of each feed, the finish's content and deltas)."""
    s = ToolCallStream(stream_arguments=stream_arguments)
    content, per_feed = "", []
    for p in pieces:
        content += s.feed(p)
        per_feed.append(s.calls())
    rest, last = s.finish()
    return content + rest, per_feed, last


def _joined(deltas):
    """Deltas accumulated per index, as an OpenAI client does: {index: (name, arguments)}."""
    out = {}
    for d in deltas:
        name, args = out.get(d["index"], ("", ""))
        out[d["index"]] = (name + (d["function"].get("name") or ""), args + d["function"]["arguments"])
    return out


def test_tool_call_arguments_stream_as_they_are_written():
    args = '{"text": "a } and a \\" and {x}", "n": [1, {"k": "]"}], "ok": true}'
    text = 'Sure.\n<tool_call>\n{"name": "translate", "arguments": ' + args + '}\n</tool_call>'
    content, per_feed, last = _stream(list(text))  # one character at a time
    flat = [d for ds in per_feed for d in ds] + last
    assert content == "Sure.\n" and not last
    first = next(i for i, ds in enumerate(per_feed) if ds)
    assert per_feed[first][0]["function"] == {"name": "translate", "arguments": "{"}  # the name once complete
    assert per_feed[first][0]["id"].startswith("call_") and per_feed[first][0]["type"] == "function"
    assert first == text.index(args)  # announced when the arguments object opens, not when the call closes
    assert sum(1 for ds in per_feed if ds) == len(args)  # then every character of the arguments as it came
    assert _joined(flat) == {0: ("translate", args)}
    assert parse_tool_calls(text)[1][0]["function"]["arguments"] == args  # the same text as the answer unstreamed


def test_the_unstreamed_answer_reads_the_calls_as_the_stream_does():
    """Under a grammar the unstreamed answer is read as the stream reads it (parse_calls), so both give the same
    calls, even where the regex of parse_tool_calls would stop early (a closing tag inside a string)."""
    args = '{"text": "see </tool_call> here", "n": 2}'
    text = '<tool_call>\n{"name": "translate", "arguments": ' + args + '}\n</tool_call>'
    content, per_feed, last = _stream([text[i:i + 5] for i in range(0, len(text), 5)])
    streamed = _joined([d for ds in per_feed for d in ds] + last)
    whole_content, calls = parse_calls(text)
    assert streamed == {0: ("translate", args)} and not content and whole_content is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [("translate", args)]
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    assert parse_tool_calls(text)[1] == []  # the unconstrained reading stops at the first tag
    cut = '<tool_call>\n{"name": "add", "arguments": {"a": 1'
    assert parse_calls(cut)[1][0]["function"] == {"name": "add", "arguments": '{"a": 1'}  # kept, as streamed
    assert parse_calls("no call here") == ("no call here", [])


def test_unconstrained_calls_are_sent_whole_and_only_when_valid():
    """Without a grammar a call may be malformed: it is sent whole when it closes and parses, else it is content,
    as the unstreamed answer reads it."""
    good = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    content, per_feed, last = _stream(list(good), stream_arguments=False)
    assert [i for i, ds in enumerate(per_feed) if ds] == [len(good) - 1] and not content
    bad = '<tool_call>\n{"name": "add", "arguments": {"a": tru}}\n</tool_call>'
    content, per_feed, last = _stream(list(bad), stream_arguments=False)
    assert not any(per_feed) and not last and content == bad
    assert parse_tool_calls(bad) == (bad, [])


def test_tool_calls_streamed_in_chunks_keep_their_indices():
    one = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    two = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    text = one + "\n" + two
    for size in (1, 3, 7, 40, len(text)):
        content, per_feed, last = _stream([text[i:i + size] for i in range(0, len(text), size)])
        assert content == "" and not last
        assert all(len({d["index"] for d in ds}) == len(ds) for ds in per_feed)  # one delta per call and feed
        assert _joined([d for ds in per_feed for d in ds]) == {0: ("add", '{"a": 1, "b": 2}'),
                                                              1: ("get_weather", '{"city": "Paris"}')}


def test_a_call_in_another_shape_is_sent_whole_when_it_closes():
    text = '<tool_call>\n{"arguments": {"a": 1, "b": 2}, "name": "add"}\n</tool_call>'
    content, per_feed, last = _stream(list(text))
    assert content == "" and not last
    assert [i for i, ds in enumerate(per_feed) if ds] == [len(text) - 1]  # nothing before the closing tag
    (call,) = per_feed[-1]
    assert call["function"]["name"] == "add" and json.loads(call["function"]["arguments"]) == {"a": 1, "b": 2}


def test_an_announced_call_cut_short_stays_sent_and_leaves_no_content():
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b'
    content, per_feed, last = _stream([text[:30], text[30:]])
    assert content == "" and last == []
    assert _joined([d for ds in per_feed for d in ds]) == {0: ("add", '{"a": 1, "b')}
    unannounced = '<tool_call>\n{"name": "ad'  # never announced: its text is content, as before
    assert _stream([unannounced])[0] == unannounced


def test_plan_tools_modes():
    assert plan_tools(None, None, None) is None
    assert plan_tools(TOOLS, "none", None).template_tools is None
    assert plan_tools(TOOLS, None, None).mode == "auto" and plan_tools(TOOLS, "auto", None).constraint() is None
    lazy = plan_tools(TOOLS, "auto", True).lazy_constraint()  # free text until <tool_call>, then the calls
    assert lazy.trigger == "<tool_call>" and lazy.source.startswith('start: call ("\\n" call)*')
    assert plan_tools(TOOLS, "required", True).lazy_constraint() is None
    forced = plan_tools(TOOLS, "required", False).constraint()
    assert forced.kind == "lark" and '"get_weather"' in forced.source and '"add"' in forced.source


@pytest.mark.parametrize("calls", [[[1, 2]], ["call"], [{"function": "f"}], [None]])
def test_malformed_tool_call_history_is_a_clear_error(calls):
    # Found by the schemathesis fuzz: a tool_calls item that is not an object ended in a 500 (AttributeError).
    from adaspec.errors import ConfigError
    from adaspec.toolcalls import template_message

    with pytest.raises(ConfigError, match=r"tool_calls\[0\] must be an object with a 'function' object"):
        template_message({"role": "assistant", "content": None, "tool_calls": calls})
