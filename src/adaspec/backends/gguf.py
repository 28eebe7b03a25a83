"""What every GGUF runtime backend shares: one ``llama_batch`` per call, logits only where asked, cache rollback.

llama.cpp (llama-cpp-python) and ik_llama.cpp (ik-llama-cpp-python) expose the same C calls for the hot path
(``llama_batch_init``, ``llama_decode``, ``llama_get_logits_ith``) but differ in how a model is loaded, how a
sequence's cache positions are removed and which library they load. :class:`GgufBackend` holds the shared
decode/truncate loop; a subclass loads the model and provides :meth:`GgufBackend._seq_rm` and the model's shape.
"""

from __future__ import annotations

import ctypes
from abc import abstractmethod
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from adaspec.backends import gguf_trees
from adaspec.backends.base import Backend, BatchRow, CacheSnapshot
from adaspec.backends.gguf_trees import GrowingTree, PendingTree
from adaspec.errors import ConfigError


def simd_of(system_info: str) -> str:
    """The widest x86 vector extension a llama.cpp-family build was compiled for, read from its
    ``llama_print_system_info()`` text (``"AVX = 1 | AVX2 = 1 | AVX512 = 0 | ..."``): ``"AVX-512"``, ``"AVX2"``,
    ``"AVX"``, or ``""`` (none of them, e.g. an ARM build, or text in another format).

    Not the CPU's own features: ik-llama-cpp-python's prebuilt wheel reports ``"AVX2"`` on an AVX-512 CPU
    (``make ik-native`` rebuilds it for the CPU)."""
    flags = {}
    for part in system_info.split("|"):
        key, _, value = part.partition("=")
        flags[key.strip()] = value.strip()
    return next((label for key, label in (("AVX512", "AVX-512"), ("AVX2", "AVX2"), ("AVX", "AVX"))
                 if flags.get(key) == "1"), "")


class GgufBackend(Backend):
    """A GGUF model on a llama.cpp-family runtime: ``max_sequences`` sequences (``seq_id`` 0..), each with its own
    ``max_context`` positions of one KV cache; :meth:`forward_batch` runs tokens of several sequences in one
    ``llama_decode`` (as llama.cpp's server batches its slots).

    A subclass's ``__init__`` loads the model and context, then calls :meth:`_init_state`. It sets ``self._lib``
    (a namespace with ``llama_batch_init``, ``llama_batch_free``, ``llama_decode``, ``llama_get_logits_ith``,
    ``llama_set_n_threads``, ``llama_model_size``), ``self._ctx`` and ``self._model`` (C pointers), and implements
    :meth:`_seq_rm`, :meth:`_shape` and :meth:`_free`.

    **Batch invariance.** These runtimes evaluate a one-token batch with other kernels (matrix-vector) than a batch
    of two or more (matrix-matrix, whose rows do not depend on each other or on the batch size). Plain decoding
    feeds one token per step and verification K + 1, so by default greedy speculative output equals plain greedy
    output except where the two kernels flip a near-tie. ``batch_invariant=True`` never evaluates a one-token batch
    after the first token: it re-runs the previous token with the new one (the cache drops and recomputes that
    position), so every logit comes from the matrix-matrix kernels and greedy speculative output is token-for-token
    identical to plain greedy output on the same backend, at the cost of a two-token forward per plain step.

    **Token trees** (runtimes with one unified cache: ik_llama.cpp; ``tree_sequences`` > 0): the branches of a tree
    are sequences that share cells (:mod:`adaspec.backends.gguf_trees`).

    Logits are returned as float32 ``[num_logits, V]`` CPU tensors.
    """

    runtime = "gguf"  # the runtime's short name, as in model specs (NAME@llamacpp, NAME@ik)
    supports_batch_invariance = True
    supports_snapshots = True  # llama_state_seq_get_data / llama_state_seq_set_data
    _invariant = False
    vocab_map = None  # a cut draft vocabulary (adaspec.models.prune_vocab): original ids in, logits over V out
    tree_sequences = 0  # sequence ids after the rows' own held for tree leaves (0: no trees on this runtime)
    simd = ""  # the widest x86 vector extension the runtime's build uses (:func:`simd_of`); "" where unknown
    _tree: PendingTree | None = None  # between forward_tree and keep_tree_path
    _grown: GrowingTree | None = None  # between the first grow_tree and keep_tree_path

    @property
    def batch_invariant(self) -> bool:
        return self._invariant

    @batch_invariant.setter
    def batch_invariant(self, on: bool) -> None:
        if on and self.n_batch < 3:
            raise ConfigError(f"{self.name}: strict (batch-invariant) mode needs n_batch >= 3, got {self.n_batch}")
        self._invariant = bool(on)

    def _init_state(self, path: Path, name: str | None, n_ctx: int, n_batch: int, threads: int,
                    batch_invariant: bool, max_sequences: int = 1) -> None:
        """Common state once the model and context exist (``n_ctx`` per sequence and ``n_batch`` as the context
        really has them)."""
        self.name = name or path.stem
        self.path = path
        self.vocab_map = self._read_vocab_map(path)
        self._n_out = self.vocab_size  # logits the runtime returns per position
        self._stand_in: list[int] | None = None
        if self.vocab_map is not None:  # original ids in, logits over the original vocabulary out
            self._stand_in = self.vocab_map.stand_in.tolist()
            self.vocab_size = self.vocab_map.original_size
            # prune_vocab keeps the first ids, then a few more: the leading run where kept[i] == i is copied as a slice
            in_place = self.vocab_map.kept == np.arange(len(self.vocab_map.kept))
            self._kept_run = len(in_place) if in_place.all() else int(in_place.argmin())
            self._kept_tail = self.vocab_map.kept[self._kept_run:]
        info = getattr(self._lib, "llama_print_system_info", None)
        self.simd = simd_of((info() or b"").decode(errors="replace")) if info is not None else ""
        self.n_batch = n_batch
        self.threads = threads
        self.max_sequences = max_sequences
        self._batch = self._lib.llama_batch_init(self.n_batch, 0, 1 + self.tree_sequences)
        self.max_context = n_ctx
        self.batch_invariant = batch_invariant
        # token ids in each sequence's cache (batch-invariant mode re-runs a sequence's last one)
        self._seqs: list[list[int]] = [[] for _ in range(max_sequences)]

    def _read_vocab_map(self, path: Path):
        """The :class:`~adaspec.models.prune_vocab.VocabMap` of a draft whose vocabulary was cut
        (:func:`~adaspec.models.prune_vocab.prune_vocab`), or None (asked of the runtime first, so that other
        models pay nothing)."""
        from adaspec.models.prune_vocab import KEY_SIZE, read_vocab_map

        buf = ctypes.create_string_buffer(32)
        if self._lib.llama_model_meta_val_str(self._model, KEY_SIZE.encode(), buf, len(buf)) < 0:
            return None
        try:
            vmap = read_vocab_map(path)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if vmap is None or len(vmap.kept) != self.vocab_size:
            raise ConfigError(f"{path}: its vocabulary map does not match the model's {self.vocab_size} tokens")
        return vmap

    @staticmethod
    def _check_args(path: Path, runtime: str, n_batch: int, batch_invariant: bool, max_sequences: int = 1) -> None:
        if not path.is_file():
            raise ConfigError(f"{runtime} backend: no GGUF file at {path}")
        if n_batch < (3 if batch_invariant else 1):
            raise ConfigError(f"n_batch must be >= {3 if batch_invariant else 1}, got {n_batch}")
        if not 1 <= max_sequences <= 256:
            raise ConfigError(f"max_sequences must be in [1, 256], got {max_sequences}")

    #: Compact a multi-sequence cache after every truncation, so that the cells rows give back (rejected drafts,
    #: released rows) leave no holes between the others'. ik_llama.cpp needs it: with holes, its attention returned
    #: NaN logits for a newly admitted row, and the NaN written into the cells then reached every row
    #: (tests/backends/test_gguf_shared_cache.py; docs/findings/server.md, "NaN logits").
    compacts_holes = False

    # Subclass hooks ---------------------------------------------------------------------------------------
    @abstractmethod
    def _seq_rm(self, start: int, seq: int = 0) -> bool:
        """Remove cache positions ``start..`` of sequence ``seq``; False when the runtime refuses."""

    @abstractmethod
    def _shape(self) -> tuple[int, int, int, int]:
        """``(n_layer, n_head, n_head_kv, n_embd)`` of the model."""

    @abstractmethod
    def _free(self) -> None:
        """Free the context and the model (the batch is already freed)."""

    def _state_seq(self, name: str, *args) -> int:
        """``llama_state_seq_<name>(ctx, *args)`` (``get_size``, ``get_data``, ``set_data``): the runtimes differ
        in their signatures, so a subclass may adapt the call."""
        return int(getattr(self._lib, f"llama_state_seq_{name}")(self._ctx, *args))

    # Backend interface ------------------------------------------------------------------------------------
    @property
    def seq_len(self) -> int:
        return len(self._seqs[0])

    def seq_len_of(self, seq: int) -> int:
        self._check_seq(seq)
        return len(self._seqs[seq])

    def forward(self, input_ids: Sequence[int], num_logits: int = 1) -> torch.Tensor:
        return self.forward_batch([BatchRow(0, input_ids, num_logits)])[0]

    def forward_batch(self, rows: Sequence[BatchRow]) -> list[torch.Tensor]:
        """All rows in one ``llama_batch`` (split into ``n_batch``-token calls when longer), each token tagged with
        its row's ``seq_id``; logits only where asked. In strict mode a batch of one token in all re-runs that
        sequence's previous token with it (see the class docstring); a batch of two or more tokens, from any
        sequences, already runs the matrix-matrix kernels."""
        rows = [BatchRow(r.seq, [int(t) for t in r.input_ids], r.num_logits) for r in rows]
        self.check_rows(rows)
        self._check_open()
        self._check_no_tree()
        if (self.batch_invariant and len(rows) == 1 and len(rows[0].input_ids) == 1
                and self._seqs[rows[0].seq]):  # re-run the previous token so no batch has one row
            seq, new = rows[0].seq, rows[0].input_ids[0]
            prev = self._seqs[seq][-1]
            self.truncate_seq(seq, len(self._seqs[seq]) - 1)
            try:
                return self._decode([BatchRow(seq, [prev, new], 1)])
            except RuntimeError:
                self._decode([BatchRow(seq, [prev], 1)])  # put the previous token back before reporting the failure
                raise
        return self._decode(rows)

    def _decode(self, rows: list[BatchRow]) -> list[torch.Tensor]:
        """``llama_decode`` over every row's tokens (:meth:`_decode_items`), logits only for each row's last
        ``num_logits`` positions."""
        items = []  # (sequence ids, position, token, wants logits)
        for r in rows:
            base, n = len(self._seqs[r.seq]), len(r.input_ids)
            items += [((r.seq,), base + i, t, i >= n - r.num_logits) for i, t in enumerate(r.input_ids)]

        def undo() -> None:  # every cache as before the call
            for r in rows:
                self._seq_rm(len(self._seqs[r.seq]), r.seq)

        out = self._decode_items(items, sum(r.num_logits for r in rows), undo)
        result, row = [], 0
        for r in rows:
            self._seqs[r.seq].extend(r.input_ids)
            result.append(torch.from_numpy(out[row:row + r.num_logits]))
            row += r.num_logits
        return result

    def _decode_items(self, items: list[tuple[tuple[int, ...], int, int, bool]], num_logits: int,
                      undo, rows: Sequence[int] | None = None) -> np.ndarray:
        """``llama_decode`` over ``items`` = ``(sequence ids, position, token, wants logits)`` in chunks of at most
        ``n_batch`` (never a last chunk of one token after others when batch-invariant); ``[num_logits, V]`` float32
        logits of the wanted items, in order, or the k-th wanted item's in row ``rows[k]``. On a runtime error
        ``undo()`` restores the caches, then RuntimeError; so do non-finite logits."""
        lib, batch = self._lib, self._batch
        total = len(items)
        starts = list(range(0, total, self.n_batch))
        if self.batch_invariant and total > 1 and total % self.n_batch == 1:
            starts[-1] -= 1
        out = np.empty((num_logits, self._n_out), dtype=np.float32)
        row = 0
        stand_in = self._stand_in
        for start, end in zip(starts, starts[1:] + [total]):
            batch.n_tokens = end - start
            wanted = []
            for j, (seqs, pos, token, logit) in enumerate(items[start:end]):
                if stand_in is not None:  # a pruned vocabulary: the kept token that stands for it
                    if not 0 <= token < len(stand_in):
                        undo()
                        raise RuntimeError(f"{self.name}: token id {token} out of range (vocabulary of "
                                           f"{len(stand_in)})")
                    token = stand_in[token]
                batch.token[j] = token
                batch.pos[j] = pos
                batch.n_seq_id[j] = len(seqs)
                for k, seq in enumerate(seqs):
                    batch.seq_id[j][k] = seq
                batch.logits[j] = logit
                if logit:
                    wanted.append(j)
            rc = lib.llama_decode(self._ctx, batch)
            if rc != 0:  # undo the chunks already decoded
                undo()
                why = {1: "no room left in the KV cache", -1: "invalid batch (a token id out of range?)"}.get(
                    rc, f"{self.runtime} error")
                raise RuntimeError(f"{self.name}: llama_decode returned {rc} ({why}) at batch token {start}")
            for j in wanted:  # copied straight into the result: the runtime reuses its buffer on the next decode
                out[row if rows is None else rows[row]] = np.ctypeslib.as_array(
                    lib.llama_get_logits_ith(self._ctx, j), shape=(self._n_out,))
                row += 1
        if num_logits and not np.isfinite(out).all():  # never sampled from, never left in the cells for others
            undo()
            raise RuntimeError(f"{self.name}: {self.runtime} returned non-finite logits (NaN or inf) for this batch; "
                               "its tokens were taken back out of the cache")
        if stand_in is not None:  # tokens outside the kept set are never proposed
            full = np.full((num_logits, self.vocab_size), -np.inf, dtype=np.float32)
            run = self._kept_run  # ids 0..run-1 kept in place: a slice copy, 7x cheaper than scattering them
            full[:, :run] = out[:, :run]
            full[:, self._kept_tail] = out[:, run:]
            return full
        return out

    # Token trees ----------------------------------------------------------------------------------------------
    @property
    def supports_trees(self) -> bool:  # type: ignore[override]
        return self.tree_sequences > 0

    @property
    def max_tree_nodes(self) -> int:
        """A tree of n nodes has at most n leaves, each a sequence: at most ``tree_sequences`` nodes."""
        return self.tree_sequences

    def forward_tree(self, input_ids: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """See :func:`adaspec.backends.gguf_trees.forward_tree`."""
        return gguf_trees.forward_tree(self, input_ids, parents)

    @property
    def supports_tree_growth(self) -> bool:  # type: ignore[override]
        return self.tree_sequences > 0

    def grow_tree(self, input_ids: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """See :func:`adaspec.backends.gguf_trees.grow_tree`."""
        return gguf_trees.grow_tree(self, input_ids, parents)

    def keep_tree_path(self, base: int, path: Sequence[int]) -> None:
        """See :func:`adaspec.backends.gguf_trees.keep_tree_path`."""
        gguf_trees.keep_tree_path(self, base, path)

    def _compact(self) -> None:
        """Move the cache's cells together (no holes). Runtimes with trees implement it."""
        raise NotImplementedError(f"{self.name}: {self.runtime} cannot compact its cache")

    def _drop_tree(self) -> None:
        gguf_trees.drop_tree(self)

    def _check_no_tree(self) -> None:
        gguf_trees.check_no_tree(self)

    def _check_open(self) -> None:
        if self._ctx is None:
            raise RuntimeError(f"{self.name}: the {self.runtime} backend was closed")

    def truncate(self, length: int) -> None:
        self.truncate_seq(0, length)

    def truncate_seq(self, seq: int, length: int) -> None:
        self._check_seq(seq)
        ids = self._seqs[seq]
        if length < len(ids):
            self._check_open()
        if not 0 <= length <= len(ids):
            raise ValueError(f"cannot truncate a cache of {len(ids)} tokens to {length}")
        pending = gguf_trees.pending_root(self)
        if pending is not None and seq == 0:  # the nodes are not in sequence 0's cells: only back to the root
            if length > pending:
                raise ValueError(f"{self.name}: a token tree is pending; keep a path (keep_tree_path) or truncate "
                                 f"to at most {pending} entries")
            self._drop_tree()
        if length < len(ids):
            if not self._seq_rm(length, seq):
                raise RuntimeError(f"{self.name}: {self.runtime} refused to remove cache positions {length}.. "
                                   f"of sequence {seq}")
            if self.max_sequences > 1 and self.compacts_holes:
                self._compact()  # see compacts_holes
        del ids[length:]

    def share_prefix(self, src: int, dst: int, start: int, end: int) -> None:
        """``llama_kv_cache_seq_cp`` over positions ``start..end``: ``dst`` joins ``src``'s cells (a unified cache
        shares them, no data moves; each sequence's later removals leave the other's cells in place)."""
        self.check_share(src, dst, start, end)
        self._check_open()
        self._check_no_tree()
        if end > start:
            self._lib.llama_kv_cache_seq_cp(self._ctx, src, dst, start, end)
            self._seqs[dst][start:] = self._seqs[src][start:end]

    def snapshot(self) -> CacheSnapshot:
        """``llama_state_seq_get_data`` of sequence 0 (its cells' keys and values, f16) into a host buffer."""
        self._check_open()
        self._check_no_tree()
        size = self._state_seq("get_size", 0)
        buf = (ctypes.c_uint8 * size)()
        got = self._state_seq("get_data", buf, size, 0)
        if got == 0 and self._seqs[0]:
            raise RuntimeError(f"{self.name}: {self.runtime} could not copy sequence 0's cache")
        return CacheSnapshot(len(self._seqs[0]), got, (buf, list(self._seqs[0])))

    def restore(self, snap: CacheSnapshot) -> None:
        """``llama_state_seq_set_data`` into sequence 0 (empty): the runtime places the copied cells again."""
        self._check_open()
        self._check_no_tree()
        if self._seqs[0]:
            raise ValueError(f"{self.name}: restore needs an empty sequence 0, which holds {len(self._seqs[0])}")
        buf, ids = snap.data
        if not ids:
            return
        if self._state_seq("set_data", buf, snap.nbytes, 0) == 0:
            self._seq_rm(0, 0)
            raise RuntimeError(f"{self.name}: {self.runtime} refused a cache copy of {len(ids)} positions "
                               "(no room left in the KV cache?)")
        self._seqs[0] = list(ids)

    def set_threads(self, threads: int) -> None:
        if threads < 1:
            raise ConfigError(f"threads must be >= 1, got {threads}")
        self._check_open()
        self._lib.llama_set_n_threads(self._ctx, threads, threads)
        self.threads = threads

    def weight_bytes(self) -> int:
        """Bytes of the GGUF's tensors (``llama_model_size``: quantised weights as loaded)."""
        self._check_open()
        return int(self._lib.llama_model_size(self._model))

    def kv_bytes_per_token(self) -> int:
        """2 (K and V) × layers × KV heads × head dim × 2 bytes (the runtime's default f16 cache)."""
        self._check_open()
        n_layer, n_head, n_head_kv, n_embd = self._shape()
        return 2 * n_layer * n_head_kv * (n_embd // n_head) * 2

    def close(self) -> None:
        """Free the batch, the context and the model (also done at garbage collection)."""
        if getattr(self, "_batch", None) is not None:
            self._lib.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None) is not None or getattr(self, "_model", None) is not None:
            self._free()
            self._ctx = self._model = None
            self._seqs = [[] for _ in range(self.max_sequences)]
            self._tree = self._grown = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass
