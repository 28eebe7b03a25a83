"""Issue 15 probe (2026-12-02): does decoding from a second thread slow ik_llama.cpp's OpenMP threads down?

libgomp spins a waiting thread for a long while (GOMP_SPINCOUNT) unless it manages more threads than there are CPUs;
then it spins only briefly and sleeps on a futex ("throttled"). Each thread that starts a parallel region gets its own
team, so decoding on the main thread (warm-up) and then on an executor thread (the server) leaves 2 teams of 2
threads on 2 CPUs. Plain decoding steps on the main thread, then on a second thread, then on the main thread again:
median step ms and the compute threads' voluntary context switches (futex sleeps).

    .venv/bin/python docs/results/issue15/omp_teams.py
"""
import json
import os
import statistics
import threading

from adaspec.engine import GenerationConfig
from adaspec.models import DEFAULT_TARGET
from adaspec.server.runtime import PLAIN, ModelHost
from adaspec.workloads import load_workload


def switches():
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            text = open(f"/proc/self/task/{t}/status").read()
        except OSError:  # a thread that ended meanwhile
            continue
        fields = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
        out[int(t)] = int(fields["voluntary_ctxt_switches"])
    return out


host = ModelHost.load(DEFAULT_TARGET, "none", threads=2, backend="auto")
prompt = load_workload("humaneval", limit=1)[0]
ids = host.encode_chat([{"role": "user", "content": prompt.text}])
engine = host.engine_for(PLAIN).engine
cfg = GenerationConfig(max_new_tokens=96, temperature=0.0)


def run(where):
    box = {}
    before = switches()
    if where == "main":
        box["r"] = engine.generate(ids, cfg)
    else:
        t = threading.Thread(target=lambda: box.update(r=engine.generate(ids, cfg)))
        t.start()
        t.join()
    after = switches()
    vol = sum(after[t] - before.get(t, 0) for t in after)
    steps = [s.total_ms for s in box["r"].stats.steps]
    print(json.dumps({"where": where, "median_step_ms": round(statistics.median(steps), 1), "steps": len(steps),
                      "voluntary_switches": vol}), flush=True)


for where in ("main", "main", "thread", "main", "thread", "main"):
    run(where)
