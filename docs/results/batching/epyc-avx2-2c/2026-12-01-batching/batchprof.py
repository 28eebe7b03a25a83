"""Issue 12: where does a speculative-mode batch of 4 spend time when no row drafts? Steps timed per mode; cProfile
of the speculative mode's Python work outside the forward."""
import cProfile, pstats, statistics, sys, time
from adaspec.server.runtime import ModelHost, PLAIN
from adaspec.engine import GenerationConfig
from adaspec.workloads import load_workload
from adaspec.models import DEFAULT_TARGET
host = ModelHost.load(DEFAULT_TARGET, "hybrid", threads=2, backend="auto", max_batch=4)
host.warmup()
host.calibrate_batch()
eng = host.batch
prompts = [host.encode_chat([{"role": "user", "content": p.text[:300]}]) for p in load_workload("humaneval", limit=4)]
cfg = GenerationConfig(max_new_tokens=48, temperature=0.0, ignore_eos=True)
def run(settings, prof=None):
    h = host.engine_for(settings)
    for ids in prompts:
        eng.add(ids, cfg, drafter_for=h.drafter_for, controller_factory=h.new_controller)
    steps, fwd = [], []
    while eng:
        t = time.perf_counter()
        if prof: prof.enable()
        eng.step()
        if prof: prof.disable()
        steps.append((time.perf_counter() - t) * 1e3); fwd.append(eng.last_forward_ms)
    body = [(s, f) for s, f in zip(steps, fwd) if eng.last_rows][5:-5]
    return round(statistics.median(s for s, f in body), 1), round(statistics.median(f for s, f in body), 1)
for i in range(3):
    print("speculative step/forward ms", run(host.default), eng.last_cap, flush=True)
    print("plain       step/forward ms", run(PLAIN), flush=True)
