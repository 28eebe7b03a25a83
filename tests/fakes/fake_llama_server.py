#!/usr/bin/env python3
"""A stand-in for llama.cpp's llama-server in tests (stdlib only): parses the flags the peer passes, serves
``/health`` and ``/completion`` with ``timings`` (incl. ``draft_n`` / ``draft_n_accepted`` when a ``--spec-type``
is given) and ``tokens``. Its answer is the prompt's ids + 1, 2, 3, ... up to ``n_predict``.

Behaviour switches (environment): FAKE_LLAMA_MODE = ``ok`` | ``crash-at-start`` (exits 3 after a log line) |
``sigill`` (dies of SIGILL at start) | ``crash-on-ask`` (exits during the first completion) | ``hang`` (never answers a completion) | ``differ`` (token 2
of every answer is off by one); FAKE_LLAMA_PIDFILE: append this process's pid there.
"""

import argparse
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

p = argparse.ArgumentParser()
p.add_argument("-m", required=True)
p.add_argument("--host", default="127.0.0.1")
p.add_argument("--port", type=int, required=True)
p.add_argument("--spec-type", default="")
p.add_argument("-md")
args, _ = p.parse_known_args()
mode = os.environ.get("FAKE_LLAMA_MODE", "ok")
if os.environ.get("FAKE_LLAMA_PIDFILE"):
    with open(os.environ["FAKE_LLAMA_PIDFILE"], "a") as f:
        f.write(f"{os.getpid()}\n")
print(f"fake llama-server: model {args.m}, spec {args.spec_type or 'none'}", file=sys.stderr, flush=True)
if mode == "crash-at-start":
    print("error: failed to load model (fake)", file=sys.stderr, flush=True)
    sys.exit(3)
if mode == "sigill":  # as a binary built for another CPU dies
    import signal

    os.kill(os.getpid(), signal.SIGILL)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _json(self, obj, code=200):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._json({"status": "ok"} if self.path == "/health" else {"error": "no"}, 200 if self.path == "/health"
                   else 404)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if mode == "crash-on-ask":
            print("GGML_ASSERT failed (fake)", file=sys.stderr, flush=True)
            os._exit(134)
        if mode == "hang":
            time.sleep(3600)
        prompt, n = body["prompt"], body["n_predict"]
        tokens = [prompt[-1] + i + 1 for i in range(n)]
        if mode == "differ" and n > 2:
            tokens[2] += 1
        timings = {"prompt_n": len(prompt), "prompt_ms": 5.0, "predicted_n": n, "predicted_ms": 10.0 * (n - 1),
                   "predicted_per_second": 100.0}
        if args.spec_type:
            timings.update(draft_n=2 * n, draft_n_accepted=n)
        self._json({"content": " ".join(f"t{t}" for t in tokens), "tokens": tokens, "stop_type": "limit",
                    "timings": timings})


HTTPServer((args.host, args.port), Handler).serve_forever()
