"""Replay recorded answers through the suffix drafter alone, views on and off: tokens per step and the drafter's own
time per step (no target: a lookup's cost and reach, not a speedup).

    PYTHONPATH=src python docs/results/suffix/views_replay.py RUN/agent-code-128.jsonl TOKENIZER_DIR [--k 8]

For each recorded plain answer of the file (its prompt rebuilt from the agentic workload with the target's chat
template), a fresh drafter (no global cache: the prompt and the answer so far only) proposes up to K tokens at each
step; the longest prefix equal to the recorded answer is accepted plus one token, as greedy verification would.
"""

import argparse
import json
import time

from transformers import AutoTokenizer

from adaspec.agentic import agentic_prompts
from adaspec.drafters.suffix import suffix_from_spec
from adaspec.sampling import SamplingParams

ap = argparse.ArgumentParser()
ap.add_argument("jsonl")
ap.add_argument("tokenizer")
ap.add_argument("--k", type=int, default=8)
a = ap.parse_args()
tok = AutoTokenizer.from_pretrained(a.tokenizer)
prompts = {f"{p.category}:{p.id}" if ":" not in p.id else p.id: p for p in agentic_prompts()}
rows = [r for r in map(json.loads, open(a.jsonl)) if r["method"] == "plain"]
print(f"{a.jsonl}: {len(rows)} recorded plain answers, K = {a.k}\n")
print("| drafter | tokens | steps | tokens per step | drafter ms per step |")
print("|---|---:|---:|---:|---:|")
for spec in ("suffix:tokens=0", "suffix:tokens=0;views=0"):
    tokens = steps = 0
    seconds = 0.0
    for r in rows:
        p = prompts[r["prompt_id"]]
        ids = tok(tok.apply_chat_template(list(p.messages), add_generation_prompt=True, tokenize=False),
                  add_special_tokens=False)["input_ids"]
        out = r["token_ids"]
        d = suffix_from_spec(spec, tokenizer=tok)
        t0 = time.perf_counter()
        d.prefill(list(ids))
        seconds += time.perf_counter() - t0
        i = 0
        while i < len(out):
            seq = list(ids) + out[:i]
            t0 = time.perf_counter()
            draft = d.propose(seq, a.k, SamplingParams()).tokens.tolist()
            seconds += time.perf_counter() - t0
            n = 0
            while n < len(draft) and i + n < len(out) and draft[n] == out[i + n]:
                n += 1
            i += n + 1
            steps += 1
        tokens += len(out)
    print(f"| `{spec}` | {tokens} | {steps} | {tokens / steps:.2f} | {1e3 * seconds / steps:.2f} |")
