"""Issue 15 probe (2026-12-02): per-thread CPU time and context switches during plain decoding, in this process
(the server's ModelHost and plain engine, main thread) and in a running `adaspec serve` (a non-streamed plain
request), alternated: which threads of the server spend what, per decoded token.

    .venv/bin/adaspec serve --threads 2 --port 8013 &  # then:
    .venv/bin/python docs/results/issue15/ctxsw.py SERVER_PID http://127.0.0.1:8013 [rounds]
"""
import json
import os
import sys
import time

import httpx

from adaspec.engine import GenerationConfig
from adaspec.models import DEFAULT_TARGET
from adaspec.server.runtime import PLAIN, ModelHost
from adaspec.workloads import load_workload

pid, url = int(sys.argv[1]), sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 4
tick = os.sysconf("SC_CLK_TCK")


def snap(p):
    out = {}
    for t in os.listdir(f"/proc/{p}/task"):
        try:
            stat = open(f"/proc/{p}/task/{t}/stat").read()
            status = open(f"/proc/{p}/task/{t}/status").read()
        except OSError:
            continue
        name, rest = stat.split("(", 1)[1].rsplit(")", 1)
        parts = rest.split()
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        out[int(t)] = (name, (int(parts[11]) + int(parts[12])) / tick, int(fields["voluntary_ctxt_switches"]),
                       int(fields["nonvoluntary_ctxt_switches"]), int(parts[36]))  # last CPU
    return out


def delta(a, b):
    rows = []
    for t, (name, cpu, vol, nvol, _) in b.items():
        a0 = a.get(t, (name, 0.0, 0, 0, 0))
        d = (round(cpu - a0[1], 2), vol - a0[2], nvol - a0[3])
        if d[0] > 0.02 or d[1] > 50 or d[2] > 50:
            rows.append((t, name) + d)
    return sorted(rows, key=lambda r: -r[2])


host = ModelHost.load(DEFAULT_TARGET, "hybrid", threads=2, backend="auto")
host.warmup()
prompt = load_workload("humaneval", limit=1)[0]
messages = [{"role": "user", "content": prompt.text}]
ids = host.encode_chat(messages)
engine = host.engine_for(PLAIN).engine
cfg = GenerationConfig(max_new_tokens=128, temperature=0.0)
body = {"messages": messages, "max_tokens": 128, "temperature": 0, "stream": False, "speculation": {"drafter": "none"}}
me = os.getpid()
for r in range(rounds):
    a = snap(me)
    t0 = time.perf_counter()
    res = engine.generate(ids, cfg)
    wall = time.perf_counter() - t0
    s = res.stats
    tpot = (s.total_ms - s.ttft_ms) / max(1, s.new_tokens - 1)
    print(json.dumps({"round": r, "where": "in-process", "tokens": s.new_tokens, "tpot_ms": round(tpot, 2),
                      "wall_s": round(wall, 2), "threads (tid, name, cpu s, vol, nonvol)": delta(a, snap(me))}),
          flush=True)
    a, c = snap(pid), snap(me)
    with httpx.Client(timeout=600) as client:
        o = client.post(url + "/v1/chat/completions", json=body).json()
    sp = o["speculation"]
    print(json.dumps({"round": r, "where": "server", "tokens": o["usage"]["completion_tokens"],
                      "tpot_ms": sp["tpot_ms"], "threads (tid, name, cpu s, vol, nonvol)": delta(a, snap(pid)),
                      "client process": delta(c, snap(me))}), flush=True)
