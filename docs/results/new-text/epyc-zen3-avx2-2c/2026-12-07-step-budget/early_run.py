"""Where a fixed-K draft-model step's time goes on new text, against the i.i.d. prediction."""
import json, statistics, sys, time
from adaspec.api import SpeculativeLM, load_model, make_drafter, set_threads
from adaspec.controllers import FixedController
from adaspec.engine import GenerationConfig, SpeculativeEngine
from adaspec.models import DEFAULT_DRAFT
from adaspec.workloads import load_workload

set_threads(2)
target = load_model("qwen2.5-coder-1.5b-instruct", backend="ik")
lm = SpeculativeLM(target, None, None)
drafter = make_drafter(DEFAULT_DRAFT, target, backend="ik")
spec = SpeculativeEngine(target.backend, drafter, FixedController(3), tokenizer=target.tokenizer)
plain = SpeculativeEngine(target.backend, None, None, tokenizer=target.tokenizer)
for e in (spec, plain):
    e.warmup()
prompts = []
for w, take in (("gsm8k", (3, 6)), ("specbench:coding", (0, 3))):
    for p in load_workload(w)[slice(*take)]:
        prompts.append((w, list(p.messages) if p.messages else [{"role": "user", "content": p.text}]))
out = open(sys.argv[1], "w")
for w, msgs in prompts:
    ids = lm.encode(msgs, chat=True)
    for name, e in (("plain", plain), ("k3", spec)):
        drafter.forget()
        r = e.generate(ids, GenerationConfig(max_new_tokens=128))
        s = r.stats
        steps = [dict(k=st.k, d=st.drafted, a=st.accepted, e=st.emitted, ctx=st.context_len, draft=st.draft_ms,
                      verify=st.verify_ms, total=st.total_ms) for st in s.steps]
        row = dict(w=w, arm=name, prompt_len=len(ids), new=s.new_tokens, decode_ms=s.total_ms - s.prefill_ms,
                   steps=steps)
        out.write(json.dumps(row) + "\n"); out.flush()
        print(w, name, len(ids), round((s.new_tokens - 1) / (s.total_ms - s.prefill_ms) * 1e3, 2), flush=True)
