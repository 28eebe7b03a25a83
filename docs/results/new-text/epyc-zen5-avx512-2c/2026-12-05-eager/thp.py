import os, statistics, sys, time, json
from pathlib import Path
from adaspec.backends.ik_backend import IkLlamaBackend
CACHE = Path.home() / ".cache/adaspec/gguf"
name = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-1.5b-instruct.gguf"
ik = IkLlamaBackend(CACHE / name, threads=2)
ids = list(range(1000, 1300)); ik.forward(ids)
def timed(n, reps):
    out = []
    for _ in range(reps):
        t = time.perf_counter(); ik.forward(list(range(1500, 1500 + n)), num_logits=n); out.append((time.perf_counter() - t) * 1e3); ik.truncate(300)
    return statistics.median(out)
timed(1, 3)
r = {"tun": os.environ.get("GLIBC_TUNABLES", ""), "step": round(timed(1, 30), 2), "v8": round(timed(8, 10), 2)}
for line in open("/proc/self/smaps_rollup"):
    if line.startswith(("AnonHugePages", "Rss")): r[line.split(":")[0]] = line.split()[1]
print(json.dumps(r), flush=True)
