"""The goodput controller on make demo's prompt, step by step: its predicted tokens/ms (G; Gp for a plain step) beside
each speculative step's realised tokens/ms, two requests in one process (the second finds the first answer in the
suffix cache). python docs/results/demo/trace_steps.py > trace.txt (from the repository root, PYTHONPATH=src)."""
from adaspec.api import load_model, make_drafter, set_threads, SpeculativeLM
from adaspec.controllers import GoodputController
from adaspec.defaults import DEFAULT_DRAFTER
from adaspec.engine import GenerationConfig, SpeculativeEngine
set_threads(2)
t = load_model("qwen2.5-coder-1.5b-instruct", backend="ik")
lm = SpeculativeLM(t, None, None)
d = make_drafter(DEFAULT_DRAFTER, t, backend="ik")
log = []
class Tr(GoodputController):
    def next_k(self):
        k = super().next_k(); lc = self.last_choice
        log.append(dict(k=k, name=lc[0], G=lc[2], Gp=lc[3], probing=self.probing[0] if self.probing else None, thr=None if self._thresholds is None else [round(x,2) for x in self._thresholds[:4]]))
        return k
    def update(self, s):
        super().update(s); log[-1].update(drafted=s.drafted, acc=s.accepted, d=round(s.draft_ms,1), v=round(s.verify_ms,1), t=round(s.total_ms,1), em=s.emitted, who=s.drafter[:6])
e = SpeculativeEngine(t.backend, d, Tr(), tokenizer=t.tokenizer); e.warmup()
P = "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring and type hints."
ids = lm.encode([{"role": "user", "content": P}], chat=True)
for rep in range(2):
    log.clear()
    r = e.generate(ids, GenerationConfig(max_new_tokens=128))
    s = r.stats
    print("rep", rep, "decode tok/s", round(s.new_tokens / (s.total_ms - s.prefill_ms) * 1e3, 1))
    c = e.controller
    print("draft costs", {k: (round(a,1), round(b,1)) for k, (a, b) in c.draft_costs().items()}, "fit", {k: tuple(round(x,1) for x in v) for k, v in c.costs.draft_fit.items()})
    print("verify", {n: round(c.costs.verify_ms(n, 0), 1) for n in range(1, 10)})
    for l in log:
        if l.get("drafted"):
            print("  ", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in l.items()}, "actual tok/ms", round(l["em"] / l["t"], 4))
