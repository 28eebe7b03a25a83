"""Would a byte-level prompt lookup pay? A replay of recorded greedy outputs, no model run.

A JSON value copied from the prompt often starts with a token the prompt does not hold: the answer writes
``"has_close_elements"`` where the prompt has ``def has_close_elements`` (``has`` against `` has``), so token-level
lookups (suffix decoding, n-gram) find nothing for a step or two. The fallback tried here searches the prompt's
*bytes* for the answer's last tokens (1..8 of them, at least ``min_bytes`` bytes, starting at a word start in both
texts, latest occurrence) and drafts the prompt's tokens after the match (re-tokenising the rest of a token the match
ends inside). It proposes only where the suffix drafter has nothing.

The replay feeds each recorded output (plain decoding's ``token_ids``) through the grammar's forced tokens (structured
tasks) and a drafter, accepts the longest prefix the output agrees with plus one token, and counts steps; a step's
time is modelled from a verification curve t_v(width): the Zen 4's measured one, or the Zen 5's (26 + 6.5 ms per
further token). Greedy outputs do not depend on the drafter, so the replay is exact in steps and widths; the times
are a model (no draft cost: both drafters are lookups).

    python docs/results/structured/respell_replay.py STRUCTURED.jsonl AGENTIC.jsonl > replay.txt
"""

from __future__ import annotations

import bisect
import json
import sys

import torch

from adaspec.drafters.base import Draft
from adaspec.drafters.suffix import SuffixDrafter
from adaspec.models import resolve_gguf
from adaspec.structured.vocab import GrammarVocab
from adaspec.structured_workload import load_tasks
from adaspec.workloads import load_workload

CURVES = {  # t_v(width) in ms, width 1..9; wider steps extrapolated by the last difference
    "zen4 (measured)": [40, 58, 66, 78, 95, 98, 112, 127, 140],
    "zen5 (26 + 6.5/token)": [26 + 6.5 * i for i in range(9)],
}


def t_v(curve: list[float], width: int) -> float:
    return curve[width - 1] if width <= len(curve) else curve[-1] + (width - len(curve)) * (curve[-1] - curve[-2])


def is_word(byte: int) -> bool:
    return byte >= 128 or chr(byte).isalnum() or byte == 95


class ByteFallback(SuffixDrafter):
    """The suffix drafter, and where it has nothing, a lookup of the answer's last tokens in the prompt's bytes."""

    def __init__(self, token_bytes, encode, min_bytes: int = 2, **kw) -> None:
        super().__init__(**kw)
        self.token_bytes, self.encode, self.min_bytes = token_bytes, encode, min_bytes
        self.fallbacks = [0, 0]  # proposals, drafted tokens

    def prefill(self, prompt_ids: list[int]) -> None:
        super().prefill(prompt_ids)
        pieces = [self.token_bytes(t) for t in prompt_ids]
        self.text = b"".join(pieces)
        self.ends = [0] * len(pieces)
        end = 0
        for i, piece in enumerate(pieces):
            end += len(piece)
            self.ends[i] = end

    def propose(self, ids, k, sampling, generator=None, stop=None) -> Draft:
        draft = super().propose(ids, k, sampling, generator, stop)
        if len(draft.tokens) or k <= 0:
            return draft
        tail = ids[len(self._prompt):]
        best, frag = None, b""
        for j in range(1, min(8, len(tail)) + 1):
            frag = self.token_bytes(tail[-j]) + frag
            before = self.token_bytes(tail[-j - 1])[-1:] if j < len(tail) else b""
            if len(frag) < self.min_bytes or (before and is_word(before[0]) and is_word(frag[0])):
                continue
            s = self.text.rfind(frag)
            while s > 0 and is_word(self.text[s - 1]) and is_word(frag[0]):
                s = self.text.rfind(frag, 0, s + len(frag) - 1)
            if s >= 0:
                best = s + len(frag)
        if best is None:
            return draft
        i = bisect.bisect_left(self.ends, best)
        if i >= len(self.ends) - 1:
            return draft
        if self.ends[i] == best:
            cont = self._prompt[i + 1:i + 1 + k]
        else:
            try:
                rest = self.text[best:self.ends[i]].decode()
            except UnicodeDecodeError:
                return draft
            cont = (self.encode(rest) + self._prompt[i + 1:i + 1 + k])[:k]
        if not cont:
            return draft
        self.fallbacks[0] += 1
        self.fallbacks[1] += len(cont)
        return Draft(torch.tensor(cont, dtype=torch.long))


def replay(drafter, items, k: int = 8) -> tuple[int, int, list[int], dict[str, float]]:
    """Steps, tokens, per-step widths summed into modelled seconds per curve."""
    steps = tokens = 0
    ms = dict.fromkeys(CURVES, 0.0)
    for prompt, out, grammar in items:
        drafter.prefill(prompt)
        p = 0
        while p < len(out):
            forced = grammar.forced()[:16] if grammar is not None else []
            proposal = forced + drafter.propose(prompt + out[:p] + forced, k, None).tokens.tolist()
            a = 0
            while a < len(proposal) and p + a < len(out) and proposal[a] == out[p + a]:
                a += 1
            n = min(a + 1, len(out) - p)
            if grammar is not None:
                grammar.advance(out[p:p + n])
            for name, curve in CURVES.items():
                ms[name] += t_v(curve, len(proposal) + 1)
            p += n
            steps += 1
        drafter.finish(prompt + out)
        tokens += len(out)
    return steps, tokens, {name: v / 1e3 for name, v in ms.items()}


def main(structured_rows: str, agentic_rows: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(resolve_gguf("qwen2.5-coder-1.5b-instruct")[2]))
    vocab = GrammarVocab.from_tokenizer(tok, 151936, [tok.convert_tokens_to_ids("<|im_end|>")])
    cache: dict[int, bytes] = {}

    def token_bytes(t: int) -> bytes:
        if t not in cache:
            cache[t] = vocab.tokenizer.decode_bytes([t])
        return cache[t]

    def chat(messages, tools=None) -> list[int]:
        text = tok.apply_chat_template(list(messages), tools=tools, add_generation_prompt=True, tokenize=False)
        return tok(text, add_special_tokens=False)["input_ids"]

    plain = {json.loads(x)["task"]: json.loads(x) for x in open(structured_rows) if '"method": "plain"' in x}

    def structured():
        return [(chat(t.messages, t.template_tools), plain[t.id]["token_ids"], vocab.compile(t.constraint).start())
                for t in load_tasks(None) if t.id in plain]

    rows = [json.loads(x) for x in open(agentic_rows) if '"method": "plain"' in x]
    prompts = {p.id: p for p in load_workload("agentic")}
    agentic = [(chat(prompts[r["prompt_id"]].messages or [{"role": "user", "content": prompts[r["prompt_id"]].text}]),
                r["token_ids"], None) for r in rows]
    for name, items in (("structured", structured), ("agentic", lambda: agentic)):
        for label, make in (("suffix", lambda: SuffixDrafter(tokenizer=tok)),
                            ("suffix + byte fallback", lambda: ByteFallback(
                                token_bytes, lambda s: tok.encode(s, add_special_tokens=False), tokenizer=tok))):
            d = make()
            steps, tokens, secs = replay(d, items())
            extra = f", fallback proposals {d.fallbacks[0]} ({d.fallbacks[1]} tokens)" if hasattr(d, "fallbacks") else ""
            print(f"{name:10s} {label:24s} steps {steps:4d} for {tokens} tokens (tau {tokens / steps:.3f}); modelled s: "
                  + ", ".join(f"{c} {s:.2f}" for c, s in secs.items()) + extra)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
