"""A stand-in serving engine for tests of :mod:`adaspec.engines` (standard library only, run as a script):

    python fake_engine.py PORT [--k K] [--alpha A] [--die-after N] [--fail-after N] [--exit-at-start]
                               [--token-ms MS] [--state FILE]

OpenAI-compatible enough for the endpoint bench: ``GET /v1/models``, streamed ``POST /v1/chat/completions`` (8
content chunks, ``usage`` last), and vLLM's speculative-decoding counters on ``/metrics`` (each request adds
``drafts`` = 8, K draft tokens per draft and accepted tokens from a fixed acceptance per position A^(i+1)), the
same numbers per request in the last chunk (vLLM's ``metrics.speculative_decoding``) and a "SpecDecoding metrics"
log line per request as vLLM writes them. Faults on demand: exit before serving
(``--exit-at-start``), exit after N requests (``--die-after``), answer HTTP 500 after N requests (``--fail-after``).
``--state FILE`` counts starts across restarts (a fault can then happen on the first start only).
"""

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

args = sys.argv[1:]
PORT = int(args[0])


def opt(name, default, cast=float):
    return cast(args[args.index(name) + 1]) if name in args else default


K, ALPHA = opt("--k", 0, int), opt("--alpha", 0.6)
DIE_AFTER, FAIL_AFTER = opt("--die-after", 0, int), opt("--fail-after", 0, int)
TOKEN_MS = opt("--token-ms", 2.0)
STATE = opt("--state", None, str)
starts = 0
if STATE:
    p = Path(STATE)
    starts = int(p.read_text()) + 1 if p.exists() else 1
    p.write_text(str(starts))
first_start = starts <= 1
if "--exit-at-start" in args and first_start:
    print("fake engine: cannot allocate the KV cache (simulated)", flush=True)
    sys.exit(3)

lock = threading.Lock()
count = {"requests": 0, "drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": [0] * max(K, 1)}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, code, body, ctype="application/json"):
        data = body.encode()
        self.send_response(code)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            return self._send(200, json.dumps({"data": [{"id": "target"}]}))
        if self.path == "/metrics":
            with lock:
                c = dict(count)
                lines = [f"vllm:spec_decode_num_drafts_total{{engine=\"0\",model_name=\"target\"}} {c['drafts']}.0",
                         f"vllm:spec_decode_num_draft_tokens_total{{engine=\"0\",model_name=\"target\"}} "
                         f"{c['draft_tokens']}.0",
                         f"vllm:spec_decode_num_accepted_tokens_total{{engine=\"0\",model_name=\"target\"}} "
                         f"{c['accepted']}.0"]
                lines += [f"vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine=\"0\",model_name=\"target\","
                          f"position=\"{i}\"}} {v}.0" for i, v in enumerate(c["per_pos"])] if K else []
            text = "".join(f"# TYPE {ln.split('{')[0].removesuffix('_total')} counter\n{ln}\n" for ln in lines) \
                if K else "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0.0\n"
            return self._send(200, text, "text/plain")
        self._send(404, "{}")

    def do_POST(self):
        n = int(self.headers.get("content-length", 0))
        json.loads(self.rfile.read(n) or b"{}")
        with lock:
            count["requests"] += 1
            served = count["requests"]
        if DIE_AFTER and first_start and served > DIE_AFTER:
            print("fake engine: worker died (simulated)", flush=True)
            import os
            os._exit(7)
        if FAIL_AFTER and first_start and served > FAIL_AFTER:
            return self._send(500, json.dumps({"error": {"message": "internal error (simulated)"}}))
        if K:
            with lock:
                acc = [int(8 * ALPHA ** (i + 1)) for i in range(K)]
                count["drafts"] += 8
                count["draft_tokens"] += 8 * K
                count["accepted"] += sum(acc)
                count["per_pos"] = [a + b for a, b in zip(count["per_pos"], acc)]
            print(f"INFO SpecDecoding metrics: Mean acceptance length: 2.00, Accepted throughput: 1.00 tokens/s, "
                  f"Drafted throughput: 1.00 tokens/s, Accepted: {sum(acc)} tokens, Drafted: {8 * K} tokens, "
                  f"Per-position acceptance rate: {', '.join('%.3f' % (a / 8) for a in acc)}, "
                  f"Avg Draft acceptance rate: 50.0%", flush=True)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        step_s = TOKEN_MS / 1e3 / (1 + ALPHA * K)
        for i in range(8):
            time.sleep(step_s)
            chunk = {"choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        done = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
        usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13}}
        if K:  # vLLM's per-request numbers (--per-request-spec-decode-metrics summary), consistent with /metrics
            acc = [int(8 * ALPHA ** (i + 1)) for i in range(K)] + [0]
            hist = [8 - acc[0]] + [acc[j - 1] - acc[j] for j in range(1, K + 1)]
            usage["metrics"] = {"speculative_decoding": {
                "mean_acceptance_length": 1 + sum(acc) / 8, "draft_acceptance_rate": sum(acc) / (8 * K),
                "acceptance_histogram": hist, "num_spec_steps": 8, "num_accepted_draft_tokens": sum(acc),
                "num_draft_tokens": 8 * K, "num_spec_tokens": K}}
        self.wfile.write(f"data: {json.dumps(done)}\n\ndata: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())


print(f"fake engine on {PORT}, K={K}", flush=True)
ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
