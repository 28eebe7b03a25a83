"""One request's position in its grammar (:class:`GrammarState`: allowed-token masks, advance, rollback, forced
tokens) and masking logits with it (:func:`mask_logits`)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch


class GrammarError(RuntimeError):
    """The grammar state was driven outside its grammar (a token it does not allow): a bug, not bad input."""


class GrammarState:
    """One request's position in its grammar (an ``llguidance.LLMatcher``).

    Every method that reads the state measures its own time into :attr:`ms` (milliseconds, cumulative), the
    grammar's overhead on the request.
    """

    def __init__(self, matcher, vocab_size: int, trigger: int | None = None) -> None:
        self._m = matcher
        self.vocab_size = vocab_size
        self.ms = 0.0
        self.trigger = trigger  # a lazy grammar's trigger token (adaspec.constrained.RequestGrammar)

    # Reading ----------------------------------------------------------------------------------------------------
    def allowed(self) -> torch.Tensor:
        """``[V]`` bool: the tokens the grammar allows next (EOS ids only where it is accepting).

        Raises:
            GrammarError: the matcher is in an error state.
        """
        t = time.perf_counter()
        self._check()
        bits = np.unpackbits(np.frombuffer(self._m.compute_bitmask(), dtype=np.uint8), bitorder="little")
        mask = torch.from_numpy(bits[:self.vocab_size].astype(bool))
        if mask.shape[0] < self.vocab_size:
            mask = torch.nn.functional.pad(mask, (0, self.vocab_size - mask.shape[0]))
        self.ms += (time.perf_counter() - t) * 1e3
        if not mask.any():
            raise GrammarError("the grammar allows no token here (and no end of sequence)")
        return mask

    def masks(self, drafts: Sequence[int]) -> torch.Tensor:
        """``[len(drafts) + 1, V]`` bool: row i is :meth:`allowed` after ``drafts[:i]`` (the rows a verification
        over ``[pending] + drafts`` scores). Every draft must be allowed (:meth:`valid_prefix`); rows after the
        grammar has stopped (an end of sequence drafted) repeat the last computed one, as none is read; the state is
        left as it was."""
        rows = [self.allowed()]
        consumed = 0
        for token in drafts:
            if self._m.is_stopped():  # the output ends at this draft (an end of sequence the grammar allowed):
                break  # no row after it is ever read, so those repeat the last one
            self.advance([token])
            consumed += 1
            rows.append(rows[-1] if self._m.is_stopped() else self.allowed())
        rows += [rows[-1]] * (len(drafts) + 1 - len(rows))
        self.rollback(consumed)
        return torch.stack(rows)

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the grammar allows from here (the state is unchanged)."""
        if not tokens:
            return 0
        t = time.perf_counter()
        n = int(self._m.validate_tokens([int(x) for x in tokens]))
        self.ms += (time.perf_counter() - t) * 1e3
        return n

    def forced(self) -> list[int]:
        """The tokens the grammar forces from here (llguidance's fast-forward tokens: the canonical tokenization of
        the bytes every continuation starts with; empty where the next token is free)."""
        t = time.perf_counter()
        out = [] if self._m.is_stopped() or self._m.is_error() else list(self._m.compute_ff_tokens())
        self.ms += (time.perf_counter() - t) * 1e3
        return out

    @property
    def accepting(self) -> bool:
        """The output may end here (the grammar is satisfied)."""
        return bool(self._m.is_accepting())

    @property
    def done(self) -> bool:
        """The output must end here: the grammar allows nothing more (only EOS), or EOS was consumed."""
        return bool(self._m.is_stopped())

    # Moving -----------------------------------------------------------------------------------------------------
    def advance(self, tokens: Sequence[int]) -> None:
        """Consume ``tokens`` (each allowed where it stands).

        Raises:
            GrammarError: a token the grammar does not allow.
        """
        if not tokens:
            return
        if not self._m.consume_tokens([int(t) for t in tokens]):
            raise GrammarError(f"the grammar rejected tokens {list(tokens)}: {self._m.get_error()}")

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` consumed tokens (as the KV cache is cut back)."""
        if n > 0 and not self._m.rollback(int(n)):
            raise GrammarError(f"cannot roll the grammar back {n} tokens: {self._m.get_error()}")

    def _check(self) -> None:
        if self._m.is_error():
            raise GrammarError(f"grammar state error: {self._m.get_error()}")


def mask_logits(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``[n, V]`` logits with the tokens ``allowed`` (``[n, V']`` bool) forbids set to -inf; columns beyond
    ``V'`` are forbidden, mask columns beyond V ignored. A new tensor (float32 or the logits' dtype)."""
    width = logits.shape[-1]
    if allowed.shape[-1] < width:
        allowed = torch.nn.functional.pad(allowed, (0, width - allowed.shape[-1]))
    return logits.masked_fill(~allowed[..., :width], float("-inf"))
