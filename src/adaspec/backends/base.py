"""The Backend interface: one model, one KV cache, one sequence.

A backend appends tokens to its cache and returns logits for (some of) the new positions, and can truncate its
cache back to a prefix. That is all the engine needs for linear speculation. Later extensions (tree-shaped
verification with a custom attention mask and position ids, then keeping one accepted path; batching several
sequences) add optional arguments/methods here without changing the engine's linear path.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from adaspec.errors import ContextLengthError


class Backend(ABC):
    """A causal LM with a KV cache over a single sequence.

    Invariant: ``seq_len`` equals the number of tokens whose keys/values are in the cache; ``forward`` appends to
    it and ``truncate`` shrinks it. Logits are returned as float tensors on the CPU or the model's device.

    Attributes:
        name: display name of the model (for stats and errors).
        vocab_size: width V of the logits (may be padded beyond the tokenizer's length).
        max_context: maximum number of positions the model supports (prompt + generated tokens).
        batch_invariant: strict mode: every forward after the first of a sequence computes each position's logits
            with the same kernels whatever the number of positions (K + 1) in the forward, so greedy speculative
            decoding reproduces plain greedy decoding bit for bit and a request's output does not depend on the
            controller's choices. Settable between requests where ``supports_batch_invariance`` is True (the
            engine sets it per request from ``GenerationConfig.strict``).
    """

    name: str
    vocab_size: int
    max_context: int
    batch_invariant: bool = False
    supports_batch_invariance: bool = False

    @property
    @abstractmethod
    def seq_len(self) -> int:
        """Number of tokens currently held in the KV cache."""

    @abstractmethod
    def forward(self, input_ids: Sequence[int], num_logits: int = 1) -> torch.Tensor:
        """Run the model over ``input_ids`` appended after the cached prefix, and extend the cache.

        Args:
            input_ids: N >= 1 new token ids (positions ``seq_len .. seq_len + N - 1``).
            num_logits: how many trailing positions need logits (1 for decoding and prefill, K + 1 for
                verification); 1 <= num_logits <= N.

        Returns:
            ``[num_logits, V]`` logits (bf16 or fp32) for the last ``num_logits`` new positions; row j predicts
            the token after new position ``N - num_logits + j``.

        Raises:
            ContextLengthError: if the cache would exceed ``max_context``.
        """

    @abstractmethod
    def truncate(self, length: int) -> None:
        """Drop cached positions ``length ..`` (keep the first ``length``); 0 <= length <= seq_len."""

    def check_forward(self, n: int, num_logits: int) -> None:
        """Validate a ``forward`` of ``n`` new tokens before touching the cache.

        Raises:
            ValueError: ``num_logits`` outside ``[1, n]``.
            ContextLengthError: ``seq_len + n`` exceeds ``max_context``.
        """
        if not 1 <= num_logits <= n:
            raise ValueError(f"num_logits must be in [1, {n}], got {num_logits}")
        if self.seq_len + n > self.max_context:
            raise ContextLengthError(
                f"{self.name}: {self.seq_len + n} tokens exceed the context window of {self.max_context}")

    def reset(self) -> None:
        """Empty the cache (start a new sequence)."""
        self.truncate(0)

    def synchronize(self) -> None:
        """Block until queued device work is done (for honest timing on asynchronous devices)."""

    def set_threads(self, threads: int) -> None:
        """Use ``threads`` CPU threads for later forwards. Backends on PyTorch share its process-wide pool, which
        :func:`adaspec.api.set_threads` sets, so the default does nothing; llama.cpp sets its context's count."""

    def weight_bytes(self) -> int:
        """Bytes of the model's weights as held in memory (shared tensors counted once).

        Raises:
            NotImplementedError: the backend cannot tell.
        """
        raise NotImplementedError(f"{type(self).__name__} does not report its weight bytes")

    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache one token of context costs (keys and values of every layer).

        Raises:
            NotImplementedError: the backend cannot tell.
        """
        raise NotImplementedError(f"{type(self).__name__} does not report its KV-cache bytes")
