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

import torch

from adaspec.sampling import sample


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
