"""What compacting a multi-sequence ik_llama.cpp cache after every truncation costs (GgufBackend.compacts_holes).

Four rows of ``--context`` tokens each in one cache (the default target, 2 threads); per step every row feeds its
last token and 3 drafts, and 2 of the drafts are rejected (a truncation per row), as in a batch server step.
Reports the step's forward time and the truncations' time with and without compaction, interleaved, in ms.
Usage: python docs/results/server-hardening/compaction.py [--context 1000] [--steps 40] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time

from adaspec.api import load_model
from adaspec.backends.base import BatchRow
from adaspec.models.registry import DEFAULT_TARGET


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=DEFAULT_TARGET)
    p.add_argument("--context", type=int, default=1000)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    b = load_model(f"{a.model}@ik", progress=False, threads=a.threads, max_sequences=4).backend
    for s in range(4):
        b.forward_batch([BatchRow(s, [(17 * i + s) % 5000 + 100 for i in range(a.context)], 1)])
    times: dict[bool, dict[str, list[float]]] = {on: {"forward_ms": [], "truncate_ms": []} for on in (False, True)}
    for step in range(a.steps):
        for on in (False, True):  # interleaved
            type(b).compacts_holes = on
            rows = [BatchRow(s, [(step * 7 + s + j) % 5000 + 100 for j in range(4)], 4) for s in range(4)]
            t = time.perf_counter()
            b.forward_batch(rows)
            t1 = time.perf_counter()
            for s in range(4):
                b.truncate_seq(s, b.seq_len_of(s) - 2)  # 2 of 3 drafts rejected
            t2 = time.perf_counter()
            for s in range(4):  # back to the same lengths for the next round
                b.truncate_seq(s, a.context)
            times[on]["forward_ms"].append((t1 - t) * 1e3)
            times[on]["truncate_ms"].append((t2 - t1) * 1e3)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {"model": a.model, "context_per_row": a.context, "rows": 4, "steps": a.steps, "threads": a.threads,
              "commit": commit, "cpu": platform.processor() or platform.machine(),
              **{("with" if on else "without") + "_compaction": {k: round(statistics.median(v), 3)
                                                                for k, v in times[on].items()} for on in (False, True)}}
    print(json.dumps(result, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
