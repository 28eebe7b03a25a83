"""Issue 12: does a single row's decode step in ik_llama.cpp cost more with a cache sized for 16 sequences, and
after rows have come and gone (cells spread over the unified cache)?"""
import statistics, sys, time
from adaspec.backends.ik_backend import IkLlamaBackend as IK
from adaspec.backends.base import BatchRow
from adaspec.models.assemble import gguf_path
from adaspec.models import DEFAULT_TARGET
path = gguf_path(DEFAULT_TARGET)
PROMPT = [(i * 7919) % 30000 + 100 for i in range(200)]

def single(b, seq=0, n=32):
    b.truncate_seq(seq, 0)
    b.forward_batch([BatchRow(seq, PROMPT, 1)])
    ts = []
    for i in range(n):
        t = time.perf_counter(); b.forward_batch([BatchRow(seq, [1000 + i], 1)]); ts.append((time.perf_counter() - t) * 1e3)
    b.truncate_seq(seq, 0)
    return round(statistics.median(ts), 1)

def churn(b, requests=24, rows=4, steps=24):
    """Requests through `rows` slots, staggered: each prefills 200 tokens, decodes `steps` batched steps."""
    live = {}  # seq -> steps left
    nxt, seqs = 0, list(range(1, 16))
    while nxt < requests or live:
        while len(live) < rows and nxt < requests:
            s = seqs[nxt % len(seqs)]; nxt += 1
            b.forward_batch([BatchRow(s, PROMPT[: 150 + 10 * (nxt % 6)], 1)])
            live[s] = steps - 5 * (nxt % 4)
        b.forward_batch([BatchRow(s, [2000], 1) for s in live])
        for s in list(live):
            live[s] -= 1
            if live[s] <= 0:
                b.truncate_seq(s, 0); del live[s]

one = IK(path, threads=2, max_sequences=1)
print("max_sequences=1:", single(one), single(one), flush=True)
del one
many = IK(path, threads=2, max_sequences=16)
print("max_sequences=16 fresh:", single(many), single(many), flush=True)
churn(many)
print("max_sequences=16 after churn:", single(many), single(many), flush=True)
churn(many, requests=48)
print("max_sequences=16 after more churn:", single(many), single(many), flush=True)
