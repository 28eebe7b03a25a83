"""CPU seconds per server thread during one plain request (streamed, then non-streamed)."""
import json, os, sys, time, httpx
pid, url = int(sys.argv[1]), sys.argv[2]
from adaspec.workloads import load_workload
p = load_workload("humaneval", limit=1)[0]
tick = os.sysconf("SC_CLK_TCK")
def snap():
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            f = open(f"/proc/{pid}/task/{t}/stat").read()
            name = open(f"/proc/{pid}/task/{t}/comm").read().strip()
        except OSError:
            continue
        parts = f.rsplit(")", 1)[1].split()
        out[(t, name)] = (int(parts[11]) + int(parts[12])) / tick
    return out
def self_cpu():
    t = os.times(); return t.user + t.system
for stream in (True, False, True, False):
    body = {"messages": [{"role": "user", "content": p.text}], "max_tokens": 128, "temperature": 0, "stream": stream,
            "speculation": {"drafter": "none"}}
    a, c0, w0 = snap(), self_cpu(), time.perf_counter()
    with httpx.Client(timeout=300) as c:
        if stream:
            with c.stream("POST", url + "/v1/chat/completions", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        o = json.loads(line[6:])
                        if o.get("speculation"): s = o["speculation"]
        else:
            s = c.post(url + "/v1/chat/completions", json=body).json()["speculation"]
    b, c1, w1 = snap(), self_cpu(), time.perf_counter()
    d = {k[1] + ":" + k[0]: round(b[k] - a.get(k, 0), 2) for k in b if b[k] - a.get(k, 0) > 0.005}
    print(f"stream={stream} wall {w1 - w0:.1f}s tpot {s['tpot_ms']} client cpu {c1 - c0:.2f}s server threads {d}", flush=True)
