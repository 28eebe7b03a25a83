"""Sampling math shared by the target and the draft: logits → probabilities → token.

Pure functions over tensors, no model or cache state. Temperature, top-k and top-p are applied identically to
the target's and the draft's logits, which speculative sampling needs for its output distribution to equal the
target's (Leviathan et al. 2023, §2.3: "any sampling method that transforms logits can be applied to both").
The filters follow Hugging Face ``TopKLogitsWarper`` / ``TopPLogitsWarper`` / ``MinPLogitsWarper`` semantics (the
token that crosses the top-p mass is kept; min-p keeps tokens with probability >= min_p × the top token's, Nguyen
et al. 2024; at least one token always survives), applied in that order after the temperature.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from adaspec.errors import ConfigError


GREEDY_EPS = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen from logits.

    Attributes:
        temperature: 0 (anything below 1e-5) means greedy (argmax); otherwise logits are divided by it.
        top_k: keep the k most likely tokens (0 = off).
        top_p: keep the smallest set of tokens whose probability mass reaches top_p (1.0 = off).
        min_p: keep tokens whose probability is at least min_p times the most likely token's (0.0 = off).

    Raises:
        ConfigError: on a negative temperature or top_k, top_p outside (0, 1], or min_p outside [0, 1].
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ConfigError(f"min_p must be in [0, 1], got {self.min_p}")

    @property
    def greedy(self) -> bool:
        """Temperatures below 1e-5 are greedy (as in vLLM): dividing logits by them overflows to NaN."""
        return self.temperature < GREEDY_EPS


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Turn logits into the sampling distribution.

    Args:
        logits: ``[..., V]`` float logits (any float dtype).
        params: temperature / top-k / top-p. Greedy params give a one-hot distribution on the argmax.

    Returns:
        ``[..., V]`` float32 probabilities, each row summing to 1.
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    # a temperature below 1 can carry a logit near the float range's end (a repetition penalty near 0) to inf;
    # in place, on the new tensor (a second [rows, V] copy costs 4x as much)
    logits.clamp_(max=torch.finfo(torch.float32).max)
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=False)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        remove_sorted = cum <= (1.0 - params.top_p)
        remove_sorted[..., -1] = False  # always keep the most likely token
        remove = remove_sorted.scatter(-1, sorted_idx, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.min_p > 0.0:
        floor = params.min_p * probs.amax(-1, keepdim=True)
        probs = probs.masked_fill(probs < floor, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token id per row of ``probs`` (``[..., V]`` float) → ``[...]`` int64.

    Uses the exponential-race trick (argmax of p / Exp(1)), which is exact and needs no CUDA sync; a row that
    is one-hot returns its argmax.
    """
    noise = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return (probs / noise).argmax(dim=-1)


def pick_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """The token after a ``[V]`` logits row: argmax when greedy, else a sample from the processed distribution."""
    if params.greedy:
        return int(logits.argmax())
    return int(sample(logits_to_probs(logits, params), generator))
