"""Time verification-like forwards of n tokens on the ik_llama.cpp build importable here; append one JSON line.

    python docs/results/ik-native/curve.py --label wheel --out curves.jsonl [--model qwen2.5-coder-1.5b-instruct]

Each width n: ``measure_verify_curve`` (forward of n tokens with n logits + argmax + truncate back) at 200 tokens of
context, median of --repeats samples. The line records the build's SIMD (its ``llama_print_system_info``), so
which build ran is in the file, not only in the label.
"""

import argparse
import json
import time

from adaspec import api
from adaspec.backends.costcurve import measure_verify_curve
from adaspec.backends.cpu import cpu_label

p = argparse.ArgumentParser()
p.add_argument("--label", required=True)
p.add_argument("--out", required=True)
p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
p.add_argument("--threads", type=int, default=2)
p.add_argument("--repeats", type=int, default=5)
p.add_argument("--widths", default="1,2,4,6,8,12,16,24,32")
args = p.parse_args()
api.set_threads(args.threads)
m = api.load_model(args.model, backend="ik", threads=args.threads, progress=False)
widths = [int(w) for w in args.widths.split(",")]
curve = measure_verify_curve(m.backend, widths=widths, context_len=200, repeats=args.repeats)
row = {"label": args.label, "model": m.name, "simd": m.backend.simd, "cpu": cpu_label(), "threads": args.threads,
       "context": 200, "repeats": args.repeats, "ms": {str(n): round(v, 2) for n, v in curve.items()},
       "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
with open(args.out, "a") as f:
    f.write(json.dumps(row) + "\n")
print(json.dumps(row))
