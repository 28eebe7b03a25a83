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

    def _prompt_tokens(self, ids: Sequence[int], prompt_len: int) -> torch.Tensor:
        """The distinct token ids of the prompt ``ids[:prompt_len]``, sorted (int64). The prompt is the same at every
        step of a request (the target's and a draft model's calls alike), so the last one is kept: comparing the
        list is ~30x cheaper than converting and deduplicating a long prompt again."""
        prompt = list(ids[:prompt_len])
        cached = getattr(self, "_prompt_cache", None)
        if cached is not None and cached[0] == prompt:
            return cached[1]
        tokens = torch.unique(torch.as_tensor(prompt, dtype=torch.long))
        object.__setattr__(self, "_prompt_cache", (prompt, tokens))  # a cache, not a field: the dataclass is frozen
        return tokens

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
        token lists become tensors once and ``torch.unique`` finds the columns, so the cost is one copy of the logits
        plus O(L log L + n·m) in C for L tokens of history, with no Python loop over the history
        (docs/findings/controls.md has the measured times). Equal to the full-vocabulary computation
        (tests/engine/test_controls.py).

        Raises:
            ValueError: more rows than positions (``n > len(drafts) + 1``).
        """
        out = logits.float().clone()
        if not self.active:
            return out
        n, vocab = out.shape
        dev = out.device
        k = 0 if drafts is None else len(drafts)
        if n > k + 1:
            raise ValueError(f"{n} logits rows but only {k} drafts: row i needs drafts[:i]")
        if self.logit_bias:
            index = torch.tensor([int(t) for t in self.logit_bias], dtype=torch.long, device=dev)
            bias = torch.tensor([float(b) for b in self.logit_bias.values()], dtype=torch.float32, device=dev)
            keep = index < vocab
            out[:, index[keep]] += bias[keep]
        if self.repetition_penalty == 1.0 and not self.presence_penalty and not self.frequency_penalty:
            return out
        # The history as one id tensor: output, then the drafts before the last row, then (repetition penalty only)
        # the prompt. Ids outside the target's vocabulary (a wider draft vocabulary) count for nothing.
        output = torch.as_tensor(ids[prompt_len:], dtype=torch.long)
        steps = torch.as_tensor(drafts[:n - 1], dtype=torch.long).cpu() if n > 1 else torch.empty(0, dtype=torch.long)
        prompt = self._prompt_tokens(ids, prompt_len) if self.repetition_penalty != 1.0 else torch.empty(0,
                                                                                                        dtype=torch.long)
        history = torch.cat([output, steps, prompt])
        valid = (history >= 0) & (history < vocab)
        if not bool(valid.any()):
            return out
        cols, inverse = torch.unique(history[valid], return_inverse=True)  # sorted columns; history -> column
        m = len(cols)
        column = torch.full((len(history),), -1, dtype=torch.long)
        column[valid] = inverse
        out_col, step_col, prompt_col = column.split([len(output), len(steps), len(prompt)])
        counts = torch.zeros(n, m)
        out_col = out_col[out_col >= 0]
        if len(out_col):
            counts += torch.bincount(out_col, minlength=m).float()
        if len(steps):
            rows = torch.arange(len(steps))[step_col >= 0]
            hits = torch.zeros(n - 1, m)
            hits[rows, step_col[step_col >= 0]] = 1.0
            counts[1:] += hits.cumsum(0)
        counts = counts.to(dev)
        index = cols.to(dev)
        sub = out[:, index]
        if self.repetition_penalty != 1.0:
            seen = counts > 0
            prompt_col = prompt_col[prompt_col >= 0]
            if len(prompt_col):
                in_prompt = torch.zeros(m, dtype=torch.bool)
                in_prompt[prompt_col] = True
                seen |= in_prompt.to(dev)
            penalised = torch.where(sub > 0, sub / self.repetition_penalty, sub * self.repetition_penalty)
            big = torch.finfo(sub.dtype).max  # a penalty near 0 divides a logit past the float range (inf, then NaN)
            sub = torch.where(seen, penalised.clamp(-big, big), sub)
        if self.presence_penalty:
            sub -= self.presence_penalty * (counts > 0).float()
        if self.frequency_penalty:
            sub -= self.frequency_penalty * counts
        out[:, index] = sub
        return out


def controlled(logits: torch.Tensor, controls: LogitsControls | None, ids: Sequence[int], prompt_len: int,
               drafts: torch.Tensor | None = None) -> torch.Tensor:
    """The target's ``[n, V]`` logits after ``ids + drafts[:i]`` (row i) with the request's controls applied
    (:meth:`LogitsControls.apply`); unchanged when there are none."""
    return logits if controls is None else controls.apply(logits, ids, prompt_len, drafts)
