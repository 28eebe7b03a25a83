"""Issue 41 benchmark: ``adaspec serve`` under hostile load, on a quiet machine (run by ``run.sh``).

Starts ``adaspec serve`` (default models unless told otherwise) on a free loopback port and measures:

(a) **head-of-line blocking**: client A streams greedy tokens (with ``logprobs``, so that every token has a
    chunk); once A is under way client B sends a long prompt
    (``--long-tokens`` token ids, default 8,000, capped by the context window). Reported: the longest gap between
    two of A's chunks while B's prompt is prefilled, A's median gap before B arrived, and B's time to answer.
    Target: longest gap <= 1.5 s.
(b) **scoring memory**: the server's RSS (sampled from /proc every 20 ms) before and during the worst accepted
    ``echo`` + ``logprobs`` request (``--max-scored-tokens`` prompt tokens, 20 alternatives, ``n = 2``, which
    is scored once), reported against the budget given by ``--rss-budget-mib``.
(c) **soak**: ``--clients`` clients for ``--soak-s`` seconds of mixed traffic (streams, streams cancelled after a
    few chunks, bad input, ``n = 2``, echo scoring); reported: the RSS slope over the soak (least squares, MiB per
    minute, first minute left out as warm-up), the count of unexpected statuses (any 5xx but 503 queue_full, any
    answer to bad input other than 4xx), the count of ``Traceback``/``ERROR`` lines in the server's log, and that
    ``/health`` shows no slot held at the end.

Writes ``--out`` (JSON) and ``--markdown`` (a table). Nothing is timed in a unit test; this is the measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class RssSampler:
    """Samples a process's RSS every ``period`` seconds on a thread."""

    def __init__(self, pid: int, period: float) -> None:
        self.pid, self.period = pid, period
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic(), rss_mib(self.pid)))
            except OSError:
                return
            self._stop.wait(self.period)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak(self) -> float:
        return max(v for _, v in self.samples)


def start_server(args, log_path: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "adaspec", "serve", "--port", str(port), "--threads", str(args.threads),
           "--max-batch", str(args.max_batch), "--max-queue", str(args.max_queue),
           "--max-scored-tokens", str(args.max_scored_tokens), "--log-level", "warning", *args.serve_args]
    if args.target:
        cmd += ["--target", args.target]
    if args.draft:
        cmd += ["--draft", args.draft]
    if args.backend:
        cmd += ["--backend", args.backend]
    if args.prefill_chunk is not None:
        cmd += ["--prefill-chunk", str(args.prefill_chunk)]
    if args.prefill_step_ms is not None:
        cmd += ["--prefill-step-ms", str(args.prefill_step_ms)]
    print("starting:", " ".join(cmd), file=sys.stderr, flush=True)
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + args.start_timeout
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"adaspec serve exited; see {log_path}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"adaspec serve did not start in {args.start_timeout} s; see {log_path}")
        time.sleep(0.5)


def token_ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 30000) for _ in range(n)]


# (a) ----------------------------------------------------------------------------------------------------------
async def head_of_line(url: str, long_tokens: int, stream_tokens: int) -> dict:
    arrivals: list[float] = []
    texts: list[int] = []  # characters in each of A's chunks
    marks: dict[str, float] = {}
    async with httpx.AsyncClient(base_url=url, timeout=1800) as http:
        async def stream() -> None:
            # logprobs: every token gets a chunk, also one whose text is empty (with ignore_eos the model writes
            # special tokens such as <|endoftext|>, which decode to ""; a chunk without text or logprobs is not
            # sent, so without them such a token reads as a gap of two steps that is not the server's)
            body = {"prompt": "def fibonacci(n):", "max_tokens": stream_tokens, "temperature": 0, "ignore_eos": True,
                    "stream": True, "logprobs": 0}
            async with http.stream("POST", "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        arrivals.append(time.monotonic())
                        texts.append(len(json.loads(line[6:])["choices"][0].get("text") or "")
                                     if '"choices": []' not in line else 0)
                    if "answered" in marks:  # the long prompt is done: A has shown what it had to
                        break
            marks["stream_done"] = time.monotonic()

        async def long() -> dict:
            while len(arrivals) < 8 and "stream_done" not in marks:  # A is under way
                await asyncio.sleep(0.01)
            marks["sent"] = time.monotonic()
            r = await http.post("/v1/completions", json={"prompt": token_ids(long_tokens, 41), "max_tokens": 1})
            marks["answered"] = time.monotonic()
            return {"status": r.status_code, "prompt_tokens": r.json().get("usage", {}).get("prompt_tokens")}

        _, b = await asyncio.gather(stream(), long())
        steps = step_histogram((await http.get("/metrics")).text)
    gaps = [(t1 - t0, t0, t1) for t0, t1 in zip(arrivals, arrivals[1:])]
    during = [g for g, t0, t1 in gaps if t1 >= marks["sent"] and t0 <= marks["answered"]]
    before = [g for g, t0, t1 in gaps if t1 < marks["sent"]]
    finished_during = arrivals[-1] <= marks["answered"]
    sent, took = marks["sent"], marks["answered"] - marks["sent"]
    worst = sorted(((g, t0) for g, t0, t1 in gaps if t1 >= sent and t0 <= marks["answered"]), reverse=True)[:5]
    return {"long_prompt": b, "stream_chunks": len(arrivals),
            "stream_finished_before_long_answered": finished_during,
            "median_gap_before_s": statistics.median(before) if before else None,
            "max_gap_during_prefill_s": max(during) if during else None,
            "p95_gap_during_prefill_s": sorted(during)[int(0.95 * (len(during) - 1))] if during else None,
            "worst_gaps": [{"gap_s": round(g, 3), "at_s_after_sent": round(t0 - sent, 2), "t0_monotonic": round(t0, 3),
                            "at_fraction_of_prefill": round((t0 - sent) / took, 3)} for g, t0 in worst],
            "long_answer_s": marks["answered"] - marks["sent"], "target_max_gap_s": 1.5,
            "batch_steps": steps,
            "stream_arrivals": [[round(t, 3), n] for t, n in zip(arrivals, texts)]}


def step_histogram(metrics_text: str) -> dict:
    """The server's ``iteration_seconds`` histogram (every batched step's wall time since start): count, mean and
    the share of steps above each bucket bound."""
    buckets, count, total = {}, 0.0, 0.0
    for line in metrics_text.splitlines():
        if line.startswith("adaspec:iteration_seconds_bucket{"):
            le = line.split('le="')[1].split('"')[0]
            buckets[le] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("adaspec:iteration_seconds_count{"):
            count = float(line.rsplit(" ", 1)[1])
        elif line.startswith("adaspec:iteration_seconds_sum{"):
            total = float(line.rsplit(" ", 1)[1])
    over = {f"over_{le}s": int(count - n) for le, n in buckets.items() if le != "+Inf" and float(le) >= 0.5}
    return {"count": int(count), "mean_s": round(total / count, 3) if count else None, **over}


# (b) ----------------------------------------------------------------------------------------------------------
def scoring_memory(url: str, pid: int, tokens: int, budget_mib: float) -> dict:
    idle = rss_mib(pid)
    body = {"prompt": token_ids(tokens, 7), "max_tokens": 0, "echo": True, "logprobs": 20, "n": 2}
    with RssSampler(pid, 0.02) as s:
        t = time.monotonic()
        r = httpx.post(url + "/v1/completions", json=body, timeout=1800)
        elapsed = time.monotonic() - t
    refused = httpx.post(url + "/v1/completions", json={**body, "prompt": token_ids(tokens + 1, 7), "n": 1},
                         timeout=600)
    peak = s.peak
    return {"prompt_tokens": tokens, "status": r.status_code, "seconds": elapsed, "idle_rss_mib": idle,
            "peak_rss_mib": peak, "growth_mib": peak - idle, "budget_mib": budget_mib,
            "within_budget": peak - idle <= budget_mib, "one_more_token_status": refused.status_code}


# (c) ----------------------------------------------------------------------------------------------------------
BAD = [b'{"prompt": "a\\ud800", "max_tokens": 2}', b"{", b'{"prompt": "a", "n": 99}', b'{"prompt": [999999999]}',
       b'{"prompt": "a", "logit_bias": {"-1": 5}}', b'{"prompt": "a", "speculation": {"drafter": "../x"}}']


async def soak(url: str, pid: int, clients: int, seconds: float) -> dict:
    counts = {"ok": 0, "queue_full": 0, "bad_input_4xx": 0, "unexpected": 0, "cancelled": 0}
    unexpected: list[str] = []
    rss: list[tuple[float, float]] = []
    end = time.monotonic() + seconds

    async def client(i: int, http: httpx.AsyncClient) -> None:
        rng = random.Random(i)
        while time.monotonic() < end:
            kind = rng.choice(["stream", "cancel", "bad", "n2", "echo", "plain"])
            try:
                if kind in ("stream", "cancel"):
                    async with http.stream("POST", "/v1/completions", json={
                            "prompt": f"{i} Write a sorting function.", "max_tokens": 48, "temperature": 0.7,
                            "stream": True}) as r:
                        if r.status_code != 200:
                            await r.aread()
                            record(r.status_code, r.text)
                            continue
                        seen = 0
                        async for line in r.aiter_lines():
                            seen += line.startswith("data: {")
                            if '"error"' in line:
                                record(500, line)
                            if kind == "cancel" and seen >= 3:
                                counts["cancelled"] += 1
                                break
                        else:
                            counts["ok"] += 1
                elif kind == "bad":
                    r = await http.post("/v1/completions", content=rng.choice(BAD),
                                        headers={"content-type": "application/json"})
                    if 400 <= r.status_code < 500:
                        counts["bad_input_4xx"] += 1
                    else:
                        counts["unexpected"] += 1
                        unexpected.append(f"bad input answered {r.status_code}: {r.text[:200]}")
                else:
                    body = {"prompt": f"{i} def add(a, b):", "max_tokens": 24, "temperature": 0.8}
                    if kind == "n2":
                        body["n"] = 2
                    if kind == "echo":
                        body.update(max_tokens=0, echo=True, logprobs=5, prompt=token_ids(256, i))
                    r = await http.post("/v1/completions", json=body)
                    record(r.status_code, r.text)
            except httpx.HTTPError as e:
                counts["unexpected"] += 1
                unexpected.append(f"{kind}: {type(e).__name__}: {e}")

    def record(status: int, text: str) -> None:
        if status == 200:
            counts["ok"] += 1
        elif status == 503 and "queue_full" in text:
            counts["queue_full"] += 1
        else:
            counts["unexpected"] += 1
            unexpected.append(f"{status}: {text[:200]}")

    async def sample() -> None:
        while time.monotonic() < end:
            rss.append((time.monotonic(), rss_mib(pid)))
            await asyncio.sleep(5)

    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=clients + 4)) as http:
        await asyncio.gather(sample(), *(client(i, http) for i in range(clients)))
    deadline = time.monotonic() + 120
    health = httpx.get(url + "/health", timeout=10).json()
    while (health["running"] or health["waiting"]) and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        health = httpx.get(url + "/health", timeout=10).json()
    t0 = rss[0][0]
    warm = [(t - t0, v) for t, v in rss if t - t0 >= 60] or [(t - t0, v) for t, v in rss]
    slope = None
    if len(warm) >= 3:
        mx, my = statistics.fmean(x for x, _ in warm), statistics.fmean(y for _, y in warm)
        sxx = sum((x - mx) ** 2 for x, _ in warm)
        slope = sum((x - mx) * (y - my) for x, y in warm) / sxx * 60 if sxx else None
    return {"seconds": seconds, "clients": clients, **counts, "unexpected_samples": unexpected[:20],
            "rss_first_mib": rss[0][1], "rss_last_mib": rss[-1][1], "rss_slope_mib_per_min": slope,
            "slots_free_at_end": health["running"] == 0 and health["waiting"] == 0}


def markdown(res: dict) -> str:
    a, b, c = res.get("head_of_line", {}), res.get("scoring_memory", {}), res.get("soak", {})

    def f(v, fmt="{:.2f}"):
        return "–" if v is None else fmt.format(v)

    rows = [
        "| measure | value | target |", "|---|---:|---|",
        f"| (a) longest gap between stream chunks during a {f(a.get('long_prompt', {}).get('prompt_tokens'), '{}')}"
        f"-token prefill (s) | {f(a.get('max_gap_during_prefill_s'))} | <= 1.5 |",
        f"| (a) median gap before it (s) | {f(a.get('median_gap_before_s'), '{:.3f}')} | |",
        f"| (a) long prompt answered after (s) | {f(a.get('long_answer_s'), '{:.1f}')} | |",
        f"| (b) RSS growth under the worst accepted echo+logprobs request ({b.get('prompt_tokens')} tokens, "
        f"top 20, n=2) (MiB) | {f(b.get('growth_mib'), '{:.0f}')} | <= {f(b.get('budget_mib'), '{:.0f}')} |",
        f"| (b) idle / peak RSS (MiB) | {f(b.get('idle_rss_mib'), '{:.0f}')} / {f(b.get('peak_rss_mib'), '{:.0f}')}"
        " | |",
        f"| (b) one token more: status | {b.get('one_more_token_status', '–')} | 413 |",
        f"| (c) soak: {c.get('clients', '–')} clients, {f(c.get('seconds'), '{:.0f}')} s: RSS slope after the "
        f"first minute (MiB/min) | {f(c.get('rss_slope_mib_per_min'))} | ~0 |",
        f"| (c) answered ok / queue full / bad input 4xx / cancelled | {c.get('ok', '–')} / {c.get('queue_full', '–')}"
        f" / {c.get('bad_input_4xx', '–')} / {c.get('cancelled', '–')} | |",
        f"| (c) unexpected statuses | {c.get('unexpected', '–')} | 0 |",
        f"| (c) Traceback/ERROR lines in the server log | {res.get('log_errors', '–')} | 0 |",
        f"| (c) every slot free at the end | {c.get('slots_free_at_end', '–')} | True |",
    ]
    return (f"# Server hardening (issue 41)\n\n{res['setup']}\n\n" + "\n".join(rows) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=None, help="default: the server's default target")
    p.add_argument("--draft", default=None, help="default: the server's default drafter")
    p.add_argument("--backend", default="ik")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-batch", type=int, default=4)
    p.add_argument("--max-queue", type=int, default=8)
    p.add_argument("--max-scored-tokens", type=int, default=4096)
    p.add_argument("--rss-budget-mib", type=float, default=1024.0)
    p.add_argument("--prefill-chunk", type=int, default=None, help="adaspec serve --prefill-chunk (default: its own)")
    p.add_argument("--prefill-step-ms", type=float, default=None,
                   help="adaspec serve --prefill-step-ms (default: its own)")
    p.add_argument("--long-tokens", type=int, default=8000)
    p.add_argument("--stream-tokens", type=int, default=4000, help="A's budget; A stops reading once B is answered")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--soak-s", type=float, default=240.0)
    p.add_argument("--parts", default="a,b,c", help="which measurements to run (a, b, c)")
    p.add_argument("--start-timeout", type=float, default=600.0)
    p.add_argument("--out", default="docs/results/server-hardening/results.json")
    p.add_argument("--markdown", default="docs/results/server-hardening/results.md")
    p.add_argument("serve_args", nargs="*", help="more adaspec serve flags (after --)")
    args = p.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log_path = out.with_suffix(".serve-log.txt")
    proc, url = start_server(args, log_path)
    parts = set(args.parts.split(","))
    res: dict = {"setup": f"`adaspec serve` {args.target or '(default target)'} / {args.draft or '(default drafter)'}"
                          f" on {args.backend}, {args.threads} threads, --max-batch {args.max_batch}, "
                          f"--max-queue {args.max_queue}, --prefill-chunk {args.prefill_chunk or 'default'}, "
                          f"--prefill-step-ms {'default' if args.prefill_step_ms is None else args.prefill_step_ms}, "
                          f"{os.cpu_count()} CPUs; "
                          + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "args": vars(args)}
    try:
        ctx = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["max_model_len"]
        if "a" in parts:
            long_tokens = min(args.long_tokens, ctx - 8)
            res["head_of_line"] = asyncio.run(head_of_line(url, long_tokens, args.stream_tokens))
            print(json.dumps(res["head_of_line"]), flush=True)
        if "b" in parts:
            res["scoring_memory"] = scoring_memory(url, proc.pid, min(args.max_scored_tokens, ctx - 8),
                                                   args.rss_budget_mib)
            print(json.dumps(res["scoring_memory"]), flush=True)
        if "c" in parts:
            res["soak"] = asyncio.run(soak(url, proc.pid, args.clients, args.soak_s))
            print(json.dumps({k: v for k, v in res["soak"].items() if k != "unexpected_samples"}), flush=True)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    text = log_path.read_text(errors="replace")
    res["log_errors"] = sum(1 for line in text.splitlines() if "Traceback" in line or line.startswith("ERROR"))
    out.write_text(json.dumps(res, indent=1) + "\n")
    Path(args.markdown).write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
