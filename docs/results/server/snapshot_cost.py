"""Time Backend.snapshot / Backend.restore (the prefix cache's stored copies) against a prefill of the same tokens.

Usage: PYTHONPATH=src python docs/results/server/snapshot_cost.py OUT.json [MODEL] [TOKENS ...]
(default: the zoo's target on ik_llama.cpp, 2 threads, 256 / 700 / 2000 tokens; 5 repeats each; quiet machine).
"""

import json
import platform
import statistics
import sys
import time

from adaspec.api import load_model


def main() -> None:
    out = sys.argv[1]
    model = sys.argv[2] if len(sys.argv) > 2 else "qwen2.5-coder-1.5b-instruct@ik"
    sizes = [int(x) for x in sys.argv[3:]] or [256, 700, 2000]
    b = load_model(model, progress=False, threads=2).backend
    rows = []
    for n in sizes:
        ids = [(i * 7919) % 20000 + 100 for i in range(n)]
        prefill, snap_ms, restore_ms = [], [], []
        for _ in range(5):
            b.reset()
            t = time.perf_counter()
            b.forward(ids, 1)
            prefill.append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            snap = b.snapshot()
            snap_ms.append((time.perf_counter() - t) * 1e3)
            b.reset()
            t = time.perf_counter()
            b.restore(snap)
            restore_ms.append((time.perf_counter() - t) * 1e3)
        row = {"tokens": n, "bytes": snap.nbytes, "bytes_per_token": snap.nbytes / n,
               "prefill_ms": statistics.median(prefill), "snapshot_ms": statistics.median(snap_ms),
               "restore_ms": statistics.median(restore_ms)}
        rows.append(row)
        print(json.dumps(row))
    with open(out, "w") as f:
        json.dump({"model": model, "threads": 2, "machine": platform.platform(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
