"""``adaspec bench --endpoint URL``: measure any OpenAI-compatible server with speculation on and off.

The client sends a workload's prompts as streamed chat (or text) completions, at set client concurrencies (closed
loop: each client sends its next request when the last one is answered) or at set arrival rates (open loop:
Poisson arrivals, seeded), to two *arms*: the speculative endpoint and a baseline (``--baseline URL``, or the same
URL with other request fields, e.g. ``{"speculation": {"drafter": "none"}}`` for ``adaspec serve``). Arms alternate
within each load level and round, so drift on a shared machine hits both.

Per request, from the stream (client clock): TTFT (request sent → first content chunk), end-to-end latency, TPOT
((e2e − TTFT) / (tokens − 1)), inter-token latency (gaps between content chunks; a speculative server may send
several tokens per chunk), completion tokens (``usage`` when the server reports it, else content chunks). Per
configuration: throughput (output tokens / wall time), request rate, decode rate (Σ (tokens − 1) / Σ (e2e − TTFT)),
percentiles, and goodput (requests per second meeting the TTFT and TPOT objectives, as DistServe, Zhong et al.
2024, defines it) when objectives are given. The server's ``/metrics`` is scraped before and after each
configuration for speculative-decoding counters (:mod:`adaspec.bench.engine_metrics`); llama-server's per-response
``timings.draft_n`` / ``draft_n_accepted`` and vLLM's per-request ``metrics.speculative_decoding`` (drafted and
accepted tokens, steps, acceptance histogram; vLLM >= 0.32 started with ``--per-request-spec-decode-metrics
summary``) are summed when present. A server without ``/metrics`` gives a labelled
partial result: latency without acceptance.

The workload ``structured`` (:mod:`adaspec.structured_workload`, chat only) sends each task with its constraint
(``response_format`` with the task's strict JSON schema, or its tool with ``tool_choice: "required"``), so vLLM's,
llama.cpp's and adaspec's structured output are measured alike; each configuration's row then carries
``structured``: the schema-valid share of the answers and the mean share of expected fields exactly right.

Results: one JSON line per configuration (``kind: "endpoint"``) after a ``meta`` line, appended and keyed like
``adaspec bench``'s, so a killed run resumes and ``adaspec map`` / ``adaspec advise`` read them. Loops are bounded:
a request count per configuration, a per-request timeout and an overall time limit.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from adaspec.bench import engine_metrics
from adaspec.errors import AdaspecError, ConfigError


STRUCTURED = "structured"  # the structured-output workload (adaspec.structured_workload)


class EndpointError(AdaspecError):
    """An endpoint cannot be measured: unreachable, not OpenAI-compatible, or refusing the benchmark's requests."""


@dataclass
class Arm:
    """One side of the comparison: a server base URL (``http://host:port``) and extra request fields."""

    name: str
    url: str
    body: dict = field(default_factory=dict)


@dataclass
class EndpointConfig:
    """What ``adaspec bench --endpoint`` measures (the CLI's flags, one field each).

    Times are seconds unless named ``_ms``; ``rates`` are requests per second (open loop); ``requests`` is the
    number sent per configuration (default: the prompt count, at least 2 per client).
    """

    url: str
    baseline: str | None = None
    body: dict = field(default_factory=dict)
    baseline_body: dict | None = None
    model: str | None = None
    api: str = "chat"
    workload: str = "humaneval"
    prompts: int = 8
    max_tokens: int = 128
    temperature: float = 0.0
    concurrency: list[int] = field(default_factory=lambda: [1])
    rates: list[float] = field(default_factory=list)
    requests: int | None = None
    rounds: int = 1
    seed: int = 0
    api_key: str | None = None
    timeout_s: float = 300.0
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    max_inflight: int = 64
    warmup: int = 1
    stream_usage: bool = True  # ask for usage in the stream; turned off for a server that refuses stream_options

    def arms(self) -> list[Arm]:
        """The speculative arm, then the baseline arm when one is configured."""
        arms = [Arm("speculative", base_url(self.url), dict(self.body))]
        if self.baseline or self.baseline_body is not None:
            arms.append(Arm("baseline", base_url(self.baseline or self.url), dict(self.baseline_body or {})))
        return arms

    def validate(self) -> None:
        """Raises ConfigError naming the first bad setting."""
        if self.api not in ("chat", "completions"):
            raise ConfigError(f"--api must be chat or completions, not {self.api!r}")
        if not self.concurrency and not self.rates:
            raise ConfigError("give at least one --concurrency or --rate")
        if any(not isinstance(c, int) or c < 1 or c > 1024 for c in self.concurrency):
            raise ConfigError(f"--concurrency values must be whole numbers 1..1024, not {self.concurrency}")
        if any(not math.isfinite(r) or r <= 0 for r in self.rates):
            raise ConfigError(f"--rate values must be finite and > 0 requests/s, not {self.rates}")
        self.concurrency = list(dict.fromkeys(self.concurrency))  # a level given twice is measured once
        self.rates = list(dict.fromkeys(self.rates))
        if self.requests is not None and not 1 <= self.requests <= 100_000:
            raise ConfigError(f"--requests must be 1..100000, not {self.requests}")
        if self.max_tokens < 1 or self.rounds < 1 or self.prompts < 1:
            raise ConfigError("--max-tokens, --rounds and --prompts must be >= 1")
        if self.timeout_s <= 0:
            raise ConfigError("--request-timeout must be > 0 seconds")
        if self.workload == STRUCTURED and self.api != "chat":
            raise ConfigError("the structured workload needs --api chat (response_format and tools are chat fields)")


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


def structured_summary(prompts: Sequence, results: Sequence[RequestResult]) -> dict:
    """``{"answers", "valid", "exact_fields"}`` of a configuration's answered requests on the structured workload:
    the schema-valid share and the mean share of expected fields exactly right
    (:func:`~adaspec.structured_workload.score_message`)."""
    from adaspec.structured_workload import score_message

    tasks = {p.id: p for p in prompts}
    graded = [score_message(tasks[r.prompt_id], r.text, [r.calls[i] for i in sorted(r.calls)], r.finish_reason)
              for r in results if r.ok and r.prompt_id in tasks]
    n = len(graded)
    return {"answers": n, "valid": round(sum(g["valid"] for g in graded) / n, 4) if n else None,
            "exact_fields": round(sum(g["exact"] for g in graded) / n, 4) if n else None}


# ----------------------------------------------------------------------------------------------------------------
# Load generation
# ----------------------------------------------------------------------------------------------------------------


def request_body(cfg: EndpointConfig, model: str, prompt) -> dict:
    """The OpenAI request for one workload prompt (greedy when temperature is 0)."""
    body = {"model": model, "max_tokens": cfg.max_tokens, "temperature": cfg.temperature, "stream": True,
            "seed": cfg.seed}
    if cfg.stream_usage:
        body["stream_options"] = {"include_usage": True}
    if cfg.api == "chat":
        body["messages"] = list(prompt.messages) if prompt.messages else [{"role": "user", "content": prompt.text}]
        if hasattr(prompt, "request_fields"):  # a structured task: its schema or its forced tool call
            body.update(prompt.request_fields())
    else:
        body["prompt"] = prompt.as_text()
    return body


def closed_loop(call: Callable[[int], RequestResult], n: int, concurrency: int, deadline: float
                ) -> list[RequestResult]:
    """``concurrency`` clients, each sending its next request when its last is answered, ``n`` requests in all
    (fewer if ``deadline``, a ``time.monotonic()`` value, passes)."""
    lock, counter, results = threading.Lock(), iter(range(n)), []

    def client() -> None:
        while time.monotonic() < deadline:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            r = call(i)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def open_loop(call: Callable[[int], RequestResult], n: int, rate: float, seed: int, deadline: float,
              max_inflight: int) -> list[RequestResult]:
    """Poisson arrivals at ``rate`` requests/s (seeded exponential gaps), ``n`` requests, at most ``max_inflight``
    in flight; each result's ``late_s`` is how long it waited for a free client slot after its arrival."""
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(rate)
        arrivals.append(t)
    t0 = time.monotonic()

    def timed(i: int) -> RequestResult:
        late = time.monotonic() - (t0 + arrivals[i])
        r = call(i)
        r.late_s = max(late, 0.0)
        return r

    futures = []
    with ThreadPoolExecutor(max_workers=max_inflight) as pool:
        for i, at in enumerate(arrivals):
            wait = t0 + at - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if time.monotonic() >= deadline:
                break
            futures.append(pool.submit(timed, i))
    return [f.result() for f in futures]


# ----------------------------------------------------------------------------------------------------------------
# Aggregation
# ----------------------------------------------------------------------------------------------------------------


def _dist(values: Sequence[float], scale: float = 1e3) -> dict | None:
    """mean / p50 / p95 / p99 of ``values`` (seconds) in ms, or None when empty."""
    if not values:
        return None
    v = sorted(x * scale for x in values)

    def q(p: float) -> float:
        return v[min(len(v) - 1, max(0, round(p * (len(v) - 1))))]

    return {"mean": round(statistics.fmean(v), 3), "p50": round(q(0.5), 3), "p95": round(q(0.95), 3),
            "p99": round(q(0.99), 3)}


def summarise(results: Sequence[RequestResult], wall_s: float, *, slo_ttft_ms: float | None = None,
              slo_tpot_ms: float | None = None) -> dict:
    """Aggregate one configuration's requests (see the module docstring for each field)."""
    ok = [r for r in results if r.ok]
    tpots = [(r.e2e_s - r.ttft_s) / (r.tokens - 1) for r in ok if r.tokens > 1]
    itls = [b - a for r in ok for a, b in zip(r.chunks, r.chunks[1:])]
    decode_s = sum(r.e2e_s - r.ttft_s for r in ok if r.tokens > 1)
    decode_tokens = sum(r.tokens - 1 for r in ok if r.tokens > 1)
    tokens = sum(r.tokens for r in ok)
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            errors[r.error or "failed"] = errors.get(r.error or "failed", 0) + 1
    out = {"completed": len(ok), "failed": len(results) - len(ok), "errors": dict(list(errors.items())[:5]),
           "wall_s": round(wall_s, 6), "output_tokens": tokens,
           "tokens_counted": "usage" if ok and all(r.tokens_from_usage for r in ok) else "chunks",
           "throughput_tok_s": round(tokens / wall_s, 3) if wall_s > 0 else None,
           "request_rate": round(len(ok) / wall_s, 4) if wall_s > 0 else None,
           "decode_tok_s": round(decode_tokens / decode_s, 3) if decode_s > 0 else None,
           "ttft_ms": _dist([r.ttft_s for r in ok]), "tpot_ms": _dist(tpots), "itl_ms": _dist(itls),
           "e2e_ms": _dist([r.e2e_s for r in ok]), "late_ms": _dist([r.late_s for r in results])}
    if slo_ttft_ms is not None or slo_tpot_ms is not None:
        def meets(r: RequestResult) -> bool:
            tpot = (r.e2e_s - r.ttft_s) / (r.tokens - 1) if r.tokens > 1 else 0.0
            return ((slo_ttft_ms is None or r.ttft_s * 1e3 <= slo_ttft_ms)
                    and (slo_tpot_ms is None or tpot * 1e3 <= slo_tpot_ms))
        good = sum(1 for r in ok if meets(r))
        out["goodput"] = {"slo_ttft_ms": slo_ttft_ms, "slo_tpot_ms": slo_tpot_ms, "requests": good,
                          "req_s": round(good / wall_s, 4) if wall_s > 0 else None}
    drafted = [r for r in ok if r.draft_n is not None]
    if drafted:
        n = sum(r.draft_n for r in drafted)
        a = sum(r.draft_accepted for r in drafted)
        out["response_timings"] = {"draft_tokens": n, "accepted": a,
                                   "acceptance_rate": round(a / n, 4) if n else None}
        if all(r.draft_steps is not None for r in drafted):  # vLLM's per-request numbers: steps and histogram
            out["response_timings"]["drafts"] = sum(r.draft_steps for r in drafted)
        hists = [r.accept_hist for r in drafted if r.accept_hist]
        if hists and len(hists) == len(drafted):
            # histogram[j] = steps that accepted exactly j draft tokens, so position i was accepted Σ_{j>i} times
            width = max(len(h) for h in hists)
            out["response_timings"]["accepted_per_pos"] = [sum(sum(h[i + 1:]) for h in hists)
                                                          for i in range(width - 1)]
    out["requests_detail"] = [[r.prompt_id, r.ok, r.tokens, _ms(r.ttft_s), _ms(r.e2e_s)] for r in results]
    return out


def _ms(s: float | None) -> float | None:
    return None if s is None else round(s * 1e3, 2)


# ----------------------------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------------------------


def _key(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


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


def probe(client: httpx.Client, arm: Arm, cfg: EndpointConfig) -> str:
    """Check the arm is an OpenAI-compatible server and return the model name to request.

    Raises:
        EndpointError: unreachable, not OpenAI-compatible, or a one-token request fails (the message says which).
    """
    try:
        r = client.get(arm.url + "/v1/models", timeout=15)
    except (httpx.HTTPError, httpx.InvalidURL) as e:
        raise EndpointError(f"cannot reach {arm.url} ({arm.name} arm): {type(e).__name__}: {e}") from None
    model = cfg.model
    if model is None:
        try:
            data = r.json().get("data") if r.status_code == 200 else None
            model = data[0]["id"] if data else None
        except (ValueError, AttributeError, KeyError, IndexError, TypeError):
            model = None
        if model is None:
            raise EndpointError(f"{arm.url} is not an OpenAI-compatible server: GET /v1/models answered "
                                f"HTTP {r.status_code} without a model list (give --model if it has no such route)")
    return model


def run_endpoint_bench(cfg: EndpointConfig, out: Path, *, log: Callable[[str], None] = print,
                       time_limit_s: float | None = None, argv: Sequence[str] = ()) -> dict:
    """Measure every (round, load, arm) configuration not yet in ``out``. Returns ``run`` (configurations measured
    now), ``done`` (found in ``out``), ``stopped`` (the time limit cut the run) and ``key`` (the run's key: rows of
    this configuration carry it as ``run``).

    Raises:
        ConfigError: bad settings. EndpointError: an arm cannot be measured at all (checked before any timing).
    """
    from adaspec.workloads import load_workload

    cfg.validate()
    arms = cfg.arms()
    if cfg.workload == STRUCTURED:
        from adaspec.structured_workload import load_tasks

        prompts = load_tasks(cfg.prompts)
    else:
        prompts = load_workload(cfg.workload, limit=cfg.prompts)[:cfg.prompts]
    start = time.monotonic()
    deadline = start + time_limit_s if time_limit_s else float("inf")
    out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if out.exists():
        for line in out.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a line cut by a kill: rerun that configuration
            if isinstance(row, dict) and row.get("kind") in ("meta", "endpoint"):
                done.add(row.get("key"))
    with httpx.Client(limits=httpx.Limits(max_connections=max(cfg.max_inflight, max(cfg.concurrency, default=1)) + 4),
                      headers={"authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else None) as client:
        models = {arm.name: probe(client, arm, cfg) for arm in arms}
        for arm in arms:  # one short request each: the route works and the server is warm
            for _ in range(cfg.warmup):
                body = {**request_body(cfg, models[arm.name], prompts[0]), "max_tokens": min(cfg.max_tokens, 8)}
                r = send(client, arm, cfg.api, body, prompts[0].id, cfg.timeout_s)
                if not r.ok and r.status in (400, 422) and cfg.stream_usage:  # an older server: no stream_options
                    body.pop("stream_options", None)
                    r = send(client, arm, cfg.api, body, prompts[0].id, cfg.timeout_s)
                    cfg.stream_usage = not r.ok
                if not r.ok:
                    raise EndpointError(f"{arm.url} ({arm.name} arm) failed a one-request check: {r.error}")
        meta_fields = {k: v for k, v in asdict(cfg).items() if k != "api_key"}
        run = _key(meta_fields)
        with out.open("a") as f:
            if run not in done:
                f.write(json.dumps({"kind": "meta", "key": run, "run": run, "config": meta_fields, "models": models,
                                    "argv": list(argv), "client": {"platform": platform.platform(),
                                                                   "python": sys.version.split()[0]},
                                    "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")
                f.flush()
            loads = [("closed", c) for c in cfg.concurrency] + [("open", r) for r in cfg.rates]
            measured, skipped, stopped = 0, 0, False
            for rnd in range(cfg.rounds):
                for load, level in loads:
                    order = arms if (rnd + loads.index((load, level))) % 2 == 0 else arms[::-1]
                    for arm in order:
                        n = cfg.requests or max(len(prompts), 2 * int(level) if load == "closed" else 8)
                        fields = {"arm": arm.name, "url": arm.url, "body": arm.body, "model": models[arm.name],
                                  "api": cfg.api, "workload": cfg.workload, "prompts": len(prompts),
                                  "max_tokens": cfg.max_tokens, "temperature": cfg.temperature, "load": load,
                                  "concurrency": level if load == "closed" else None,
                                  "rate": level if load == "open" else None, "requests": n, "round": rnd,
                                  "seed": cfg.seed}
                        key = _key({**fields, "run": run})  # the same command resumes; a changed one re-measures
                        if key in done:
                            skipped += 1
                            continue
                        if time.monotonic() >= deadline:
                            stopped = True
                            break
                        row = measure(client, arm, cfg, prompts, models[arm.name], load, level, n, deadline)
                        if row["completed"] + row["failed"] < n:  # the time limit cut it: kept, not resumable
                            f.write(json.dumps({"kind": "endpoint_partial", "run": run, **fields, **row}) + "\n")
                            log(f"{arm.name}: stopped at the time limit after {row['completed'] + row['failed']} of "
                                f"{n} requests (kept as endpoint_partial; rerun to measure it whole)")
                            stopped = True
                            break
                        f.write(json.dumps({"kind": "endpoint", "key": key, "run": run, **fields, **row}) + "\n")
                        f.flush()
                        done.add(key)
                        measured += 1
                        log(_line(arm, load, level, row))
                    if stopped:
                        break
                if stopped:
                    break
    return {"run": measured, "done": skipped, "stopped": stopped, "key": run}


def measure(client: httpx.Client, arm: Arm, cfg: EndpointConfig, prompts: list, model: str, load: str,
            level: float, n: int, deadline: float) -> dict:
    """One configuration: scrape, send ``n`` requests at the load level, scrape again, summarise."""
    before, _ = scrape(client, arm)
    bodies = [(p.id, request_body(cfg, model, p)) for p in prompts]

    def call(i: int) -> RequestResult:
        pid, body = bodies[i % len(bodies)]
        return send(client, arm, cfg.api, body, pid, cfg.timeout_s)

    t0 = time.monotonic()
    if load == "closed":
        results = closed_loop(call, n, int(level), deadline)
    else:
        results = open_loop(call, n, float(level), cfg.seed, deadline, cfg.max_inflight)
    wall = time.monotonic() - t0
    after, why = scrape(client, arm)
    row = summarise(results, wall, slo_ttft_ms=cfg.slo_ttft_ms, slo_tpot_ms=cfg.slo_tpot_ms)
    if cfg.workload == STRUCTURED:
        row["structured"] = structured_summary(prompts, results)
    spec = engine_metrics.spec_stats(before, after)
    if why:
        spec["note"] = why
    if spec["source"] == "none" and "response_timings" in row:
        rt = row["response_timings"]
        spec = {"source": "responses", "engine": "llama-server", "draft_tokens": rt["draft_tokens"],
                "accepted": rt["accepted"], "acceptance_rate": rt["acceptance_rate"],
                "note": f"{spec['note']}; acceptance summed from each response's timings.draft_n / "
                        "draft_n_accepted"}
    row["spec"] = spec
    return row


def _line(arm: Arm, load: str, level: float, row: dict) -> str:
    what = f"{level:g} clients" if load == "closed" else f"{level:g} req/s"
    spec = row["spec"]
    alpha = spec.get("acceptance_rate")
    tpot = (row["tpot_ms"] or {}).get("p50")
    return (f"{arm.name:>11} {what:>12}: {row['completed']} ok, {row['failed']} failed, "
            f"{row['throughput_tok_s'] or 0:.2f} tok/s, TPOT p50 {tpot if tpot is not None else float('nan'):.1f} ms"
            + (f", α {alpha:.3f}" if alpha is not None else f" ({spec.get('note', 'no acceptance data')})"))


def read_rows(paths: Sequence[Path]) -> list[dict]:
    """The ``endpoint`` and ``meta`` rows of results files (other kinds are skipped; a cut line is ignored)."""
    rows = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and row.get("kind") in ("endpoint", "meta"):
                rows.append(row)
    return rows


def is_endpoint_file(path: Path) -> bool:
    """True when a results file holds endpoint rows (``adaspec map`` routes it to the endpoint report)."""
    try:
        with Path(path).open() as f:
            for line in f:
                if '"kind": "endpoint"' in line:
                    return True
    except OSError:
        return False
    return False
