"""Logits controls that depend on the sequence: repetition, presence and frequency penalties, and logit bias.

Under speculation the target scores K + 1 positions in one forward: row i follows ``ids + drafts[:i]``. Each row
is processed with the history of *that* position: the penalties count the drafts before it as generated tokens,
which is exactly the state plain decoding would have if verification reaches that row (a row after a rejected draft
is never used). So the processed distribution at every emitted position equals the one plain decoding uses, and
greedy and speculative (rejection) sampling stay lossless with any of these controls on; the draft's proposals need
not use them (rejection sampling is exact for any proposal distribution). A draft model follows them anyway
(:meth:`adaspec.drafters.ModelDrafter.set_controls`: each drafted position is processed with the history of the
sequence plus the tokens drafted before it), so it proposes what the controlled target accepts; n-gram lookup
copies text and cannot.

Semantics (the reference engines'):

* ``repetition_penalty`` (Hugging Face ``RepetitionPenaltyLogitsProcessor``, Keskar et al. 2019): for every token
  that occurs in the prompt or the output, a positive logit is divided by the penalty and a negative one multiplied
  by it (> 1 discourages repeats).
* ``presence_penalty`` / ``frequency_penalty`` (OpenAI; vLLM applies them to output tokens only):
  ``logit[t] -= presence · [count(t) > 0] + frequency · count(t)`` with ``count`` over the generated tokens.
* ``logit_bias`` (OpenAI): ``{token id: bias}`` added to the logits (−100 effectively bans, +100 forces).

Order, as vLLM: logit bias, then the repetition penalty, then presence/frequency; temperature, top-k, top-p and
min-p (:mod:`adaspec.sampling`) act on the result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from adaspec.errors import ConfigError


@dataclass(frozen=True)
class LogitsControls:
    """Sequence-dependent logits controls of one request (see the module docstring).

    Attributes:
        repetition_penalty: > 0; 1.0 = off.
        presence_penalty, frequency_penalty: in [-2, 2]; 0 = off.
        logit_bias: ``{token id: bias}``, biases in [-100, 100].

    Raises:
        ConfigError: a value out of its range (the message names it).
    """

    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.repetition_penalty > 0:
            raise ConfigError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                raise ConfigError(f"{name} must be in [-2, 2], got {value}")
        for token, bias in self.logit_bias.items():
            if int(token) < 0:
                raise ConfigError(f"logit_bias: token id {token} is negative")
            if not -100.0 <= float(bias) <= 100.0:
                raise ConfigError(f"logit_bias: the bias of token {token} must be in [-100, 100], got {bias}")

    @property
    def active(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or bool(self.logit_bias))

    def check_vocab(self, vocab_size: int) -> None:
        """Raises ConfigError when a biased token id is outside a vocabulary of ``vocab_size`` ids."""
        bad = [t for t in self.logit_bias if int(t) >= vocab_size]
        if bad:
            raise ConfigError(f"logit_bias: token id {bad[0]} is out of range (the vocabulary has {vocab_size} ids)")

    def apply(self, logits: torch.Tensor, ids: Sequence[int], prompt_len: int,
              drafts: torch.Tensor | None = None) -> torch.Tensor:
        """Process the target's logits for the positions after ``ids`` and each prefix of ``drafts``.

        Args:
            logits: ``[n, V]`` logits; row i scores the token after ``ids + drafts[:i]`` (n <= len(drafts) + 1).
            ids: the sequence so far, prompt then output (its first ``prompt_len`` tokens are the prompt).
            prompt_len: tokens of ``ids`` that are the prompt (the presence/frequency counts skip them).
            drafts: ``[K]`` int64 drafted tokens (None or empty: one row after ``ids``).

        Returns:
            ``[n, V]`` float32 processed logits (a new tensor; ``logits`` is not modified).

        The penalties only change the columns of tokens that occur (in the output and the drafts, and for the
        repetition penalty the prompt), so they are computed on those m columns, ``[n, m]``, not on all V: the
        cost is one copy of the logits plus O(n·m): 0.8 ms instead of 24 ms with full-vocabulary count tensors for
        V = 151,936 and n = 5 on one AMD EPYC core (docs/controls.md). Bit-identical to the full-vocabulary
        computation (tests/test_controls.py).
        """
        out = logits.float().clone()
        if not self.active:
            return out
        n, vocab = out.shape
        dev = out.device
        if self.logit_bias:
            index = torch.tensor([int(t) for t in self.logit_bias], dtype=torch.long, device=dev)
            bias = torch.tensor([float(b) for b in self.logit_bias.values()], dtype=torch.float32, device=dev)
            keep = index < vocab
            out[:, index[keep]] += bias[keep]
        if self.repetition_penalty == 1.0 and not self.presence_penalty and not self.frequency_penalty:
            return out
        # generated-token counts per row: the output so far plus the drafts before that row (a draft id outside
        # the target's vocabulary, from a wider draft vocabulary, counts for nothing: verification rejects it)
        output = [t for t in ids[prompt_len:] if t < vocab]
        steps = [(i, int(t)) for i, t in enumerate(drafts[:n - 1].tolist()) if 0 <= t < vocab] \
            if drafts is not None and n > 1 else []
        prompt = set(t for t in ids[:prompt_len] if t < vocab) if self.repetition_penalty != 1.0 else set()
        cols = sorted(set(output) | {t for _, t in steps} | prompt)
        if not cols:
            return out
        column = {t: j for j, t in enumerate(cols)}
        m = len(cols)
        counts = torch.zeros(n, m, device=dev)
        if output:
            counts += torch.bincount(torch.tensor([column[t] for t in output], device=dev), minlength=m).float()
        if steps:
            hits = torch.zeros(n - 1, m, device=dev)
            hits[torch.tensor([i for i, _ in steps], device=dev),
                 torch.tensor([column[t] for _, t in steps], device=dev)] = 1.0
            counts[1:] += hits.cumsum(0)
        index = torch.tensor(cols, dtype=torch.long, device=dev)
        sub = out[:, index]
        if self.repetition_penalty != 1.0:
            seen = counts > 0
            if prompt:
                seen |= torch.tensor([t in prompt for t in cols], device=dev)
            penalised = torch.where(sub > 0, sub / self.repetition_penalty, sub * self.repetition_penalty)
            sub = torch.where(seen, penalised, sub)
        if self.presence_penalty:
            sub -= self.presence_penalty * (counts > 0).float()
        if self.frequency_penalty:
            sub -= self.frequency_penalty * counts
        out[:, index] = sub
        return out
