"""ik_llama.cpp's one-token step and 5-token verification with and without a second GGUF runtime in the process.

Each mode runs in its own process; modes are interleaved and repeated. Modes:
  ik          ik_llama.cpp alone (the target, 1.5B Q4_K_M)
  ik+lc       llama-cpp-python's library loaded too, with the 0.5B draft open (LlamaCppBackend), unused
  ik+lc-alt   ik and llama.cpp steps alternating (a mixed pair: --target X@ik --draft Y@llamacpp)
  ik+llama    llama-cpp-python's high-level Llama loaded on the 1.5B and run once (compare's llamacpp:pld peer)
Usage: python measure.py OUT.jsonl [ROUNDS]   (prints a markdown table; the machine must be otherwise idle)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODES = ("ik", "ik+lc", "ik+lc-alt", "ik+llama")
CACHE = Path(os.environ.get("ADASPEC_CACHE", Path.home() / ".cache" / "adaspec")) / "gguf"


def child(mode: str) -> dict:
    from adaspec.backends.ik_backend import IkLlamaBackend

    target, draft = CACHE / "qwen2.5-coder-1.5b-instruct.gguf", CACHE / "qwen2.5-coder-0.5b-instruct.gguf"
    ids = list(range(1000, 1300))
    ik = IkLlamaBackend(target, threads=2)
    ik.forward(ids)
    other = None
    if mode in ("ik+lc", "ik+lc-alt"):
        from adaspec.backends.llamacpp_backend import LlamaCppBackend

        lc = LlamaCppBackend(draft, threads=2)
        lc.forward(ids)
        if mode == "ik+lc-alt":
            def other():
                lc.forward([1500])
                lc.truncate(300)
    elif mode == "ik+llama":
        import llama_cpp

        llm = llama_cpp.Llama(model_path=str(target), n_ctx=2048, n_threads=2, verbose=False)
        llm("def fib(n):", max_tokens=8)

    def timed(n_tokens: int, reps: int) -> float:
        out = []
        for _ in range(reps):
            if other is not None:
                other()
            t = time.perf_counter()
            ik.forward(list(range(1500, 1500 + n_tokens)), num_logits=n_tokens)
            out.append((time.perf_counter() - t) * 1e3)
            ik.truncate(300)
        return statistics.median(out)

    timed(1, 2)
    return {"mode": mode, "step_ms": timed(1, 12), "verify5_ms": timed(5, 8)}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2])))
        return
    out = Path(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    rows = []
    for r in range(rounds):
        for mode in MODES:
            run = subprocess.run([sys.executable, __file__, "--child", mode], capture_output=True, text=True)
            if run.returncode != 0:
                row = {"mode": mode, "error": run.stderr.strip().splitlines()[-1:]}
            else:
                row = json.loads(run.stdout.strip().splitlines()[-1])
            row["round"] = r
            rows.append(row)
            with open(out, "a") as f:
                f.write(json.dumps(row) + "\n")
    print("| mode | one-token step ms (median of rounds) | 5-token verify ms | step / alone | verify / alone |")
    print("|---|---:|---:|---:|---:|")
    med = {m: (statistics.median(r["step_ms"] for r in rows if r["mode"] == m and "step_ms" in r),
               statistics.median(r["verify5_ms"] for r in rows if r["mode"] == m and "verify5_ms" in r))
           for m in MODES}
    for m, (s, v) in med.items():
        print(f"| {m} | {s:.1f} | {v:.1f} | {s / med['ik'][0]:.3f} | {v / med['ik'][1]:.3f} |")


if __name__ == "__main__":
    main()
