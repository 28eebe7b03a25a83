"""The goodput controller with the draft model alone on the first two GSM8K prompts: K per step and, at a few steps,
the catch-up price it sees (behind = tokens the draft lacks, feed = ms per token, allow = the probe allowance in ms).
PYTHONPATH=src python docs/results/new-text/epyc-zen3-avx2-2c/2026-12-07-draft-alone/trace_probe.py (from the repository root). Its output, copied from the terminal, is trace.txt."""
from adaspec.api import load_model, make_drafter, set_threads, SpeculativeLM
from adaspec.controllers import GoodputController
from adaspec.engine import GenerationConfig, SpeculativeEngine
from adaspec.workloads import load_workload
from adaspec.controllers.costmodel import bucket_of
set_threads(2)
t = load_model("qwen2.5-coder-1.5b-instruct", backend="ik")
lm = SpeculativeLM(t, None, None)
d = make_drafter("qwen2.5-coder-0.5b-instruct-q4_0", t, backend="ik")
log = []
class Tr(GoodputController):
    def next_k(self):
        k = super().next_k()
        if not self.costs.measured:
            log.append(dict(k=k)); return k
        b = bucket_of(self.context_len); plain = self.costs.plain_step_ms(b)
        names = list(self.costs.draft) or ['?']
        n = names[0]
        behind = self.context_len - self.synced.get(n, 0)
        log.append(dict(k=k, ctx=self.context_len, behind=behind, feed=round(self.costs.feed_ms(n, b),2), td=self.costs.draft_ms(n,b), allow=round(self._probe_allowance(plain)), req=round(self.request_ms)))
        return k
e = SpeculativeEngine(t.backend, d, Tr(), tokenizer=t.tokenizer); e.warmup()
for p in load_workload("gsm8k", limit=2):
    ids = lm.encode(list(p.messages) if p.messages else p.text, chat=True)
    log.clear()
    r = e.generate(ids, GenerationConfig(max_new_tokens=128))
    s = r.stats
    print("prompt tokens", len(ids), "decode tok/s", round(s.new_tokens / (s.total_ms - s.prefill_ms) * 1e3, 1), "K", [l['k'] for l in log])
    for l in log[:3] + log[-2:]: print("  ", l)
