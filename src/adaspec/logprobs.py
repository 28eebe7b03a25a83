"""Log-probabilities of tokens under the target: per generated token, per prompt token, and top-1/top-2 margins.

Values are natural logs of the softmax of ``[n, V]`` logits, computed in float32 blocks of ``LOGPROB_ROWS`` rows so
a long prompt never holds a second ``[len(prompt), V]`` copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class TokenLogprob:
    """One token's log-probability (natural log) and the most likely alternatives at its position.

    Attributes:
        token_id: the token. logprob: its log-probability.
        top: ``[(token id, logprob)]``, most likely first (as many as asked for).
    """

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)

def token_logprobs(logits: torch.Tensor, tokens: Sequence[int], top: int | None) -> list[TokenLogprob] | None:
    """Row i of ``[n, V]`` logits scored ``tokens[i]``: its log-softmax value and the ``top`` best alternatives.
    None when ``top`` is None (logprobs not asked for)."""
    if top is None:
        return None
    out: list[TokenLogprob] = []
    for start in range(0, len(tokens), LOGPROB_ROWS):  # one [LOGPROB_ROWS, V] log-softmax copy at a time
        part = list(tokens[start:start + LOGPROB_ROWS])
        lp = logits[start:start + len(part)].float().log_softmax(-1)
        chosen = lp[torch.arange(len(part)), torch.tensor(part, dtype=torch.long)].tolist()
        items = [TokenLogprob(int(t), float(v)) for t, v in zip(part, chosen)]
        if top > 0:
            values, index = lp.topk(min(top, lp.shape[-1]), dim=-1)
            for item, vs, ix in zip(items, values.tolist(), index.tolist()):
                item.top = [(int(i), float(v)) for i, v in zip(ix, vs)]
        out += items
    return out

LOGPROB_ROWS = 64  # positions per log-softmax block in token_logprobs

SCORED_LOGITS_BYTES = 256 << 20  # default bound on the float32 logits a scored prefill holds at once

def score_rows(vocab_size: int, budget_bytes: int = SCORED_LOGITS_BYTES) -> int:
    """Positions of ``[n, vocab_size]`` float32 logits that fit ``budget_bytes`` (at least 1)."""
    return max(1, budget_bytes // (4 * max(1, vocab_size)))

def prompt_logprobs(logits: torch.Tensor, prompt: Sequence[int], top: int | None) -> list[TokenLogprob | None] | None:
    """Per prompt token, its log-probability under the model given the tokens before it (None for the first), from
    the prefill's ``[len(prompt), V]`` logits. None when ``top`` is None."""
    if top is None:
        return None
    return [None] + (token_logprobs(logits[:len(prompt) - 1], list(prompt[1:]), top) or [])

def top_margins(logits: torch.Tensor) -> list[float]:
    """Top-1 minus top-2 logit per row of ``[n, V]`` logits (logit units)."""
    top = logits.float().topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).tolist()
