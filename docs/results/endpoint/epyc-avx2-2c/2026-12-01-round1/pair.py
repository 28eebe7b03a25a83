import statistics
from adaspec.server.runtime import ModelHost, PLAIN
from adaspec.engine import SpeculativeEngine, GenerationConfig
from adaspec.workloads import load_workload
from adaspec.models import DEFAULT_TARGET
host = ModelHost.load(DEFAULT_TARGET, "hybrid", threads=2, backend="auto")
host.warmup()
p = load_workload("humaneval", limit=1)[0]
ids = host.encode_chat([{"role": "user", "content": p.text}])
t = host.target
ids2 = t.tokenizer.apply_chat_template([{"role": "user", "content": p.text}], add_generation_prompt=True, tokenize=True)
ids2 = ids2["input_ids"] if not isinstance(ids2, list) else ids2
print(len(ids), len(ids2), ids == list(ids2), flush=True)
heng = host.engine_for(PLAIN).engine
raw = SpeculativeEngine(t.backend, None, None, tokenizer=t.tokenizer)
cfg = GenerationConfig(max_new_tokens=64, temperature=0.0)
def med(e): return round(statistics.median(s.total_ms for s in e.generate(list(ids), cfg).stats.steps), 1)
for i in range(5):
    print("host", med(heng), "raw", med(raw), flush=True)
