"""Plain steps: engine.generate on the main thread vs a server Job (executor thread + asyncio loop consuming its
events, as adaspec serve does), alternated in one process."""
import asyncio, statistics, time
from adaspec.server.runtime import ModelHost, PLAIN, Job
from adaspec.server.metrics import ServerMetrics
from adaspec.engine import GenerationConfig
from adaspec.workloads import load_workload
from adaspec.models import DEFAULT_TARGET
host = ModelHost.load(DEFAULT_TARGET, "hybrid", threads=2, backend="auto")
host.warmup()
metrics = ServerMetrics("m")
p = load_workload("humaneval", limit=1)[0]
ids = host.encode_chat([{"role": "user", "content": p.text}])
handle = host.engine_for(PLAIN)
cfg = GenerationConfig(max_new_tokens=96, temperature=0.0)
def med(r): return round(statistics.median(s.total_ms for s in r.stats.steps), 1)
async def job_run():
    loop = asyncio.get_running_loop()
    now = time.monotonic()
    job = Job(host, handle, list(ids), cfg, now, now + 600, metrics, loop)
    fut = loop.run_in_executor(host.generate_executor, job.run)
    n = 0
    while True:
        kind, item = await job.events.get()
        n += 1
        if kind == "end":
            break
    await fut
    return med(job.result)
for i in range(5):
    a = med(handle.engine.generate(list(ids), cfg))
    b = asyncio.run(job_run())
    print("main", a, "job", b, flush=True)
