"""A small, bounded load test of ``adaspec serve`` (loopback only): requests/s and latency percentiles for several
client concurrencies, with the server's default speculation and with speculation off (per request, same server).

    python -m adaspec.server.loadtest --spawn --out docs/server-loadtest.json --markdown docs/server-loadtest.md \\
        -- --threads 2                    # arguments after -- go to the spawned `adaspec serve`
    python -m adaspec.server.loadtest --url http://127.0.0.1:8000   # against a running server

    python -m adaspec.server.loadtest --spawn --repeat 20 --prompts 5 --out docs/results/issue16/repeat.json \
        -- --threads 2                    # determinism: the same greedy request 20 times, default vs strict

Each configuration sends a fixed number of requests from C client threads (each sends its next request when the
previous one is answered), all greedy streamed chat completions of short coding prompts with ``max_tokens`` tokens;
TTFT is measured by the client (request sent → first content chunk), and tokens/s is every client's completion
tokens over the configuration's wall time. The whole run stops issuing requests after ``--time-limit`` seconds.
Modes: ``speculative`` (the server's default speculation), ``ngram`` (n-gram drafts, goodput controller) and
``plain`` (speculation off), per request on the same server. Stdlib only (no extra dependencies).

    python -m adaspec.server.loadtest --spawn --concurrency 1,4,16 --requests 4,8,32 --rounds 2 \
        --out docs/results/issue12/server.json -- --threads 2 --max-batch 16   # continuous batching
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PROMPTS = [
    "Write a Python function that reverses a string.",
    "Write a Python function that checks whether a number is prime.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Write a Python function that counts the vowels in a string.",
    "Write a Python function that flattens a nested list.",
    "Write a Python function that merges two sorted lists.",
    "Write a Python function that computes the factorial of n.",
    "Write a Python function that removes duplicates from a list, keeping order.",
]

MODES = {"speculative": None, "ngram": {"drafter": "ngram", "controller": "goodput"}, "plain": {"drafter": "none"}}


def _check_loopback(url: str) -> None:
    host = urllib.parse.urlparse(url).hostname or ""
    try:
        addrs = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except socket.gaierror:
        raise SystemExit(f"cannot resolve {host!r}") from None
    if not all(a.startswith("127.") or a == "::1" for a in addrs):
        raise SystemExit(f"refusing to load-test {url}: only loopback addresses (127.0.0.0/8, ::1) are allowed")


def _request(url: str, path: str, body: dict | None, api_key: str | None, timeout: float) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method="POST" if data else "GET")
    req.add_header("content-type", "application/json")
    if api_key:
        req.add_header("authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read() or b"{}")
        except ValueError:
            return e.code, {}


def _stream_chat(url: str, body: dict, api_key: str | None, timeout: float) -> tuple[int, dict, float | None]:
    """POST a streamed chat completion; returns (status, the final chunk's fields merged with the usage chunk's,
    seconds to the first content chunk or None)."""
    req = urllib.request.Request(url + "/v1/chat/completions", method="POST", data=json.dumps(
        {**body, "stream": True, "stream_options": {"include_usage": True}}).encode())
    req.add_header("content-type", "application/json")
    if api_key:
        req.add_header("authorization", f"Bearer {api_key}")
    t0 = time.monotonic()
    ttft, final = None, {}
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for raw in r:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data: {"):
                    continue
                obj = json.loads(line[6:])
                if "error" in obj:
                    return 500, obj, ttft
                choices = obj.get("choices") or []
                if ttft is None and choices and choices[0].get("delta", {}).get("content"):
                    ttft = time.monotonic() - t0
                if choices and choices[0].get("finish_reason"):
                    final.update(obj)
                if obj.get("usage"):
                    final["usage"] = obj["usage"]
            return r.status, final, ttft
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read() or b"{}"), None
        except ValueError:
            return e.code, {}, None


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def run_config(url: str, model: str, *, concurrency: int, requests: int, max_tokens: int, speculation: dict | None,
               api_key: str | None, deadline: float, timeout: float) -> dict:
    lock = threading.Lock()
    next_index = [0]
    records: list[dict] = []

    def worker() -> None:
        while True:
            with lock:
                i = next_index[0]
                if i >= requests or time.monotonic() > deadline:
                    return
                next_index[0] += 1
            body = {"model": model, "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                    "max_tokens": max_tokens, "temperature": 0}
            if speculation is not None:
                body["speculation"] = speculation
            t0 = time.monotonic()
            try:
                status, resp, ttft = _stream_chat(url, body, api_key, timeout)
            except (OSError, TimeoutError, ValueError) as e:
                status, resp, ttft = 0, {"error": {"message": str(e)}}, None
            rec = {"status": status, "latency_s": time.monotonic() - t0, "ttft_s": ttft}
            if status == 200 and "usage" not in resp:
                status = rec["status"] = 0  # the stream ended without its final chunk
            if status == 200:
                s = resp.get("speculation", {})
                rec.update(tokens=resp["usage"]["completion_tokens"], alpha=s.get("acceptance_rate"),
                           tau=s.get("mean_accepted_tokens"), speedup_estimate=s.get("speedup_estimate"),
                           queue_ms=s.get("time_ms", {}).get("queue"), ttft_ms=s.get("ttft_ms"),
                           draft_tokens=s.get("draft_tokens"), time_ms=s.get("time_ms"),
                           k_trace=s.get("k_trace", {}).get("compressed"))
            with lock:
                records.append(rec)

    start = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        for _ in range(concurrency):
            pool.submit(worker)
    wall = time.monotonic() - start
    ok = [r for r in records if r["status"] == 200]
    lat = sorted(r["latency_s"] for r in ok)
    ttft = sorted(r["ttft_s"] for r in ok if r["ttft_s"] is not None)
    spec = [r for r in ok if r.get("draft_tokens")]
    return {
        "concurrency": concurrency,
        "requests": len(records),
        "ok": len(ok),
        "errors": {str(s): sum(1 for r in records if r["status"] == s) for s in {r["status"] for r in records}
                   if s != 200},
        "wall_s": round(wall, 2),
        "requests_per_s": round(len(ok) / wall, 4) if wall > 0 else None,
        "tokens_per_s": round(sum(r["tokens"] for r in ok) / wall, 3) if wall > 0 else None,
        "mean_tokens": round(statistics.fmean(r["tokens"] for r in ok), 1) if ok else None,
        "latency_p50_s": round(_pct(lat, 50), 2) if lat else None,
        "latency_p95_s": round(_pct(lat, 95), 2) if lat else None,
        "ttft_p50_s": round(_pct(ttft, 50), 3) if ttft else None,
        "ttft_p95_s": round(_pct(ttft, 95), 3) if ttft else None,
        "mean_queue_s": round(statistics.fmean(r["queue_ms"] for r in ok) / 1e3, 2) if ok else None,
        "mean_alpha": round(statistics.fmean(r["alpha"] for r in spec), 3) if spec else None,
        "mean_tau": round(statistics.fmean(r["tau"] for r in spec), 3) if spec else None,
        "records": records,
        "mean_speedup_estimate": round(statistics.fmean(r["speedup_estimate"] for r in ok
                                                        if r.get("speedup_estimate")), 3)
        if any(r.get("speedup_estimate") for r in ok) else None,
    }


def run_repeat(url: str, model: str, *, prompts: int, repeats: int, max_tokens: int, strict: bool,
               api_key: str | None, deadline: float, timeout: float) -> dict:
    """Send each of the first ``prompts`` prompts ``repeats`` times, greedy, one request at a time, prompts in
    rotation (so the server's controller state differs from repeat to repeat), with ``"strict": strict``. Reports,
    per prompt, how many distinct texts came back and how many repeats differ from the first answer."""
    texts: dict[int, list[str]] = {i: [] for i in range(prompts)}
    errors = 0
    for _ in range(repeats):
        for i in range(prompts):
            if time.monotonic() > deadline:
                break
            body = {"model": model, "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                    "max_tokens": max_tokens, "temperature": 0, "strict": strict}
            try:
                status, resp = _request(url, "/v1/chat/completions", body, api_key, timeout)
            except (OSError, TimeoutError):
                status, resp = 0, {}
            if status == 200:
                texts[i].append(resp["choices"][0]["message"]["content"])
            else:
                errors += 1
    per_prompt = [{"prompt": PROMPTS[i % len(PROMPTS)], "answers": len(t), "distinct": len(set(t)),
                   "differ_from_first": sum(x != t[0] for x in t[1:]) if t else 0} for i, t in texts.items()]
    answered = sum(max(p["answers"] - 1, 0) for p in per_prompt)
    changed = sum(p["differ_from_first"] for p in per_prompt)
    return {"mode": "strict" if strict else "default", "prompts": prompts, "repeats": repeats, "errors": errors,
            "repeats_compared": answered, "changed": changed,
            "changed_rate": round(changed / answered, 4) if answered else None,
            "prompts_with_several_answers": sum(p["distinct"] > 1 for p in per_prompt), "per_prompt": per_prompt}


def markdown_repeat(result: dict) -> str:
    lines = [f"Model: `{result['model']}`; {result['max_tokens']} tokens per greedy chat completion; "
             f"{result['machine']}.", "",
             "| mode | prompts × repeats | repeats differing from the first answer | prompts with > 1 distinct answer "
             "| errors |", "|---|---|---:|---:|---:|"]
    for r in result["repeat"]:
        rate = "–" if r["changed_rate"] is None else f"{100 * r['changed_rate']:.1f}%"
        lines.append(f"| {r['mode']} | {r['prompts']} × {r['repeats']} | {r['changed']}/{r['repeats_compared']} "
                     f"({rate}) | {r['prompts_with_several_answers']}/{r['prompts']} | {r['errors']} |")
    return "\n".join(lines) + "\n"


def markdown(result: dict) -> str:
    if "repeat" in result:
        return markdown_repeat(result)
    default = {k: v for k, v in result["speculation_default"].items() if k in ("drafter", "controller", "k")}
    lines = [f"Model: `{result['model']}`; default speculation: `{json.dumps(default)}`; "
             f"{result['max_tokens']} tokens per request (greedy chat completions of short coding prompts); "
             f"{result['machine']}.", "",
             "| mode | clients | round | requests | ok | req/s | tokens/s | vs plain | vs 1 client "
             "| p50 latency (s) | p95 latency (s) | p50 TTFT (s) | mean queue (s) | α | τ |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    by = {(r["mode"], r["concurrency"], r.get("round", 0)): r for r in result["runs"]}
    one = min((r["concurrency"] for r in result["runs"]), default=1)
    for r in sorted(result["runs"], key=lambda r: (r["mode"], r["concurrency"], r.get("round", 0))):
        plain = by.get(("plain", r["concurrency"], r.get("round", 0)))
        single = by.get((r["mode"], one, r.get("round", 0)))

        def ratio(ref):
            if ref is None or not ref.get("tokens_per_s") or r.get("tokens_per_s") is None:
                return "–"
            return f"{r['tokens_per_s'] / ref['tokens_per_s']:.2f}×"

        def f(x, spec=""):
            return "–" if x is None else format(x, spec)
        lines.append(f"| {r['mode']} | {r['concurrency']} | {r.get('round', 0)} | {r['requests']} | {r['ok']} "
                     f"| {f(r['requests_per_s'], '.3f')} | {f(r['tokens_per_s'], '.2f')} | {ratio(plain)} "
                     f"| {ratio(single)} "
                     f"| {f(r['latency_p50_s'], '.2f')} | {f(r['latency_p95_s'], '.2f')} "
                     f"| {f(r.get('ttft_p50_s'), '.2f')} | {f(r['mean_queue_s'], '.1f')} "
                     f"| {f(r['mean_alpha'], '.2f')} | {f(r['mean_tau'], '.2f')} |")
    return "\n".join(lines) + "\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the server exited with code {proc.returncode} before becoming healthy")
        try:
            if _request(url, "/health", None, None, 5)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"{url} did not become healthy within {timeout:.0f} s")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    serve_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, serve_args = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="python -m adaspec.server.loadtest", description=__doc__.splitlines()[0])
    p.add_argument("--url", default=None, help="a running server (loopback only); default: --spawn one")
    p.add_argument("--spawn", action="store_true", help="start `adaspec serve` (args after --) on a free port")
    p.add_argument("--api-key", default=os.environ.get("ADASPEC_API_KEY"))
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated client counts")
    p.add_argument("--requests", default="4,8,16", help="requests per configuration, one per client count")
    p.add_argument("--modes", default="speculative,plain",
                   help="comma-separated: speculative (server default), ngram, plain")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=1,
                   help="repeat every configuration; modes interleaved per client count, order alternating")
    p.add_argument("--time-limit", type=float, default=1800, help="stop issuing requests after this many seconds")
    p.add_argument("--request-timeout", type=float, default=900)
    p.add_argument("--out", default=None, help="write the results JSON here")
    p.add_argument("--markdown", default=None, help="write the Markdown table here")
    p.add_argument("--repeat", type=int, default=0, metavar="N",
                   help="determinism test instead: each prompt N times, greedy, default and strict mode")
    p.add_argument("--prompts", type=int, default=5, help="prompts of the --repeat test (at most 8)")
    args = p.parse_args(argv)
    if args.repeat and not 1 <= args.prompts <= len(PROMPTS):
        p.error(f"--prompts must be in 1..{len(PROMPTS)}")

    concurrency = [int(x) for x in args.concurrency.split(",")]
    counts = [int(x) for x in args.requests.split(",")]
    if len(counts) != len(concurrency):
        p.error("--requests needs one count per --concurrency value")
    modes = args.modes.split(",")
    for m in modes:
        if m not in MODES:
            p.error(f"unknown mode {m!r}; choose from {', '.join(MODES)}")

    proc = None
    url = args.url
    if url is None or args.spawn:
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "adaspec.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
               "--log-level", "warning", "--max-queue", str(max(concurrency) + 4), *serve_args]
        print("spawning:", " ".join(cmd), file=sys.stderr)
        proc = subprocess.Popen(cmd)
    _check_loopback(url)
    try:
        _wait_healthy(url, proc, timeout=900)
        status, models = _request(url, "/v1/models", None, args.api_key, 30)
        if status != 200:
            raise SystemExit(f"GET /v1/models answered {status}: {models}")
        card = models["data"][0]
        model = card["id"]
        deadline = time.monotonic() + args.time_limit
        runs = []
        machine = f"{os.cpu_count()} CPUs, {platform.machine()}, {platform.python_version()}"
        if args.repeat:
            reps = []
            for strict in (False, True):
                r = run_repeat(url, model, prompts=args.prompts, repeats=args.repeat, max_tokens=args.max_tokens,
                               strict=strict, api_key=args.api_key, deadline=deadline, timeout=args.request_timeout)
                print(json.dumps({k: v for k, v in r.items() if k != "per_prompt"}), file=sys.stderr, flush=True)
                reps.append(r)
            modes = []
            result = {"model": model, "max_tokens": args.max_tokens, "serve_args": serve_args, "machine": machine,
                      "repeat": reps}
        for mode in modes:  # one unmeasured request per mode (first-use allocations, the controller's calibration)
            run_config(url, model, concurrency=1, requests=1, max_tokens=args.max_tokens, speculation=MODES[mode],
                       api_key=args.api_key, deadline=deadline, timeout=args.request_timeout)
        for rnd in range(args.rounds):
            for c, n in zip(concurrency, counts, strict=True):
                # modes interleaved per client count, in alternating order from round to round (the VM drifts)
                for mode in (modes if rnd % 2 == 0 else modes[::-1]):
                    r = run_config(url, model, concurrency=c, requests=n, max_tokens=args.max_tokens,
                                   speculation=MODES[mode], api_key=args.api_key, deadline=deadline,
                                   timeout=args.request_timeout)
                    r["mode"], r["round"] = mode, rnd
                    runs.append(r)
                    print(json.dumps({k: v for k, v in r.items() if k != "records"}), file=sys.stderr, flush=True)
        if not args.repeat:
            result = {"model": model, "speculation_default": card.get("speculation", {}),
                      "max_tokens": args.max_tokens, "serve_args": serve_args, "machine": machine, "runs": runs}
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    table = markdown(result)
    print(table)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(table, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
