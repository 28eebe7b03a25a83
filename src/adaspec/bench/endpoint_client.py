"""One streamed request to an OpenAI-compatible server, timed and read on the client: :func:`send` returns a
:class:`RequestResult` (TTFT, end-to-end time, chunk arrival times, completion tokens, per-response draft counters,
the answer's text and tool calls); :func:`scrape` reads the server's ``/metrics``."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx

from adaspec.bench import engine_metrics
from adaspec.errors import AdaspecError, ConfigError


class EndpointError(AdaspecError):
    """An endpoint cannot be measured: unreachable, not OpenAI-compatible, or refusing the benchmark's requests."""


@dataclass
class Arm:
    """One side of the comparison: a server base URL (``http://host:port``) and extra request fields."""

    name: str
    url: str
    body: dict = field(default_factory=dict)


def base_url(url: str) -> str:
    """``http://host:port`` from a URL given with or without ``/v1`` (raises ConfigError for a non-HTTP URL)."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"endpoint {url!r} is not an http:// or https:// URL")
    try:
        parsed = httpx.URL(url)
        _ = parsed.port
    except (httpx.InvalidURL, ValueError) as e:
        raise ConfigError(f"endpoint {url!r} is not a valid URL ({e})") from None
    if not parsed.host:
        raise ConfigError(f"endpoint {url!r} has no host")
    return url.removesuffix("/v1")


@dataclass
class RequestResult:
    """One request as the client saw it. Times in seconds from sending the request; ``chunks`` are the arrival
    times of content chunks; ``tokens`` the completion tokens (``usage`` or, failing that, content chunks)."""

    prompt_id: str
    ok: bool = False
    status: int | None = None
    error: str | None = None
    start_s: float = 0.0
    late_s: float = 0.0
    ttft_s: float | None = None
    e2e_s: float | None = None
    tokens: int = 0
    tokens_from_usage: bool = False
    finish_reason: str | None = None
    chunks: list[float] = field(default_factory=list)
    draft_n: int | None = None
    draft_accepted: int | None = None
    draft_steps: int | None = None
    accept_hist: list[int] | None = None
    text: str = ""  # the answer's content
    calls: dict[int, dict] = field(default_factory=dict)  # its tool calls by index: {"name", "arguments"} (text)


def _error_text(response: httpx.Response) -> str:
    try:
        obj = response.json()
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        msg = err.get("message", err) if isinstance(err, dict) else err
        return f"HTTP {response.status_code}: {str(msg)[:200]}"
    except ValueError:
        return f"HTTP {response.status_code}: {response.text[:200]!r}"


def send(client: httpx.Client, arm: Arm, api: str, body: dict, prompt_id: str, timeout_s: float) -> RequestResult:
    """Send one streamed completion and time it. Never raises for a server's fault: the result says what failed."""
    res = RequestResult(prompt_id)
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    t0 = time.monotonic()
    try:
        with client.stream("POST", arm.url + path, json={**body, **arm.body}, timeout=timeout_s) as r:
            res.status = r.status_code
            if r.status_code != 200:
                r.read()
                res.error = _error_text(r)
                return res
            if "text/event-stream" not in r.headers.get("content-type", ""):
                r.read()  # a server that ignored "stream": one JSON answer
                _read_object(res, _json(r.text), api, time.monotonic() - t0, whole=True)
                if res.error:
                    return res
            else:
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    _read_object(res, _json(data), api, time.monotonic() - t0)
                    if res.error:
                        return res
    except httpx.TimeoutException:
        res.error = f"timed out after {timeout_s:g} s"
        return res
    except httpx.HTTPError as e:
        res.error = f"{type(e).__name__}: {e}"
        return res
    except ValueError as e:
        res.error = str(e)
        return res
    except Exception as e:  # anything odd in a reply is that request's failure, never the client thread's death
        res.error = f"unreadable response ({type(e).__name__}: {e})"
        return res
    res.e2e_s = time.monotonic() - t0
    if not res.chunks and res.finish_reason is None and not res.tokens_from_usage:
        res.error = "the stream ended without a completion chunk (closed or interrupted by the server)"
        return res
    res.ttft_s = res.chunks[0] if res.chunks else res.e2e_s
    if not res.tokens_from_usage:
        res.tokens = len(res.chunks)
    res.ok = True
    return res


def _json(text: str) -> dict:
    try:
        obj = json.loads(text)
    except ValueError:
        raise ValueError(f"not an OpenAI response: {text[:120]!r}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"not an OpenAI response: {text[:120]!r}")
    return obj


def _read_object(res: RequestResult, obj: dict, api: str, at_s: float, whole: bool = False) -> None:
    if obj.get("error"):
        err = obj["error"]
        res.error = "server error: " + str(err.get("message", err) if isinstance(err, dict) else err)
        return
    choices = obj.get("choices")
    for choice in choices if isinstance(choices, list) else []:
        if not isinstance(choice, dict):
            continue
        if api == "chat":  # reasoning models stream their thinking first (vLLM: reasoning_content / reasoning)
            message = (choice.get("message") if whole else choice.get("delta")) or {}
            piece = (message.get("content") or message.get("reasoning_content") or message.get("reasoning")
                     if isinstance(message, dict) else None)
            if isinstance(message, dict):
                _read_answer(res, message)
                piece = piece or message.get("tool_calls")  # a tool call's delta is output too
        else:
            piece = choice.get("text")
        if piece:
            res.chunks.append(at_s)
        res.finish_reason = choice.get("finish_reason") or res.finish_reason
    usage = obj.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        res.tokens, res.tokens_from_usage = usage["completion_tokens"], True
    timings = obj.get("timings")  # llama.cpp's llama-server
    if isinstance(timings, dict) and isinstance(timings.get("draft_n"), int):
        res.draft_n = timings["draft_n"]
        accepted = timings.get("draft_n_accepted")
        res.draft_accepted = accepted if isinstance(accepted, int) else 0
    metrics = obj.get("metrics")  # vLLM >= 0.32 with --per-request-spec-decode-metrics summary
    sd = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if isinstance(sd, dict) and isinstance(sd.get("num_draft_tokens"), int):
        res.draft_n, res.draft_accepted = sd["num_draft_tokens"], int(sd.get("num_accepted_draft_tokens") or 0)
        res.draft_steps = sd.get("num_spec_steps") if isinstance(sd.get("num_spec_steps"), int) else None
        hist = sd.get("acceptance_histogram")
        res.accept_hist = hist if isinstance(hist, list) and all(isinstance(h, int) for h in hist) else None


def _read_answer(res: RequestResult, message: dict) -> None:
    """Accumulate a chat message's (or delta's) content and tool calls into ``res`` (OpenAI's streamed form: the
    name and arguments of call ``index`` arrive in pieces)."""
    if isinstance(message.get("content"), str):
        res.text += message["content"]
    calls = message.get("tool_calls")
    for i, call in enumerate(calls if isinstance(calls, list) else []):
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            continue
        slot = res.calls.setdefault(call.get("index", i) if isinstance(call.get("index", i), int) else i,
                                    {"name": "", "arguments": ""})
        for key in ("name", "arguments"):
            if isinstance(call["function"].get(key), str):
                slot[key] += call["function"][key]


def scrape(client: httpx.Client, arm: Arm) -> tuple[engine_metrics.SpecSnapshot | None, str | None]:
    """The arm's ``/metrics`` parsed, or (None, why not)."""
    try:
        r = client.get(arm.url + "/metrics", timeout=15)
    except httpx.HTTPError as e:
        return None, f"/metrics unreachable ({type(e).__name__})"
    if r.status_code != 200:
        return None, f"no /metrics (HTTP {r.status_code})"
    try:
        return engine_metrics.parse(r.text), None
    except engine_metrics.MetricsFormatError as e:
        return None, f"/metrics is {e}"
    except (ValueError, TypeError) as e:
        return None, f"/metrics has values adaspec cannot read ({e})"
