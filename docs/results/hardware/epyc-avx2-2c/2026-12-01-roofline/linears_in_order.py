"""Issue 17, 2026-12-02: the fp32 Qwen2.5-0.5B forward (synthetic weights, 128-token context, 2 threads) against
its own 169 linear layers run in model order with nothing else (same weights, same widths). Usage:
OMP_NUM_THREADS=2 .venv/bin/python docs/results/issue17/cpu/linears_in_order.py float32"""
import statistics
import sys
import time

import torch
torch.set_num_threads(2)
from adaspec.models.synthetic import build_synthetic
dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "float32")
model = build_synthetic("synthetic:qwen2.5-0.5b", dtype=dtype)
model.eval()
def med(fn, r=7):
    fn(); ts = []
    for _ in range(r):
        t = time.perf_counter(); fn(); ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)
ws = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
print("linears", len(ws), sum(w.numel() for w in ws) / 1e9, "G")
with torch.inference_mode():
    for n in (1, 5):
        ids = torch.arange(100, 100 + 128).unsqueeze(0)
        from transformers import DynamicCache
        def fwd():
            cache = DynamicCache()
            model(input_ids=ids[:, :128 - n], past_key_values=cache, use_cache=True)
            return cache
        cache = fwd()
        tail = ids[:, 128 - n:]
        def step():
            model(input_ids=tail, past_key_values=cache, use_cache=True, logits_to_keep=n)
            cache.crop(-n)
        x = {d: torch.randn(n, d, dtype=dtype) for d in (896, 4864)}
        def lin():
            for w in ws:
                torch.nn.functional.linear(x[w.shape[1]], w)
        print(n, "model forward", round(med(step), 1), "its linears in order", round(med(lin), 1))
