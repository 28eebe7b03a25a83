"""Verification: accept or reject a drafted block against the target's distributions.

Two pure functions, one per decoding mode, each returning how many draft tokens were accepted and the one extra
token the target contributes (the correction on a rejection, the bonus token when every draft was accepted).

* Greedy: accept the longest prefix where the draft equals the target's argmax. The output is exactly the
  target's own greedy continuation given the same logits.
* Sampling: speculative sampling, Leviathan et al. 2023 ("Fast Inference from Transformers via Speculative
  Decoding", Algorithm 1) and Chen et al. 2023 ("Accelerating LLM Decoding with Speculative Sampling",
  Algorithm 2). Token i is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection the
  correction is drawn from norm(max(p_i - q_i, 0)); if all K are accepted a bonus token is drawn from p_{K+1}.
  The emitted tokens are distributed exactly as the target's samples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from adaspec.drafters.base import Draft
from adaspec.sampling import SamplingParams, logits_to_probs, sample


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """Greedy verification.

    Args:
        draft_tokens: ``[K]`` int64 drafted ids (K may be 0).
        target_logits: ``[K + 1, V]`` target logits; row i scores the position after draft token i
            (row 0 follows the last accepted token).

    Returns:
        ``(n_accepted, next_token)``: 0 <= n_accepted <= K, and the target's argmax at row n_accepted.
    """
    target_ids = target_logits.argmax(dim=-1)  # [K + 1]
    k = draft_tokens.shape[0]
    mismatch = (draft_tokens != target_ids[:k]).int()
    # Index of the first mismatch, or K when all match: cumsum is 0 exactly on the accepted prefix.
    n_accepted = int((mismatch.cumsum(0) == 0).sum())
    return n_accepted, int(target_ids[n_accepted])


def verify_sampling(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[int, int]:
    """Speculative (rejection) sampling.

    Args:
        draft_tokens: ``[K]`` int64 drafted ids.
        draft_probs: ``[K, V]`` float32 draft distributions q the tokens were sampled from, already transformed
            by the same temperature/top-k/top-p as ``target_probs``; ``None`` for a deterministic drafter
            (n-gram lookup), which is treated as q = one-hot(draft token).
        target_probs: ``[K + 1, V]`` float32 target distributions p.
        generator: source of randomness (seeded for reproducibility).

    Returns:
        ``(n_accepted, next_token)`` with 0 <= n_accepted <= K.
    """
    k = draft_tokens.shape[0]
    if k == 0:
        return 0, int(sample(target_probs[0], generator))
    rows = torch.arange(k)
    p_draft = target_probs[rows, draft_tokens]  # [K]
    q_draft = draft_probs[rows, draft_tokens] if draft_probs is not None else torch.ones_like(p_draft)
    u = torch.rand(k, generator=generator)
    # Accept iff u < p/q  (q_draft > 0 because the token was sampled from q).
    accepted = u * q_draft < p_draft
    n_accepted = int((accepted.int().cumprod(0)).sum())
    if n_accepted == k:
        return k, int(sample(target_probs[k], generator))
    p = target_probs[n_accepted]
    if draft_probs is not None:
        residual = (p - draft_probs[n_accepted]).clamp_min(0.0)
    else:
        residual = p.clone()
        residual[draft_tokens[n_accepted]] = 0.0
    total = residual.sum()
    # total == 0 only when p == q exactly, in which case rejection has probability 0; fall back to p for safety.
    residual = residual / total if total > 0 else p
    return n_accepted, int(sample(residual, generator))


# Lossy acceptance ---------------------------------------------------------------------------------------------------
# These rules accept draft tokens the exact rules would reject, so the output is NOT the target's own (greedy) output
# nor distributed as its samples. They exist to measure the speed-quality trade-off (``adaspec eval``) and are never a
# default. Rejections and the bonus token still come from the target (its argmax, or a sample of p when sampling).

LOSSY_RULES: dict[str, float] = {"typical": 0.09, "topk": 3.0, "bild": 2.0}
"""Lossy acceptance rules and their default parameter:

* ``typical`` (ε): typical acceptance, Cai et al. 2024 ("Medusa", §2.3.1): accept draft token x when
  p(x) > min(ε, δ·exp(-H(p))) with δ = √ε (Medusa's defaults: posterior threshold 0.09, alpha 0.3).
* ``topk`` (k): lenient top-k acceptance: accept x when it is among the target's k most likely tokens.
* ``bild`` (nats): the rollback policy of Kim et al. 2023 ("Speculative Decoding with Big Little Decoder", §3.3):
  accept x unless the target's cross-entropy against it, -log p(x), exceeds the threshold.

p is the target's distribution after temperature/top-k/top-p when sampling, its softmax at temperature 1 in greedy
mode."""


def parse_lossy(spec: str) -> tuple[str, float]:
    """``"typical"`` / ``"topk:2"`` / ``"bild:1.5"`` → (rule, parameter).

    Raises:
        ValueError: unknown rule or an out-of-range parameter (names the choices / the range).
    """
    name, _, value = spec.partition(":")
    if name not in LOSSY_RULES:
        raise ValueError(f"unknown lossy acceptance rule {name!r}: choose one of {', '.join(LOSSY_RULES)}")
    try:
        param = float(value) if value else LOSSY_RULES[name]
    except ValueError:
        raise ValueError(f"bad parameter in {spec!r}: expected a number") from None
    if not math.isfinite(param):
        raise ValueError(f"bad parameter in {spec!r}: expected a finite number")
    if name == "typical" and not 0.0 < param < 1.0:
        raise ValueError(f"typical acceptance needs 0 < ε < 1, got {param}")
    if name == "topk" and (param != int(param) or param < 1):
        raise ValueError(f"top-k acceptance needs an integer k >= 1, got {param}")
    if name == "bild" and param <= 0.0:
        raise ValueError(f"BiLD acceptance needs a threshold > 0 nats, got {param}")
    return name, param


def verify_lossy(draft_tokens: torch.Tensor, target_probs: torch.Tensor, rule: str, param: float, *,
                 greedy: bool, generator: torch.Generator | None = None) -> tuple[int, int]:
    """Lossy verification (see :data:`LOSSY_RULES`): accept the longest prefix whose tokens pass ``rule``.

    Args:
        draft_tokens: ``[K]`` int64 drafted ids.
        target_probs: ``[K + 1, V]`` float32 target distributions p (row i follows draft token i - 1).
        rule, param: a rule of :data:`LOSSY_RULES` and its parameter (see :func:`parse_lossy`).
        greedy: the extra token is the target's argmax (else a sample of p at that row).
        generator: randomness for the extra token when sampling.

    Returns:
        ``(n_accepted, next_token)`` with 0 <= n_accepted <= K.
    """
    k = draft_tokens.shape[0]
    p = target_probs[:k]
    p_draft = p[torch.arange(k), draft_tokens] if k else p.new_zeros(0)
    if rule == "typical":
        entropy = -(p * p.clamp_min(1e-30).log()).sum(-1)
        ok = p_draft > torch.minimum(torch.full_like(entropy, param), param ** 0.5 * torch.exp(-entropy))
    elif rule == "topk":
        ok = (p > p_draft[:, None]).sum(-1) < int(param)  # fewer than k tokens strictly more likely
    elif rule == "bild":
        ok = -p_draft.clamp_min(1e-30).log() <= param
    else:
        raise ValueError(f"unknown lossy acceptance rule {rule!r}: choose one of {', '.join(LOSSY_RULES)}")
    n_accepted = int(ok.int().cumprod(0).sum())
    row = target_probs[n_accepted]
    token = int(row.argmax()) if greedy else int(sample(row, generator))
    return n_accepted, token


def decide(logits: torch.Tensor, draft: Draft, params: SamplingParams, generator: torch.Generator,
           lossy: tuple[str, float] | None = None) -> tuple[int, int]:
    """Verification of ``draft`` (K tokens) against the target's ``[K + 1, V]`` logits over ``[pending] + draft``:
    ``(n_accepted, next token)`` by the greedy rule, speculative sampling (Leviathan et al. 2023), or a lossy rule."""
    tokens = draft.tokens.tolist()
    if lossy is not None:
        probs, _ = common_width(logits.float().softmax(-1) if params.greedy else logits_to_probs(logits, params), None,
                                tokens)
        return verify_lossy(draft.tokens, probs, *lossy, greedy=params.greedy, generator=generator)
    if params.greedy:
        return verify_greedy(draft.tokens, logits)
    probs, q = common_width(logits_to_probs(logits, params), draft.probs, tokens)
    return verify_sampling(draft.tokens, q, probs, generator)

def in_vocab(tokens: torch.Tensor, vocab_size: int) -> list[int]:
    """Drafted ids as the target is fed them: a draft vocabulary wider than the target's may propose an id the target
    lacks; its target probability is 0, so it is always rejected, and the forward gets id 0 in its place (the rows
    after it are never used)."""
    return [t if t < vocab_size else 0 for t in tokens.tolist()]

def common_width(probs: torch.Tensor, draft_probs: torch.Tensor | None,
                 tokens: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Target ``[n, V_t]`` and draft ``[k, V_d]`` distributions zero-padded to one width, at least every drafted id
    + 1: vocabularies padded to other widths (Qwen2.5-0.5B's 151936 rows against 7B's 152064) then compare id by
    id, an id beyond the target's vocabulary has target probability 0 (always rejected), and neither side is
    renormalised (a cut would change q(x) and the residual)."""
    width = max(probs.shape[-1], draft_probs.shape[-1] if draft_probs is not None else 0,
                max(tokens, default=-1) + 1)

    def pad(x: torch.Tensor) -> torch.Tensor:
        return x if x.shape[-1] == width else torch.nn.functional.pad(x, (0, width - x.shape[-1]))

    return pad(probs), None if draft_probs is None else pad(draft_probs)
