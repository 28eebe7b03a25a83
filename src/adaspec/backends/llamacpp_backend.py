"""A llama.cpp model (a GGUF file, run as it is, quantised) behind the :class:`Backend` interface.

Uses llama-cpp-python's low-level bindings (the ``llama_*`` C API) through :class:`~adaspec.backends.gguf.GgufBackend`:
one ``llama_batch`` per call with the logits flag set only on the positions the caller asks for (prefill asks for
one row, verification for K + 1), and ``llama_memory_seq_rm`` to truncate the KV cache on rejection. The high-level
``llama_cpp.Llama`` object only loads the model and creates the context. Optional dependency:
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
    """A GGUF model on llama.cpp, one sequence (seq_id 0), batch size 1.

    Args:
        model_path: path to a ``.gguf`` file (any quantisation llama.cpp supports).
        name: display name (default: the file name without suffix).
        max_context: context window in tokens = llama.cpp's ``n_ctx`` (default 8192, to bound the KV cache, which
            llama.cpp allocates up front: f16 K/V, ``2 * n_layer * n_kv_heads * head_dim * 2`` bytes per token);
            never more than the model's training context.
        threads: threads for decoding and batch evaluation (default: all cores).
        n_batch: tokens per ``llama_decode`` call; longer inputs (prefill) are split.
        batch_invariant: never evaluate a batch of one token after the first (see :class:`GgufBackend`).

    **Numerics.** A row's logits are bit-identical however the tokens are split into batches of >= 2; a one-token
    batch uses other kernels (|Δlogit| below about 1 on the 135M test model, Q4_1), so by default greedy
    speculative decoding equals plain greedy decoding up to near-ties; ``batch_invariant=True`` makes it exact.

    Raises:
        ConfigError: llama-cpp-python is not installed, or the file cannot be loaded.
    """

    runtime = "llama.cpp"

    def __init__(self, model_path: str | Path, name: str | None = None, *, max_context: int | None = None,
                 threads: int | None = None, n_batch: int = 512, batch_invariant: bool = False,
                 verbose: bool = False) -> None:
        llama_cpp = import_llama_cpp()
        self._lib = llama_cpp
        path = Path(model_path)
        self._check_args(path, self.runtime, n_batch, batch_invariant)
        threads = threads or os.cpu_count() or 1
        n_ctx = max_context or 8192
        try:
            self._llama = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                                          n_threads=threads, n_threads_batch=threads, logits_all=False,
                                          verbose=verbose)
        except (ValueError, RuntimeError) as e:
            raise ConfigError(f"llama.cpp could not load {path}: {e}") from None
        self._ctx = self._llama.ctx
        self._model = self._llama.model
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self.vocab_size = int(self._llama.n_vocab())
        # llama.cpp may lower the batch size (to n_ctx) and round n_ctx up: use the values the context really has
        self._init_state(path, name, min(n_ctx, int(llama_cpp.llama_n_ctx(self._ctx)),
                                         int(self._llama._model.n_ctx_train())),
                         min(int(llama_cpp.llama_n_batch(self._ctx)), int(llama_cpp.llama_n_ubatch(self._ctx))),
                         threads, batch_invariant)

    def _seq_rm(self, start: int) -> bool:
        return bool(self._lib.llama_memory_seq_rm(self._mem, 0, start, -1))

    def _shape(self) -> tuple[int, int, int, int]:
        lib, model = self._lib, self._model
        return (lib.llama_model_n_layer(model), lib.llama_model_n_head(model), lib.llama_model_n_head_kv(model),
                lib.llama_model_n_embd(model))

    def _free(self) -> None:
        self._mem = None
        if getattr(self, "_llama", None) is not None:
            self._llama.close()
            self._llama = None
