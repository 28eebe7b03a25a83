"""Slow spells within one process: ik_llama.cpp's one-token step and 8-token forward, timed side by side for a while.

    PYTHONPATH=src .venv/bin/python docs/results/new-text/epyc-zen5-avx512-2c/2026-12-06-spells/spells.py [SECONDS] [LABEL]

Loads the default target (the zoo's Q4_K_M 1.5B, 2 threads) once, then repeatedly: 16 one-token forwards and 4
eight-token forwards at a 300-token context (each rolled back), printing one JSON line per round with the seconds
since start and the medians in ms. A one-token step is memory-bound on this CPU and an 8-token forward is
compute-bound: a slow spell of the host's memory shows in the first only."""
import json
import statistics
import sys
import time
from pathlib import Path

from adaspec.backends.ik_backend import IkLlamaBackend

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 240.0
label = sys.argv[2] if len(sys.argv) > 2 else ""
ik = IkLlamaBackend(Path.home() / ".cache/adaspec/gguf/qwen2.5-coder-1.5b-instruct.gguf", threads=2)
ik.forward(list(range(1000, 1300)))


def timed(n: int, reps: int) -> float:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        ik.forward(list(range(1500, 1500 + n)), num_logits=n)
        out.append((time.perf_counter() - t) * 1e3)
        ik.truncate(300)
    return round(statistics.median(out), 2)


timed(1, 4)
t0 = time.monotonic()
while time.monotonic() - t0 < seconds:
    print(json.dumps({"label": label, "t": round(time.monotonic() - t0, 1), "step": timed(1, 16), "v8": timed(8, 4)}),
          flush=True)
