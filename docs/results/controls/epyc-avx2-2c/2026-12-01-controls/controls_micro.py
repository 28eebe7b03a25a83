"""Issue 13: one LogitsControls.apply call at Qwen2.5's vocabulary (V = 151,936), the full-vocabulary implementation
of commit dcfa473 against the current one (columns of the tokens that occur), for K + 1 = 1 and 5 rows, prompts of
200, 4,000 and 32,000 tokens (ids drawn from a 30,000-token working vocabulary, as text reuses its words) and 200
generated tokens, 1 thread. Medians of 5 repeats of 20 calls, in ms per call; the same controls object is called
again and again, as within one request.

    .venv/bin/python docs/results/issue13/controls_micro.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import torch

from adaspec.processors import LogitsControls

OLD_COMMIT = "dcfa473"


def old_controls():
    source = subprocess.run(["git", "show", f"{OLD_COMMIT}:src/adaspec/processors.py"], capture_output=True,
                            text=True, check=True).stdout
    module = type(sys)("processors_dense")
    sys.modules[module.__name__] = module
    exec(compile(source, "processors_dense", "exec"), module.__dict__)
    return module.LogitsControls


def per_call_ms(controls, logits, ids, prompt_len, drafts, calls: int = 20, repeats: int = 5) -> float:
    for _ in range(3):
        controls.apply(logits, ids, prompt_len, drafts)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            controls.apply(logits, ids, prompt_len, drafts)
        times.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(times)


def main() -> None:
    torch.set_num_threads(1)
    vocab = 151_936
    gen = torch.Generator().manual_seed(0)
    dense = old_controls()
    print("| controls | prompt tokens | rows (K + 1) | full vocabulary (ms) | columns that occur (ms) |")
    print("|---|---:|---:|---:|---:|")
    for name, kw in [("presence 0.5 + frequency 0.5", dict(presence_penalty=0.5, frequency_penalty=0.5)),
                     ("repetition 1.1", dict(repetition_penalty=1.1))]:
        for prompt_len in (200, 4000, 32000):
            ids = torch.randint(0, 30000, (prompt_len + 200,), generator=gen).tolist()
            for rows in (1, 5):
                logits = torch.randn(rows, vocab, generator=gen)
                drafts = torch.randint(0, 30000, (rows - 1,), generator=gen)
                before = per_call_ms(dense(**kw), logits, ids, prompt_len, drafts)
                after = per_call_ms(LogitsControls(**kw), logits, ids, prompt_len, drafts)
                print(f"| {name} | {prompt_len} | {rows} | {before:.2f} | {after:.2f} |")


if __name__ == "__main__":
    main()
