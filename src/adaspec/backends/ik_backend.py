"""An ik_llama.cpp model (a GGUF file, run as it is, quantised) behind the :class:`Backend` interface.

ik_llama.cpp is a fork of llama.cpp with faster CPU kernels for quantised matrix products, notably for the small
batches (2-9 tokens) speculative verification feeds, and optional **run-time repacking** of quantised tensors into
interleaved-row layouts (``repack_tensors``) that speed up both one-token decoding and small batches on AVX2/AVX-512
CPUs. The binding is ik-llama-cpp-python (PyPI, a prebuilt AVX2 wheel: no source build), used through its ctypes
module; the few C functions it does not declare (per-sequence cache removal, thread count, model size and shape,
log silencing) are declared here against the library it loaded (ik_llama.cpp's ``llama.h``).

The library is loaded by path with ``RTLD_LOCAL`` and links its own ``libggml`` under a hashed soname, so a process
may also load llama-cpp-python's ``libllama.so``: each backend calls its own library (tested).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from types import SimpleNamespace

from adaspec.backends import cpu
from adaspec.backends.gguf import GgufBackend
from adaspec.errors import ConfigError
from adaspec.tree import MAX_TREE_NODES

INSTALL = 'pip install "ik-llama-cpp-python==0.1.5"'

_LIB: SimpleNamespace | None = None
_LOG_CALLBACK = None  # keeps the ctypes callback alive for as long as the library may call it


def import_ik_llama_cpp() -> SimpleNamespace:
    """The ik_llama.cpp C API as a namespace (the binding's functions plus the ones declared here), loaded once.

    Raises:
        ConfigError: ik-llama-cpp-python is not installed (names the install command), or its library cannot be
            loaded on this machine (for example a CPU without AVX2, which the prebuilt wheel needs).
    """
    global _LIB, _LOG_CALLBACK
    if _LIB is not None:
        return _LIB
    if not cpu.cpu_has_avx2():  # the wheel's kernels would die with SIGILL on the first forward
        raise ConfigError("the ik_llama.cpp backend's prebuilt wheel needs a CPU with AVX2, which this one lacks; "
                          "use --backend llamacpp or torch")
    try:
        from ik_llama_cpp import _ctypes_api as C
    except ImportError as e:
        raise ConfigError(f"the ik_llama.cpp backend (@ik) needs ik-llama-cpp-python: {INSTALL} "
                          f"(a prebuilt wheel; import failed: {e})") from None
    except OSError as e:  # the shared library exists but cannot be loaded here
        raise ConfigError(f"ik-llama-cpp-python is installed but its library cannot be loaded: {e}") from None
    lib = C._lib
    declared = {  # name: (argtypes, restype), from ik_llama.cpp's include/llama.h
        "llama_kv_cache_seq_rm": ([ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32], ctypes.c_bool),
        "llama_kv_cache_seq_cp": ([ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32],
                                  None),
        "llama_set_n_threads": ([ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32], None),
        "llama_kv_cache_defrag": ([ctypes.c_void_p], None),
        "llama_kv_cache_update": ([ctypes.c_void_p], None),
        "llama_model_size": ([ctypes.c_void_p], ctypes.c_uint64),
        "llama_n_ctx": ([ctypes.c_void_p], ctypes.c_uint32),
        "llama_n_batch": ([ctypes.c_void_p], ctypes.c_uint32),
        "llama_n_ctx_train": ([ctypes.c_void_p], ctypes.c_int32),
        "llama_n_vocab": ([ctypes.c_void_p], ctypes.c_int32),
        "llama_model_meta_val_str": ([ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t],
                                     ctypes.c_int32),
        "llama_print_system_info": ([], ctypes.c_char_p),
        "llama_log_set": ([ctypes.c_void_p, ctypes.c_void_p], None),
        # (ctx, [buffer, size,] seq_id, flags) as in ik_llama.cpp's current header; a build from before the flags
        # argument ignores it (passed in a register on x86-64; tests/backends/test_backend_conformance.py checks
        # the round trip)
        "llama_state_seq_get_size": ([ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint32], ctypes.c_size_t),
        "llama_state_seq_get_data": ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32,
                                      ctypes.c_uint32], ctypes.c_size_t),
        "llama_state_seq_set_data": ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32,
                                      ctypes.c_uint32], ctypes.c_size_t),
    }
    ns = SimpleNamespace(**{k: getattr(C, k) for k in dir(C) if k.startswith("llama_")}, C=C, path=lib._name)
    for name, (argtypes, restype) in declared.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, restype
        setattr(ns, name, fn)
    _LOG_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(lambda *a: None)
    ns.llama_log_set(ctypes.cast(_LOG_CALLBACK, ctypes.c_void_p), None)  # quiet unless verbose
    ns.llama_backend_init()
    _LIB = ns
    return ns


class IkLlamaBackend(GgufBackend):
    """A GGUF model on ik_llama.cpp, ``max_sequences`` sequences (batch size 1 unless built for batching).

    Args:
        model_path: path to a ``.gguf`` file.
        name: display name (default: the file name without suffix).
        max_context: context window in tokens (``n_ctx``; default 8192; the KV cache is allocated up front, f16),
            never more than the model's training context.
        threads: threads for decoding and batch evaluation (default: all cores).
        n_batch: tokens per ``llama_decode`` call; longer inputs (prefill) are split.
        batch_invariant: never evaluate a batch of one token after the first (see :class:`GgufBackend`).
        repack: repack quantised tensors at load time into the runtime's interleaved layouts (``repack_tensors``;
            default True: faster one-token and small-batch products on x86; loading reads the weights into memory
            instead of mapping them).
        flash_attn: ik_llama.cpp's flash attention (default False: its CPU kernels assert on some prompt shapes
            without AVX-VNNI, and at the contexts here it gains little).
        max_sequences: sequences batched together (:meth:`forward_batch`); the unified KV cache is allocated for
            ``max_context`` positions of each, plus slack against fragmentation (half as many again, at most 4096
            cells, plus one batch).
        tree_sequences: sequence ids held for the leaves of a token tree (:meth:`forward_tree`; at most
            :data:`~adaspec.tree.MAX_TREE_NODES`; 0: chains only). The engine caps a tree to this many nodes
            (``max_tree_nodes``). They share the cache's cells, but the context's ``n_seq_max`` grows by as many:
            the runtime reserves one vocabulary-sized logits row per sequence (16 rows of a 152k vocabulary:
            10 MB), and for LongRoPE models (Phi-3.x) it picks long or short rope factors from
            ``n_ctx / n_seq_max``, so pass 0 for those. The zoo's models (Qwen2.5, SmolLM2) use neither.

    Logits are float32 ``[num_logits, V]`` CPU tensors. Numerics as for llama.cpp: a row's logits do not depend on
    how tokens are split into batches of >= 2; a one-token batch uses other kernels.

    Raises:
        ConfigError: the package is missing, the file is missing, or the runtime cannot load it.
    """

    runtime = "ik_llama.cpp"
    rows_independent = False  # measured: with other sequences in the batch a row's logits change (up to ~1.3)
    shares_prefix = True  # one unified cache: a sequence joins another's cells (share_prefix)

    def __init__(self, model_path: str | Path, name: str | None = None, *, max_context: int | None = None,
                 threads: int | None = None, n_batch: int = 512, batch_invariant: bool = False,
                 repack: bool = True, flash_attn: bool = False, verbose: bool = False, max_sequences: int = 1,
                 tree_sequences: int = 16) -> None:
        lib = import_ik_llama_cpp()
        self._lib = lib
        path = Path(model_path)
        self._check_args(path, self.runtime, n_batch, batch_invariant, max_sequences)
        if not 0 <= tree_sequences <= MAX_TREE_NODES:
            raise ConfigError(f"tree_sequences must be in [0, {MAX_TREE_NODES}], got {tree_sequences}")
        self.tree_sequences = tree_sequences
        if verbose:
            lib.llama_log_set(None, None)  # the library's default: log to stderr
        threads = threads or os.cpu_count() or 1
        mp = lib.llama_model_default_params()
        mp.n_gpu_layers = 0
        mp.repack_tensors = repack
        mp.use_mmap = not repack  # repacking rewrites the tensors, so they must live in memory
        self._model = lib.llama_model_load_from_file(str(path).encode(), mp)
        if not self._model:
            self._ctx = None
            raise ConfigError(f"ik_llama.cpp could not load {path} (not a GGUF file it supports?)")
        n_ctx_train = int(lib.llama_n_ctx_train(self._model))
        n_ctx = min(max_context or 8192, n_ctx_train)
        cp = lib.llama_context_default_params()
        # one unified cache: n_ctx positions for each of max_sequences sequences, plus slack when several share it:
        # a batch needs contiguous free cells, and rows rolled back at different lengths leave holes
        cells = n_ctx * max_sequences + (min(n_ctx * max_sequences // 2, 4096) + n_batch if max_sequences > 1 else 0)
        # tree leaves are sequences too (ids after the rows'); they share cells, so they need no cells of their own
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = cells, n_batch, n_batch, max_sequences + tree_sequences
        cp.n_threads = cp.n_threads_batch = threads
        cp.logits_all, cp.embeddings, cp.flash_attn = False, False, flash_attn
        self._ctx = lib.llama_init_from_model(self._model, cp)
        if not self._ctx:
            lib.llama_free_model(self._model)
            self._model = None
            raise ConfigError(f"ik_llama.cpp could not create a context of {n_ctx} tokens x {max_sequences} "
                              f"sequences for {path}")
        self.vocab_size = int(lib.llama_n_vocab(self._model))
        self.repack = repack
        self._init_state(path, name, min(n_ctx, int(lib.llama_n_ctx(self._ctx)) // max_sequences),
                         min(int(lib.llama_n_batch(self._ctx)), int(lib.llama_n_ubatch(self._ctx))),
                         threads, batch_invariant, max_sequences)

    compacts_holes = True  # see GgufBackend.compacts_holes

    def _seq_rm(self, start: int, seq: int = 0) -> bool:
        return bool(self._lib.llama_kv_cache_seq_rm(self._ctx, seq, start, -1))

    def _state_seq(self, name: str, *args) -> int:
        return int(getattr(self._lib, f"llama_state_seq_{name}")(self._ctx, *args, 0))  # flags 0: the whole state

    def _compact(self) -> None:
        self._lib.llama_kv_cache_defrag(self._ctx)
        self._lib.llama_kv_cache_update(self._ctx)

    def _meta_int(self, key: str) -> int:
        buf = ctypes.create_string_buffer(128)
        if self._lib.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf)) < 0:
            raise NotImplementedError(f"{self.name}: the GGUF has no {key!r}")
        return int(buf.value)

    def _shape(self) -> tuple[int, int, int, int]:
        buf = ctypes.create_string_buffer(64)
        self._lib.llama_model_meta_val_str(self._model, b"general.architecture", buf, len(buf))
        arch = buf.value.decode()
        n_head = self._meta_int(f"{arch}.attention.head_count")
        try:
            n_head_kv = self._meta_int(f"{arch}.attention.head_count_kv")
        except NotImplementedError:
            n_head_kv = n_head
        return (self._meta_int(f"{arch}.block_count"), n_head, n_head_kv,
                self._meta_int(f"{arch}.embedding_length"))

    def _free(self) -> None:
        if self._ctx is not None:
            self._lib.llama_free(self._ctx)
        if self._model is not None:
            self._lib.llama_free_model(self._model)
