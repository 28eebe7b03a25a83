"""Ablation of the four controller changes on held-out-style prompts, one process, variants alternated per prompt."""
import json, statistics, sys, time
import adaspec
from adaspec.controllers.goodput import GoodputController
from adaspec.controllers.costmodel import MeasuredCosts
from adaspec.drafters.suffix import with_own_cache
from adaspec.engine import SpeculativeEngine, GenerationConfig
from adaspec.compare.run import _forget_drafts
from adaspec.workloads import load_workload

class NoFirst(GoodputController):
    def _probe_gap(self, name):
        return self.probe_gap.get(name, self.config.probe_init)
class OldStop(GoodputController):
    def _stop_thresholds(self, name, gain, b, k_top, alphas):
        per_token = self.costs.marginal_draft_ms(name, b) if self.costs.draft_ms(name, b) else 0.0
        verify = [self.costs.verify_ms(n, b) for n in range(1, k_top + 2)]
        return [gain * (per_token + max(verify[j + 2] - verify[j + 1], 0.0)) / max(alphas[j + 1], 1e-6) for j in range(k_top - 1)]
def nofit(c):
    c.costs._observe_pair = lambda *a: None
    return c
def oldall():
    class O(NoFirst, OldStop): pass
    return nofit(O(prefill_share=0.0))
VARIANTS = {
    "new": lambda: GoodputController(),
    "noeager": lambda: GoodputController(prefill_share=0.0),
    "nofirst": lambda: NoFirst(),
    "oldstop": lambda: OldStop(),
    "nofit": lambda: nofit(GoodputController()),
    "old": oldall,
}
names = sys.argv[2].split(",") if len(sys.argv) > 2 else list(VARIANTS)
lm = adaspec.load(threads=2, progress=False)
tok = lm.tokenizer
prompts = []
for w in ("humaneval", "gsm8k", "specbench:coding", "specbench:writing"):
    prompts += [(w, p) for p in load_workload(w, 2)]
engines = {"plain": SpeculativeEngine(lm.target.backend, None, None, tokenizer=tok)}
for n in names:
    engines[n] = SpeculativeEngine(lm.target.backend, with_own_cache(lm.engine.drafter), VARIANTS[n](), tokenizer=tok)
first = lm.encode(prompts[0][1].model_input(True))[:48]
for e in engines.values():
    e.warmup(first, steps=24)
cfg = GenerationConfig(max_new_tokens=128)
out = open(sys.argv[1], "a")
order = list(engines)
for i, (w, p) in enumerate(prompts):
    ids = lm.encode(p.model_input(True))
    for n in order[i % len(order):] + order[:i % len(order)]:
        e = engines[n]
        if e.drafter is not None:
            _forget_drafts(e.drafter)
        r = e.generate(ids, cfg)
        s = r.stats
        row = {"workload": w, "prompt": p.id, "variant": n, "decode_ms": s.total_ms - s.ttft_ms, "tokens": s.new_tokens - 1,
               "prefill_ms": s.prefill_ms, "draft_ms": s.draft_ms, "verify_ms": s.verify_ms, "k": s.k_trace if hasattr(s, "k_trace") else [x.k for x in s.steps]}
        out.write(json.dumps(row) + "\n"); out.flush()
