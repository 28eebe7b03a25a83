"""probe_budget capped (the default, 8 plain steps) against uncapped (1e9), alternated per prompt with plain decoding,
in one process: make demo's prompt and the last 3 Spec-Bench coding and writing prompts, 128 tokens, two passes.
PYTHONPATH=src python budget_ab.py rows.jsonl (from the repository root)."""
import json
import sys
from adaspec.api import load_model, make_drafter, set_threads, SpeculativeLM
from adaspec.controllers import GoodputController
from adaspec.defaults import DEFAULT_DRAFTER
from adaspec.engine import GenerationConfig, SpeculativeEngine
from adaspec.workloads import load_workload
set_threads(2)
t = load_model("qwen2.5-coder-1.5b-instruct", backend="ik")
lm = SpeculativeLM(t, None, None)
d = make_drafter(DEFAULT_DRAFTER, t, backend="ik")
arms = {"default": GoodputController(), "no-cap": GoodputController(probe_budget=1e9)}
engines = {k: SpeculativeEngine(t.backend, d, c, tokenizer=t.tokenizer) for k, c in arms.items()}
plain = SpeculativeEngine(t.backend, None, None, tokenizer=t.tokenizer)
for e in [*engines.values(), plain]: e.warmup()
P = "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring and type hints."
prompts = [("demo", [{"role": "user", "content": P}])]
for wl in ("specbench:coding", "specbench:writing"):
    try:
        for p in load_workload(wl)[-3:]:
            prompts.append((wl, list(p.messages) if p.messages else [{"role": "user", "content": p.text}]))
    except Exception as ex:
        print("workload", wl, ex, file=sys.stderr)
out = open(sys.argv[1], "a")
for rnd in range(2):
    for i, (fam, msgs) in enumerate(prompts):
        ids = lm.encode(msgs, chat=True)
        order = ["plain", "default", "no-cap"] if (i + rnd) % 2 == 0 else ["plain", "no-cap", "default"]
        for arm in order:
            e = plain if arm == "plain" else engines[arm]
            r = e.generate(ids, GenerationConfig(max_new_tokens=128, cache_partition=f"{arm}-{rnd}-{i}"))
            s = r.stats
            row = dict(rnd=rnd, i=i, fam=fam, arm=arm, decode=s.new_tokens / (s.total_ms - s.prefill_ms) * 1e3,
                       drafters=sorted({st.drafter[:6] for st in s.steps if st.drafted}))
            out.write(json.dumps(row) + "\n"); out.flush(); print(row)
