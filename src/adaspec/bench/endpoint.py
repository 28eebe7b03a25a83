"""``adaspec bench --endpoint URL``: measure any OpenAI-compatible server with speculation on and off.

The client sends a workload's prompts as streamed chat (or text) completions, at set client concurrencies (closed
loop: each client sends its next request when the last one is answered) or at set arrival rates (open loop:
Poisson arrivals, seeded), to two *arms*: the speculative endpoint and a baseline (``--baseline URL``, or the same
URL with other request fields, e.g. ``{"speculation": {"drafter": "none"}}`` for ``adaspec serve``). Arms alternate
within each load level and round, so drift on a shared machine hits both. With ``interleave`` (two servers only),
the one-client level alternates the arms request by request instead of block by block: each prompt is answered by
both arms seconds apart, so a slow spell of the machine that lasts tens of seconds (seen on the project's 2-vCPU
VMs, docs/findings/scaleout.md) hits a prompt's pair alike.

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

The workload ``structured`` (:mod:`adaspec.structured_workload`, chat only; ``structured:CATEGORY[,CATEGORY]`` for
some of its categories, e.g. ``structured:tool-translate``) sends each task with its constraint
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
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from adaspec.bench import engine_metrics
from adaspec.bench.endpoint_client import Arm, EndpointError, RequestResult, base_url, scrape, send
from adaspec.bench.endpoint_load import closed_loop, decode_rate, open_loop, summarise
from adaspec.errors import ConfigError


STRUCTURED = "structured"  # the structured-output workload (adaspec.structured_workload)


def is_structured(workload: str) -> bool:
    """``structured``, or ``structured:CATEGORY[,CATEGORY]`` (some of its categories)."""
    return workload == STRUCTURED or workload.startswith(STRUCTURED + ":")


def select_prompts(items: Sequence, n: int, pick: str = "first", skip: int = 0, seed: int = 0) -> list:
    """``n`` of ``items`` after the first ``skip`` of an order, returned in their file order. ``first``: the file's
    order; ``random``: one permutation drawn with ``seed``, so that passes (0, n1), (n1, n2), ... are disjoint and
    together are the first n1 + n2 + ... of one random sample (a profile widening its sample takes the next ones).

    Raises:
        ConfigError: nothing is left after ``skip`` prompts (the message names the workload's size).
    """
    order = list(range(len(items)))
    if pick == "random":
        random.Random(seed).shuffle(order)
    chosen = sorted(order[skip:skip + n])
    if not chosen:
        raise ConfigError(f"the workload has {len(items)} prompts: none left after skipping {skip}")
    return [items[i] for i in chosen]


def workload_items(workload: str) -> list:
    """Every prompt (a structured workload: every task) of a workload name or JSONL file, in file order.

    Raises:
        AdaspecError: an unknown workload (see :func:`adaspec.workloads.load_workload`).
    """
    from adaspec.workloads import load_workload

    return structured_tasks(workload, None) if is_structured(workload) else load_workload(workload)


def structured_tasks(workload: str, limit: int | None) -> list:
    """The tasks of a structured workload name (see :func:`is_structured`), at most ``limit``.

    Raises:
        ConfigError: an unknown category (named).
    """
    from adaspec.structured_workload import CATEGORIES, load_tasks

    _, _, chosen = workload.partition(":")
    return load_tasks(limit, tuple(c.strip() for c in chosen.split(",")) if chosen else CATEGORIES)


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
    interleave: bool = False
    pick: str = "first"  # which prompts: "first" (file order) or "random" (a sample drawn with ``seed``)
    skip: int = 0  # leave out the first ``skip`` prompts of that order (a profile's later passes)
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
        if self.pick not in ("first", "random"):
            raise ConfigError(f"the prompt pick must be 'first' or 'random', not {self.pick!r}")
        if not isinstance(self.skip, int) or self.skip < 0:
            raise ConfigError(f"the prompts skipped must be a whole number >= 0, not {self.skip!r}")
        if is_structured(self.workload) and self.api != "chat":
            raise ConfigError("the structured workload needs --api chat (response_format and tools are chat fields)")
        if self.interleave and base_url(self.baseline or self.url) == base_url(self.url):
            raise ConfigError("--interleave needs the baseline on its own server (--baseline URL): one server's "
                              "/metrics counters cannot be split between arms whose requests alternate")
        if self.interleave and 1 not in self.concurrency:
            raise ConfigError("--interleave alternates the arms at one client: give --concurrency 1 (other levels "
                              "are measured arm by arm)")


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


def _key(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


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
                       time_limit_s: float | None = None, argv: Sequence[str] = (), settle_s: float = 0.0) -> dict:
    """Measure every (round, load, arm) configuration not yet in ``out``, each arm first settled for ``settle_s``
    seconds (:func:`settle`, within the time limit, and only when something is left to measure; its rates are
    logged). Returns ``run`` (configurations measured now), ``done`` (found in ``out``), ``stopped`` (the time
    limit cut the run) and ``key`` (the run's key: rows of this configuration carry it as ``run``).

    Raises:
        ConfigError: bad settings. EndpointError: an arm cannot be measured at all (checked before any timing).
    """
    cfg.validate()
    if not 0 <= settle_s < math.inf:
        raise ConfigError(f"--settle takes seconds >= 0, not {settle_s}")
    arms = cfg.arms()
    prompts = select_prompts(workload_items(cfg.workload), cfg.prompts, cfg.pick, cfg.skip, cfg.seed)
    start = time.monotonic()
    deadline = start + time_limit_s if time_limit_s else float("inf")
    out.parent.mkdir(parents=True, exist_ok=True)
    done = {row.get("key") for row in _rows(out, ("meta", "endpoint"))} if out.exists() else set()
    with httpx.Client(limits=httpx.Limits(max_connections=max(cfg.max_inflight, max(cfg.concurrency, default=1)) + 4),
                      headers={"authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else None) as client:
        models = {arm.name: probe(client, arm, cfg) for arm in arms}
        for arm in arms:
            _warm_up(client, arm, cfg, models[arm.name], prompts[0])
        # (fields added later are left out at their defaults: runs from before them keep their keys and resume)
        later = {"interleave": False, "pick": "first", "skip": 0}
        meta_fields = {k: v for k, v in asdict(cfg).items() if k != "api_key" and (k not in later or v != later[k])}
        run = _key(meta_fields)
        loads = [("closed", c) for c in cfg.concurrency] + [("open", r) for r in cfg.rates]

        # every (arm, level, round) configuration's fields and key (the same command resumes; a changed one
        # re-measures)
        configs: dict[tuple, tuple[dict, str]] = {}
        for rnd in range(cfg.rounds):
            for load, level in loads:
                for arm in arms:
                    fields = _fields(cfg, arm, models, prompts, load, level, rnd, _requests(cfg, prompts, load, level))
                    configs[arm.name, load, level, rnd] = fields, _key({**fields, "run": run})
        todo = any(key not in done for _, key in configs.values())
        for arm in arms if settle_s > 0 and todo else []:
            seconds = min(settle_s, deadline - time.monotonic())
            if seconds <= 0:
                break
            rates = settle(client, arm, cfg, models[arm.name], prompts, seconds)
            log(f"{arm.name}: settled for {seconds:g} s; decode tok/s of its requests: "
                + " ".join(f"{r:.1f}" for r in rates))
        with out.open("a") as f:
            if run not in done:
                f.write(json.dumps({"kind": "meta", "key": run, "run": run, "config": meta_fields, "models": models,
                                    "argv": list(argv), "client": {"platform": platform.platform(),
                                                                   "python": sys.version.split()[0]},
                                    "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")
                f.flush()
            measured, skipped, stopped = 0, 0, False
            for rnd in range(cfg.rounds):
                for load, level in loads:
                    order = arms if (rnd + loads.index((load, level))) % 2 == 0 else arms[::-1]
                    here = {arm.name: configs[arm.name, load, level, rnd] for arm in arms}
                    paired = None  # validate() gives --interleave two servers and a one-client level
                    if cfg.interleave and (load, level) == ("closed", 1) and time.monotonic() < deadline \
                            and any(key not in done for _, key in here.values()):
                        paired = measure_interleaved(client, order, cfg, prompts, models,
                                                     here[arms[0].name][0]["requests"], deadline)
                    for arm in order:
                        fields, key = here[arm.name]
                        n = fields["requests"]
                        if key in done:
                            skipped += 1
                            continue
                        if paired is None and time.monotonic() >= deadline:  # (a pair measured is written)
                            stopped = True
                            break
                        row = paired[arm.name] if paired else measure(client, arm, cfg, prompts, models[arm.name],
                                                                           load, level, n, deadline)
                        if row["completed"] + row["failed"] < n:  # the time limit cut it: kept, not resumable
                            f.write(json.dumps({"kind": "endpoint_partial", "run": run, **fields, **row}) + "\n")
                            log(f"{arm.name}: stopped at the time limit after {row['completed'] + row['failed']} of "
                                f"{n} requests (kept as endpoint_partial; rerun to measure it whole)")
                            stopped = True
                            if paired is None:
                                break
                            continue  # the other arm of the pair is kept too
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


def _warm_up(client: httpx.Client, arm: Arm, cfg: EndpointConfig, model: str, prompt) -> None:
    """``cfg.warmup`` short requests to ``arm``: the route works and the server is warm. A server that refuses
    ``stream_options`` turns ``cfg.stream_usage`` off.

    Raises:
        EndpointError: a request fails.
    """
    for _ in range(cfg.warmup):
        body = {**request_body(cfg, model, prompt), "max_tokens": min(cfg.max_tokens, 8)}
        r = send(client, arm, cfg.api, body, prompt.id, cfg.timeout_s)
        if not r.ok and r.status in (400, 422) and cfg.stream_usage:  # an older server: no stream_options
            body.pop("stream_options", None)
            r = send(client, arm, cfg.api, body, prompt.id, cfg.timeout_s)
            cfg.stream_usage = not r.ok
        if not r.ok:
            raise EndpointError(f"{arm.url} ({arm.name} arm) failed a one-request check: {r.error}")


def _requests(cfg: EndpointConfig, prompts: Sequence, load: str, level: float) -> int:
    """Requests per configuration: ``--requests``, else the prompt count, at least 2 per client (open loop: 8)."""
    return cfg.requests or max(len(prompts), 2 * int(level) if load == "closed" else 8)


def _fields(cfg: EndpointConfig, arm: Arm, models: dict, prompts: Sequence, load: str, level: float, rnd: int,
            n: int) -> dict:
    """What identifies one (arm, load level, round) configuration in the results file (its key's fields)."""
    return {"arm": arm.name, "url": arm.url, "body": arm.body, "model": models[arm.name], "api": cfg.api,
            "workload": cfg.workload, "prompts": len(prompts), "max_tokens": cfg.max_tokens,
            "temperature": cfg.temperature, "load": load, "concurrency": level if load == "closed" else None,
            "rate": level if load == "open" else None, "requests": n, "round": rnd, "seed": cfg.seed}


def measure_interleaved(client: httpx.Client, arms: Sequence[Arm], cfg: EndpointConfig, prompts: list,
                        models: dict, n: int, deadline: float) -> dict[str, dict]:
    """One client, ``n`` requests per arm (fewer once ``deadline``, a ``time.monotonic()`` value, passes; a pair is
    never split), the arms alternating request by request (prompt i to both arms, the first arm alternating with
    i) so that each prompt's pair is measured seconds apart. Returns one row per arm (as :func:`measure` returns;
    its wall time is the sum of its own requests' times, seconds), each arm's ``/metrics`` scraped before and
    after the whole level (its server serves only its own arm)."""
    before = {arm.name: scrape(client, arm)[0] for arm in arms}
    results: dict[str, list[RequestResult]] = {arm.name: [] for arm in arms}
    for i in range(n):
        if time.monotonic() >= deadline:
            break
        p = prompts[i % len(prompts)]
        for arm in (arms if i % 2 == 0 else arms[::-1]):
            results[arm.name].append(send(client, arm, cfg.api, request_body(cfg, models[arm.name], p), p.id,
                                          cfg.timeout_s))
    rows = {}
    for arm in arms:
        after, why = scrape(client, arm)
        wall = sum(r.e2e_s or 0.0 for r in results[arm.name])
        rows[arm.name] = _summary_row(results[arm.name], wall, before[arm.name], after, why, cfg, prompts)
    return rows


def settle(client: httpx.Client, arm: Arm, cfg: EndpointConfig, model: str, prompts: Sequence,
           seconds: float) -> list[float]:
    """Send full-length requests to ``arm`` one at a time, cycling through ``prompts``, until ``seconds`` have
    passed (at least one request): a server just started is the likeliest to decode slowly for a while (on the
    project's 2-vCPU VMs slow spells of seconds to minutes also come later; docs/findings/scaleout.md). Returns
    each request's decode rate, tokens/s after the first token (0.0 for a request of one token).

    Raises:
        EndpointError: a request fails.
    """
    rates: list[float] = []
    end = time.monotonic() + seconds
    while not rates or time.monotonic() < end:
        p = prompts[len(rates) % len(prompts)]
        r = send(client, arm, cfg.api, request_body(cfg, model, p), p.id, cfg.timeout_s)
        if not r.ok:
            raise EndpointError(f"{arm.url} ({arm.name} arm) failed a settling request: {r.error}")
        rates.append(decode_rate(r.tokens, r.ttft_s, r.e2e_s) or 0.0)
    return rates


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
    return _summary_row(results, wall, before, after, why, cfg, prompts)


def _summary_row(results: list[RequestResult], wall: float, before, after, why: str | None, cfg: EndpointConfig,
                 prompts: Sequence) -> dict:
    """One configuration's row: :func:`summarise` of its requests, the structured workload's grades, and the
    speculative-decoding counters' differences between the ``before`` and ``after`` scrapes."""
    row = summarise(results, wall, slo_ttft_ms=cfg.slo_ttft_ms, slo_tpot_ms=cfg.slo_tpot_ms)
    if is_structured(cfg.workload):
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


def _rows(path: Path, kinds: tuple[str, ...]) -> Iterator[dict]:
    """The rows of ``kinds`` in a results file (a line cut by a kill is skipped)."""
    for line in Path(path).read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("kind") in kinds:
            yield row


def read_rows(paths: Sequence[Path]) -> list[dict]:
    """The ``endpoint`` and ``meta`` rows of results files (other kinds are skipped; a cut line is ignored)."""
    return [row for path in paths for row in _rows(path, ("endpoint", "meta"))]


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
