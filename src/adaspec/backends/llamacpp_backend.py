"""A llama.cpp model (a GGUF file, run as it is, quantised) behind the :class:`Backend` interface.

Uses llama-cpp-python's low-level bindings (the ``llama_*`` C API) through :class:`~adaspec.backends.gguf.GgufBackend`:
one ``llama_batch`` per call with the logits flag set only on the positions the caller asks for (prefill asks for
one row, verification for K + 1), and ``llama_memory_seq_rm`` to truncate the KV cache on rejection. The model and
context are created with the same C calls, so that a context can hold several sequences (``n_seq_max``) for
batching. Optional dependency:
``pip install -e ".[llamacpp]"`` (builds llama.cpp from source, 10-14 minutes on 2 cores).
"""

from __future__ import annotations

import os
from pathlib import Path

from adaspec.backends.gguf import GgufBackend
from adaspec.errors import ConfigError


def import_llama_cpp():
    """Import ``llama_cpp`` or raise a ConfigError that says how to install it."""
    try:
        import llama_cpp
    except ImportError as e:
        raise ConfigError("the llama.cpp backend needs llama-cpp-python: pip install -e \".[llamacpp]\" "
                          f"(builds llama.cpp from source, 10-14 min on 2 cores); import failed: {e}") from None
    return llama_cpp


class LlamaCppBackend(GgufBackend):
    """A GGUF model on llama.cpp, ``max_sequences`` sequences (batch size 1 unless built for batching).

    Args:
        model_path: path to a ``.gguf`` file (any quantisation llama.cpp supports).
        name: display name (default: the file name without suffix).
        max_context: context window in tokens = llama.cpp's ``n_ctx`` (default 8192, to bound the KV cache, which
            llama.cpp allocates up front: f16 K/V, ``2 * n_layer * n_kv_heads * head_dim * 2`` bytes per token);
            never more than the model's training context.
        threads: threads for decoding and batch evaluation (default: all cores).
        n_batch: tokens per ``llama_decode`` call; longer inputs (prefill) are split.
        batch_invariant: never evaluate a batch of one token after the first (see :class:`GgufBackend`).
        max_sequences: sequences batched together (:meth:`forward_batch`), each with its own cache stream of
            ``max_context`` positions.

    **Numerics.** A row's logits are bit-identical however the tokens are split into batches of >= 2; a one-token
    batch uses other kernels (|Δlogit| below about 1 on the 135M test model, Q4_1), so by default greedy
    speculative decoding equals plain greedy decoding up to near-ties; ``batch_invariant=True`` makes it exact.

    Raises:
        ConfigError: llama-cpp-python is not installed, or the file cannot be loaded.
    """

    runtime = "llama.cpp"
    # Measured: on an AMD EPYC (AVX2) with llama-cpp-python built here, strict-mode rows of a batch of 2 or 4 (n-gram
    # drafts, K = 3, rows joining and leaving) diverge from the same requests run alone (the 135M test model, row 1
    # at its 11th token), while an Intel Xeon (AVX-512) kept them equal. A row's logits can depend on the other rows,
    # so strict requests are refused in a batch, as on ik_llama.cpp.
    rows_independent = False

    def __init__(self, model_path: str | Path, name: str | None = None, *, max_context: int | None = None,
                 threads: int | None = None, n_batch: int = 512, batch_invariant: bool = False,
                 verbose: bool = False, max_sequences: int = 1) -> None:
        llama_cpp = import_llama_cpp()
        self._lib = llama_cpp
        path = Path(model_path)
        self._check_args(path, self.runtime, n_batch, batch_invariant, max_sequences)
        threads = threads or os.cpu_count() or 1
        _backend_init(llama_cpp, verbose)
        mp = llama_cpp.llama_model_default_params()
        mp.n_gpu_layers = 0
        self._ctx = None
        self._model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
        if not self._model:
            self._model = None
            raise ConfigError(f"llama.cpp could not load {path} (not a GGUF file it supports?)")
        n_ctx = min(max_context or 8192, int(llama_cpp.llama_model_n_ctx_train(self._model)))
        cp = llama_cpp.llama_context_default_params()
        # one cache stream per sequence (kv_unified off), each of n_ctx positions
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx * max_sequences, n_batch, n_batch
        cp.n_seq_max, cp.kv_unified = max_sequences, False
        cp.n_threads = cp.n_threads_batch = threads
        cp.embeddings = False
        # as llama_cpp.Llama sets it (flash_attn=False): the context default is "auto", which changes the numerics
        cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self._ctx = llama_cpp.llama_init_from_model(self._model, cp)
        if not self._ctx:
            llama_cpp.llama_model_free(self._model)
            self._ctx = self._model = None
            raise ConfigError(f"llama.cpp could not create a context of {n_ctx} tokens x {max_sequences} sequences "
                              f"for {path}")
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self.vocab_size = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self._model)))
        # llama.cpp may lower the batch size (to n_ctx) and round n_ctx up: use the values the context really has
        self._init_state(path, name, min(n_ctx, int(llama_cpp.llama_n_ctx(self._ctx)) // max_sequences),
                         min(int(llama_cpp.llama_n_batch(self._ctx)), int(llama_cpp.llama_n_ubatch(self._ctx))),
                         threads, batch_invariant, max_sequences)

    def _seq_rm(self, start: int, seq: int = 0) -> bool:
        return bool(self._lib.llama_memory_seq_rm(self._mem, seq, start, -1))

    def _shape(self) -> tuple[int, int, int, int]:
        lib, model = self._lib, self._model
        return (lib.llama_model_n_layer(model), lib.llama_model_n_head(model), lib.llama_model_n_head_kv(model),
                lib.llama_model_n_embd(model))

    def _free(self) -> None:
        self._mem = None
        if self._ctx is not None:
            self._lib.llama_free(self._ctx)
        if self._model is not None:
            self._lib.llama_model_free(self._model)


_INITIALISED = False


def _backend_init(llama_cpp, verbose: bool) -> None:
    """``llama_backend_init`` once per process (as ``llama_cpp.Llama`` does), and the library's log level: quiet
    unless ``verbose`` (llama-cpp-python's log callback prints only at its verbosity)."""
    global _INITIALISED
    from llama_cpp import _logger

    _logger.set_verbose(verbose)
    if not _INITIALISED:
        llama_cpp.llama_backend_init()
        _INITIALISED = True
