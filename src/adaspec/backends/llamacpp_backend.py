"""A llama.cpp model (a GGUF file, run as it is, quantised) behind the :class:`Backend` interface.

Uses llama-cpp-python's low-level bindings (the ``llama_*`` C API): one ``llama_batch`` per call with the logits flag
set only on the positions the caller asks for (prefill asks for one row, verification for K + 1), and
``llama_memory_seq_rm`` to truncate the KV cache on rejection. The high-level ``llama_cpp.Llama`` object only loads
the model and creates the context. Optional dependency: ``pip install -e ".[llamacpp]"`` (builds llama.cpp from
source, 10-14 minutes on 2 cores).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from adaspec.backends.base import Backend
from adaspec.errors import ConfigError


def import_llama_cpp():
    """Import ``llama_cpp`` or raise a ConfigError that says how to install it."""
    try:
        import llama_cpp
    except ImportError as e:
        raise ConfigError("the llama.cpp backend needs llama-cpp-python: pip install -e \".[llamacpp]\" "
                          f"(builds llama.cpp from source, 10-14 min on 2 cores); import failed: {e}") from None
    return llama_cpp


class LlamaCppBackend(Backend):
    """A GGUF model on llama.cpp, one sequence (seq_id 0), batch size 1.

    Args:
        model_path: path to a ``.gguf`` file (any quantisation llama.cpp supports).
        name: display name (default: the file name without suffix).
        max_context: context window in tokens = llama.cpp's ``n_ctx`` (default 8192, to bound the KV cache, which
            llama.cpp allocates up front: f16 K/V, ``2 * n_layer * n_kv_heads * head_dim * 2`` bytes per token);
            never more than the model's training context.
        threads: threads for decoding and batch evaluation (default: all cores).
        n_batch: tokens per ``llama_decode`` call; longer inputs (prefill) are split.
        batch_invariant: never evaluate a batch of one token after the first: a one-token forward re-runs the
            previous token with it (the cache drops and recomputes that position).

    **Numerics.** llama.cpp evaluates a one-token batch with other kernels (quantised matrix-vector products) than a
    batch of two or more (matrix-matrix products, whose rows do not depend on each other or on the batch size: a
    row's logits are bit-identical however the tokens are split into batches of >= 2). Plain decoding feeds one
    token per step and verification K + 1, so by default greedy speculative decoding equals plain greedy decoding
    except where the two kernels flip a near-tie (|Δlogit| below about 1 on the 135M test model, Q4_1).
    ``batch_invariant=True`` makes every logit come from the matrix-matrix kernels, so greedy speculative output is
    token-for-token identical to plain greedy output on the same backend, at the cost of a two-token forward per
    plain step (about 1.5x a one-token step on a 2-core CPU).

    Logits are returned as float32 ``[num_logits, V]`` CPU tensors. Raises ConfigError when llama-cpp-python is
    not installed or the file cannot be loaded.
    """

    def __init__(self, model_path: str | Path, name: str | None = None, *, max_context: int | None = None,
                 threads: int | None = None, n_batch: int = 512, batch_invariant: bool = False,
                 verbose: bool = False) -> None:
        llama_cpp = import_llama_cpp()
        self._lib = llama_cpp
        path = Path(model_path)
        if not path.is_file():
            raise ConfigError(f"llama.cpp backend: no GGUF file at {path}")
        self.name = name or path.stem
        self.path = path
        threads = threads or os.cpu_count() or 1
        n_ctx = max_context or 8192
        if n_batch < (3 if batch_invariant else 1):
            raise ConfigError(f"n_batch must be >= {3 if batch_invariant else 1}, got {n_batch}")
        try:
            self._llama = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                                          n_threads=threads, n_threads_batch=threads, logits_all=False,
                                          verbose=verbose)
        except (ValueError, RuntimeError) as e:
            raise ConfigError(f"llama.cpp could not load {path}: {e}") from None
        self._ctx = self._llama.ctx
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        # llama.cpp may lower the batch size (to n_ctx) and round n_ctx up: use the values the context really has
        self.n_batch = min(int(llama_cpp.llama_n_batch(self._ctx)), int(llama_cpp.llama_n_ubatch(self._ctx)))
        self.threads = threads
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self.vocab_size = int(self._llama.n_vocab())
        self.max_context = min(n_ctx, int(llama_cpp.llama_n_ctx(self._ctx)), int(self._llama._model.n_ctx_train()))
        self.batch_invariant = batch_invariant
        self._ids: list[int] = []  # token ids in the cache (batch-invariant mode re-runs the last one)
        self._len = 0

    @property
    def seq_len(self) -> int:
        return self._len

    def forward(self, input_ids: Sequence[int], num_logits: int = 1) -> torch.Tensor:
        ids = [int(t) for t in input_ids]
        n = len(ids)
        self.check_forward(n, num_logits)
        if self._ctx is None:
            raise RuntimeError(f"{self.name}: the llama.cpp backend was closed")
        if self.batch_invariant and n == 1 and self._ids:  # re-run the previous token so no batch has one row
            prev = self._ids[-1]
            self.truncate(self._len - 1)
            try:
                return self._decode([prev, ids[0]], 1)
            except RuntimeError:
                self._decode([prev], 1)  # put the previous token back before reporting the failure
                raise
        return self._decode(ids, num_logits)

    def _decode(self, ids: list[int], num_logits: int) -> torch.Tensor:
        """``llama_decode`` over ``ids`` in chunks of at most ``n_batch`` (never a last chunk of one token after
        others when batch-invariant), logits only for the last ``num_logits`` positions."""
        lib, batch = self._lib, self._batch
        n = len(ids)
        starts = list(range(0, n, self.n_batch))
        if self.batch_invariant and n > 1 and n % self.n_batch == 1:
            starts[-1] -= 1
        first_logit = n - num_logits
        rows: list[np.ndarray] = []
        for start, end in zip(starts, starts[1:] + [n]):
            batch.n_tokens = end - start
            wanted = []
            for j, i in enumerate(range(start, end)):
                batch.token[j] = ids[i]
                batch.pos[j] = self._len + i
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = 0
                batch.logits[j] = i >= first_logit
                if i >= first_logit:
                    wanted.append(j)
            rc = lib.llama_decode(self._ctx, batch)
            if rc != 0:  # undo the chunks already decoded: the cache is as before the call
                lib.llama_memory_seq_rm(self._mem, 0, self._len, -1)
                why = {1: "no room left in the KV cache", -1: "invalid batch (a token id out of range?)"}.get(
                    rc, "llama.cpp error")
                raise RuntimeError(f"{self.name}: llama_decode returned {rc} ({why}) at position "
                                   f"{self._len + start}")
            for j in wanted:
                ptr = lib.llama_get_logits_ith(self._ctx, j)
                rows.append(np.ctypeslib.as_array(ptr, shape=(self.vocab_size,)).copy())
        self._ids.extend(ids)
        self._len += n
        return torch.from_numpy(np.stack(rows))

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self._len:
            raise ValueError(f"cannot truncate a cache of {self._len} tokens to {length}")
        if length < self._len:
            if not self._lib.llama_memory_seq_rm(self._mem, 0, length, -1):
                raise RuntimeError(f"{self.name}: llama.cpp refused to remove cache positions {length}..")
        del self._ids[length:]
        self._len = length

    def set_threads(self, threads: int) -> None:
        if threads < 1:
            raise ConfigError(f"threads must be >= 1, got {threads}")
        self._lib.llama_set_n_threads(self._ctx, threads, threads)
        self.threads = threads

    def weight_bytes(self) -> int:
        """Bytes of the GGUF's tensors (``llama_model_size``: quantised weights as loaded)."""
        return int(self._lib.llama_model_size(self._llama.model))

    def kv_bytes_per_token(self) -> int:
        """2 (K and V) × layers × KV heads × head dim × 2 bytes (llama.cpp's default f16 cache)."""
        lib, model = self._lib, self._llama.model
        head_dim = lib.llama_model_n_embd(model) // lib.llama_model_n_head(model)
        return 2 * lib.llama_model_n_layer(model) * lib.llama_model_n_head_kv(model) * head_dim * 2

    def close(self) -> None:
        """Free the batch and the model (also done at garbage collection)."""
        if getattr(self, "_batch", None) is not None:
            self._lib.llama_batch_free(self._batch)
            self._batch = None
        llama = getattr(self, "_llama", None)
        if llama is not None:
            self._ctx = self._mem = None
            llama.close()
            self._llama = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass
