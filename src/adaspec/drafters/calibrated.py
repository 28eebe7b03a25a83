"""Calibrated drafter: acceptance dialled exactly, at a chosen cost. A measuring instrument, not a speed-up.

In greedy mode the target's next token along the sequence is known in advance: it is the target's own greedy
continuation of the prompt (greedy speculative decoding reproduces it), computed once by a plain run. At each
draft position the drafter proposes that token with probability α (a seeded coin) and otherwise a different,
plausible token (the target's second choice there, when known), so each draft position is accepted with
probability α given that the positions before it were: exactly the i.i.d. acceptance model of Leviathan et al. 2023.
Drafting costs ``cost_ms`` per token (a sleep), e.g. the measured per-token cost of a real draft model.

If the sequence leaves the reference path (in bf16 a near-tied argmax can flip between a one-token and a
(K+1)-token forward), the drafter no longer knows the target's token: it proposes "other" tokens from then on
and counts those positions in ``offpath`` so measurements can report or exclude them.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

import torch

from adaspec.drafters.base import Draft, Drafter, DraftStop, empty_draft
from adaspec.errors import ConfigError
from adaspec.sampling import SamplingParams


class CalibratedDrafter(Drafter):
    """Proposes the target's own greedy token with probability ``alpha``, another token otherwise.

    Args:
        reference: the target's greedy continuation of the prompt (token ids after the prompt).
        alpha: per-position acceptance probability in [0, 1].
        cost_ms: wall time charged per drafted token (slept), >= 0.
        alternatives: optional per-position "other" token (e.g. the target's second choice); must differ from
            ``reference`` where given. Missing or equal entries fall back to a neighbouring reference token.
        seed: seeds the coin (re-seeded by :meth:`prefill`, so every request sees the same coin sequence).
        vocab_size: bound for the last-resort "other" token.

    Counters (per request, reset by :meth:`prefill`): ``proposed_true`` / ``proposed_other`` positions and
    ``offpath`` positions drafted after the sequence left the reference.
    """

    name = "calibrated"

    def __init__(self, reference: Sequence[int], alpha: float, *, cost_ms: float = 0.0,
                 alternatives: Sequence[int] | None = None, seed: int = 0, vocab_size: int | None = None) -> None:
        if not 0.0 <= alpha <= 1.0:
            raise ConfigError(f"alpha must be in [0, 1], got {alpha}")
        if cost_ms < 0:
            raise ConfigError(f"cost_ms must be >= 0, got {cost_ms}")
        if not reference:
            raise ConfigError("the calibrated drafter needs a non-empty reference continuation")
        self.reference = [int(t) for t in reference]
        self.alpha = float(alpha)
        self.cost_ms = float(cost_ms)
        self.alternatives = [int(t) for t in alternatives] if alternatives is not None else None
        self.seed = seed
        self.vocab_size = vocab_size or (max(self.reference) + 2)
        self.name = f"calibrated:{alpha:g}"
        self.prefill([])

    def prefill(self, prompt_ids: list[int]) -> None:
        self.prompt_len = len(prompt_ids)
        self._rng = random.Random(self.seed)
        self.proposed_true = self.proposed_other = self.offpath = 0

    def _other(self, j: int) -> int:
        """A plausible token that differs from the reference token at output position ``j``."""
        true = self.reference[j] if j < len(self.reference) else None
        if self.alternatives is not None and j < len(self.alternatives) and self.alternatives[j] != true:
            return self.alternatives[j]
        for d in range(1, len(self.reference)):  # a real token from the same text, nearby
            for i in (j + d, j - d):
                if 0 <= i < len(self.reference) and self.reference[i] != true:
                    return self.reference[i]
        return (true + 1) % self.vocab_size if true is not None else 0

    def on_path(self, ids: list[int]) -> bool:
        """Whether the generated part of ``ids`` is a prefix of the reference continuation."""
        out = ids[self.prompt_len:]
        return out == self.reference[:len(out)]

    def propose(self, ids: list[int], k: int, sampling: SamplingParams, generator: torch.Generator | None = None,
                stop: DraftStop | None = None) -> Draft:
        if k <= 0:
            return empty_draft()
        if not sampling.greedy:
            raise ConfigError("the calibrated drafter is defined for greedy decoding (temperature 0) only")
        start = time.perf_counter()
        j = len(ids) - self.prompt_len
        known = self.on_path(ids)
        tokens = []
        for i in range(k):
            pos = j + i
            if known and pos < len(self.reference) and self._rng.random() < self.alpha:
                tokens.append(self.reference[pos])
                self.proposed_true += 1
            else:
                if not known:
                    self._rng.random()  # keep the coin sequence aligned with the on-path case
                    self.offpath += 1
                tokens.append(self._other(pos))
                self.proposed_other += 1
        _sleep_until(start + k * self.cost_ms / 1e3)
        return Draft(torch.tensor(tokens, dtype=torch.long))


def _sleep_until(deadline: float) -> None:
    """Sleep until ``time.perf_counter() >= deadline`` (sleep most of it, then a short spin for precision)."""
    left = deadline - time.perf_counter()
    if left > 0.002:
        time.sleep(left - 0.001)
    while time.perf_counter() < deadline:
        pass
