"""PyTorch backend over Hugging Face transformers causal LMs, with a DynamicCache rolled back by cropping."""

from __future__ import annotations

import copy
import logging
import inspect
from collections.abc import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from adaspec.backends.base import Backend, CacheSnapshot
from adaspec.backends.torch_invariant import (  # noqa: F401  (invariant_attention re-exported)
    INVARIANT_ATTENTION, invariant_attention, row_invariant_width, strict_unsupported)
from adaspec.backends.torch_models import (  # noqa: F401  (re-exported)
    DTYPES, load_causal_lm, resolve_dtype, truncated_layers)
from adaspec.errors import ConfigError

logger = logging.getLogger(__name__)


@torch.inference_mode()  # the cache's tensors are inference tensors, and so are the copies
def _copy_cache(cache: DynamicCache, device: torch.device) -> DynamicCache:
    """A copy of ``cache`` whose tensors are copied to ``device`` at their own size (a deep copy of a cropped view
    would copy the whole storage behind it)."""
    tensors = {(i, name): t for i, layer in enumerate(cache.layers) for name, t in vars(layer).items()
               if isinstance(t, torch.Tensor)}
    for i, name in tensors:
        setattr(cache.layers[i], name, None)
    try:
        copied = copy.deepcopy(cache)  # the structure and plain attributes only
    finally:
        for (i, name), t in tensors.items():
            setattr(cache.layers[i], name, t)
    for (i, name), t in tensors.items():
        setattr(copied.layers[i], name, t.to(device, copy=True))
    return copied


class TorchBackend(Backend):
    """A transformers causal LM behind the :class:`Backend` interface (``max_sequences`` caches; batched rows run as
    one padded forward).

    Args:
        model: a loaded ``PreTrainedModel`` (any dtype/device), put in eval mode.
        name: display name.
        max_context: context window in tokens (default: ``config.max_position_embeddings``).
        prefill_chunk: long inputs are run in chunks of this many tokens to bound activation memory.
        batch_invariant: strict mode (see :class:`~adaspec.backends.Backend`).
        invariant_width: the smallest forward width W of strict mode (default 9: K + 1 for the goodput controller's
            largest K, 8, so every verification is one forward); the width used is the first one from here at which
            the model's matrix products are row-invariant on this machine (:meth:`strict_width`, measured).
        max_sequences: caches kept for :meth:`forward_batch` (one per sequence).
        pad_batch_max_tokens: :meth:`forward_batch` runs rows of at most this many new tokens as one padded forward
            (longer rows, prompt prefills, run alone: padding every row to a prompt's length would waste the batch).

    **Batch invariance.** PyTorch's matrix kernels and its fused attention (SDPA) pick their blocking by the number
    of rows, so a position's logits differ (~2e-5 in fp32, up to ~0.6 in bf16 on a CPU) between a one-token forward
    and a K + 1-token one, and between different K. In strict mode every forward after the prompt's (the cache is
    not empty) is padded to exactly W = :meth:`strict_width` positions (longer inputs: chunks of W, each padded), the
    padding's cache entries are dropped at once, and attention runs
    :func:`~adaspec.backends.torch_invariant.invariant_attention` (each query row over exactly its visible keys).
    Models whose attention that function does not implement (sliding windows, logit soft-capping, sinks) are refused
    with a ConfigError. Every decoded position then sees the same kernels on the same shapes, and its logits are
    bit-identical whatever K was (fp32 and bf16, tests/engine/test_strict.py). Cost: a plain decoding step runs a
    W-token forward, and attention runs row by row.
    """

    supports_batch_invariance = True
    shares_prefix = True
    supports_snapshots = True

    def __init__(self, model: PreTrainedModel, name: str = "model", *, max_context: int | None = None,
                 prefill_chunk: int = 2048, batch_invariant: bool = False, invariant_width: int = 9,
                 max_sequences: int = 1, pad_batch_max_tokens: int = 32) -> None:
        self.model = model.eval()
        self.name = name
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        config = model.config.get_text_config()
        self.max_context = max_context or int(getattr(config, "max_position_embeddings", 2048))
        self.prefill_chunk = prefill_chunk
        params = inspect.signature(type(model).forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._cache = DynamicCache(config=model.config)
        self._len = 0
        if max_sequences < 1:
            raise ConfigError(f"max_sequences must be >= 1, got {max_sequences}")
        self.max_sequences = max_sequences
        self.pad_batch_max_tokens = pad_batch_max_tokens
        self._parked: dict[int, tuple[DynamicCache, int]] = {}  # the other sequences' (cache, length)
        self._current = 0  # the sequence whose cache is in self._cache
        if invariant_width < 1:
            raise ConfigError(f"invariant_width must be >= 1, got {invariant_width}")
        self.invariant_width = invariant_width
        # Why this model's attention is not plain full causal attention (None when it is): fixed by the config, so
        # strict mode, padded batches and trees read it here instead of re-deriving it every step.
        self._unsupported_attention = strict_unsupported(model.config.get_text_config())
        self._attn_default = getattr(model.config, "_attn_implementation", None)
        self._strict_widths: dict[int, int] = {}  # thread count -> measured strict width (strict_width())
        self._invariant = False
        self.batch_invariant = batch_invariant
        self._grown: tuple[int, list[int]] | None = None  # a tree growing (grow_tree): (cache length before, parents)

    @property
    def batch_invariant(self) -> bool:
        return self._invariant

    @batch_invariant.setter
    def batch_invariant(self, on: bool) -> None:
        on = bool(on)
        if on and not self._invariant:
            why = self._unsupported_attention
            if why:
                raise ConfigError(f"{self.name}: strict mode supports full causal attention only; this model has "
                                  f"{why}")
        if on:
            self.strict_width()  # measured before the first strict forward (a ConfigError if no width is exact)
        if on != self._invariant and self._attn_default is not None:
            self.model.set_attn_implementation(INVARIANT_ATTENTION if on else self._attn_default)
        self._invariant = on

    def strict_width(self) -> int:
        """The forward width strict mode runs at: the smallest width ``>= invariant_width`` at which this model's
        linear layers are row-invariant with the current thread count (:func:`row_invariant_width`), measured once
        per thread count.

        Raises:
            ConfigError: no width within 16 of ``invariant_width`` is row-invariant here.
        """
        threads = torch.get_num_threads()
        width = self._strict_widths.get(threads)
        if width is None:
            width = row_invariant_width(self.model, self.invariant_width)
            if width is None:
                raise ConfigError(f"{self.name}: strict mode found no forward width in {self.invariant_width}.."
                                  f"{self.invariant_width + 15} at which this model's matrix products are "
                                  f"row-invariant with {threads} threads ({self.dtype}); try another thread count")
            self._strict_widths[threads] = width
        return width

    @property
    def seq_len(self) -> int:
        return self.seq_len_of(0)

    # Several sequences: one cache each; decoding rows run as one padded forward -----------------------------------
    def _use(self, seq: int) -> None:
        """Make ``seq``'s cache the current one (the others are parked)."""
        if seq == self._current:
            return
        self._check_seq(seq)
        self._check_not_growing()
        self._parked[self._current] = (self._cache, self._len)
        self._cache, self._len = self._parked.pop(seq, None) or (DynamicCache(config=self.model.config), 0)
        self._current = seq

    def seq_len_of(self, seq: int) -> int:
        self._check_seq(seq)
        return self._len if seq == self._current else self._parked.get(seq, (None, 0))[1]

    def truncate_seq(self, seq: int, length: int) -> None:
        self._use(seq)
        if self._grown is not None and length > self._grown[0]:
            raise ValueError(f"{self.name}: a grown tree is pending; keep a path (keep_tree_path) or truncate to at "
                             f"most {self._grown[0]} entries")
        self._truncate(length)

    def share_prefix(self, src: int, dst: int, start: int, end: int) -> None:
        """``dst``'s cache becomes a copy of ``src``'s first ``end`` positions (the same keys and values)."""
        self._check_not_growing()
        self.check_share(src, dst, start, end)
        if end == start:
            return
        cache, length = self._row_cache(src)
        copied = copy.deepcopy(cache)
        if end < length:
            copied.crop(end - length)  # transformers 5.x: a negative count removes that many
        self._set_row_cache(dst, copied, end)

    def snapshot(self) -> CacheSnapshot:
        """A copy of sequence 0's cache in host memory (each tensor copied at its own size; ``nbytes`` counts
        them)."""
        self._use(0)
        self._check_not_growing()
        cache = _copy_cache(self._cache, torch.device("cpu"))
        nbytes = sum(t.numel() * t.element_size() for layer in cache.layers for t in vars(layer).values()
                     if isinstance(t, torch.Tensor))
        return CacheSnapshot(self._len, nbytes, (cache, self._len))

    def restore(self, snap: CacheSnapshot) -> None:
        """Sequence 0's cache becomes a copy of ``snap`` on the model's device (``snap`` stays valid)."""
        self._use(0)
        self._check_not_growing()
        if self._len:
            raise ValueError(f"{self.name}: restore needs an empty sequence 0, which holds {self._len}")
        cache, length = snap.data
        self._cache, self._len = _copy_cache(cache, self.device), length

    def forward_batch(self, rows) -> list[torch.Tensor]:
        """Rows of at most ``pad_batch_max_tokens`` new tokens run as ONE padded forward (:meth:`_forward_padded`);
        longer rows (prompt prefills), strict mode and attention
        :func:`~adaspec.backends.torch_invariant.invariant_attention` does not cover (sliding windows, soft-capping,
        sinks) run one after another on their own caches, which is exactly what each sequence
        alone computes. A padded row's logits equal the row alone up to the kernels' blocking (~1e-6 in fp32; strict
        mode is the bit-exact path)."""
        self._check_not_growing()
        self.check_rows(rows)
        out: list[torch.Tensor | None] = [None] * len(rows)
        padded = [i for i, r in enumerate(rows) if len(r.input_ids) <= self.pad_batch_max_tokens]
        if self._invariant or len(padded) < 2 or self._unsupported_attention:
            padded = []
        for i, r in enumerate(rows):
            if i not in padded:
                self._use(r.seq)
                out[i] = self._forward(r.input_ids, r.num_logits)
        if padded:
            for i, logits in zip(padded, self._forward_padded([rows[i] for i in padded])):
                out[i] = logits
        return out

    def _row_cache(self, seq: int) -> tuple[DynamicCache, int]:
        if seq == self._current:
            return self._cache, self._len
        return self._parked.get(seq) or (DynamicCache(config=self.model.config), 0)

    def _set_row_cache(self, seq: int, cache: DynamicCache, length: int) -> None:
        if seq == self._current:
            self._cache, self._len = cache, length
        else:
            self._parked[seq] = (cache, length)

    @torch.inference_mode()
    def _forward_padded(self, rows) -> list[torch.Tensor]:
        """One forward over B rows of different cache lengths L_i and new-token counts n_i.

        The rows' caches are stacked left-padded to max L into a temporary batched cache ``[B, H_kv, max L, D]``
        per layer; the new tokens are right-padded to max n; a 4-D additive mask lets row i's query j see its own
        L_i cached keys and its new keys up to j (a padding query sees itself only); position ids are L_i + j (a
        padding query repeats its row's last). After the forward each row's real new key/value entries are appended
        to its own cache and its logits returned (``[num_logits, V]`` per row). Cost beyond the forward: one copy of
        the rows' caches per step.
        """
        caches = [self._row_cache(r.seq) for r in rows]
        lens = [length for _, length in caches]
        n = [len(r.input_ids) for r in rows]
        lmax, nmax, b = max(lens), max(n), len(rows)
        batched = DynamicCache(config=self.model.config)
        if lmax > 0:
            ref = next(c for c, length in caches if length > 0)
            for layer in range(len(ref.layers)):
                shape = ref.layers[layer].keys.shape
                ks, vs = [], []
                for cache, length in caches:
                    pad = shape[:2] + (lmax - length, shape[-1])
                    zeros = torch.zeros(pad, dtype=self.dtype, device=self.device)
                    if length:
                        ks.append(torch.cat([zeros, cache.layers[layer].keys], dim=-2))
                        vs.append(torch.cat([zeros, cache.layers[layer].values], dim=-2))
                    else:
                        ks.append(zeros)
                        vs.append(zeros.clone())
                batched.update(torch.cat(ks), torch.cat(vs), layer)
        ids = torch.tensor([list(r.input_ids) + [r.input_ids[-1]] * (nmax - len(r.input_ids)) for r in rows],
                           dtype=torch.long, device=self.device)
        # a padding query repeats its row's last real position (learned position tables end at max_context)
        positions = torch.tensor([[length + min(j, ni - 1) for j in range(nmax)] for length, ni in zip(lens, n)],
                                 device=self.device)
        allowed = torch.zeros(b, 1, nmax, lmax + nmax, dtype=torch.bool, device=self.device)
        causal = torch.ones(nmax, nmax, dtype=torch.bool, device=self.device).tril()
        for i, (length, ni) in enumerate(zip(lens, n)):
            allowed[i, 0, :, lmax - length:lmax] = True
            allowed[i, 0, :, lmax:lmax + ni] = causal[:, :ni]
            for j in range(ni, nmax):
                allowed[i, 0, j, lmax + j] = True
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        out = self.model(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True,
                         logits_to_keep=nmax, **{self._cache_kwarg: batched})
        logits = []
        for i, (r, (cache, length), ni) in enumerate(zip(rows, caches, n)):
            for layer, entry in enumerate(batched.layers):
                cache.update(entry.keys[i:i + 1, :, lmax:lmax + ni], entry.values[i:i + 1, :, lmax:lmax + ni], layer)
            self._set_row_cache(r.seq, cache, length + ni)
            logits.append(out.logits[i, ni - r.num_logits:ni])
        return logits

    def forward(self, input_ids: Sequence[int], num_logits: int = 1) -> torch.Tensor:
        self._use(0)
        self._check_not_growing()
        self.check_forward(len(input_ids), num_logits)
        return self._forward(input_ids, num_logits)

    @torch.inference_mode()
    def _forward(self, input_ids: Sequence[int], num_logits: int = 1) -> torch.Tensor:
        n = len(input_ids)
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.device).unsqueeze(0)
        if self._invariant and self._len > 0:
            return self._forward_invariant(ids, num_logits)
        # Run all but the final segment in chunks (their logits are not needed), then the final segment, which
        # holds at least the positions whose logits we return.
        last_start = max(0, min(n - num_logits, (n - 1) // self.prefill_chunk * self.prefill_chunk))
        for start in range(0, last_start, self.prefill_chunk):
            self._run(ids[:, start:min(start + self.prefill_chunk, last_start)], 1)
        return self._run(ids[:, last_start:], num_logits)

    def _forward_invariant(self, ids: torch.Tensor, num_logits: int) -> torch.Tensor:
        """Strict mode: chunks of exactly W = :meth:`strict_width` positions, the last one padded by repeating its
        final token at its final position (so no position id passes the last real one, even at the end of the
        context window or of a learned position table); the padding is cropped from the cache at once, and every
        position's logits are kept. A padding query sits after every real one, so causal attention keeps it out
        of the real rows."""
        w, n = self.strict_width(), ids.shape[1]
        rows = []
        for start in range(0, n, w):
            chunk = ids[:, start:start + w]
            real = chunk.shape[1]
            base = self._len
            positions = torch.arange(base, base + real, device=self.device)
            if real < w:
                chunk = torch.cat([chunk, chunk[:, -1:].expand(1, w - real)], dim=1)
                positions = torch.cat([positions, positions[-1:].expand(w - real)])
            rows.append(self._run(chunk, w, positions.unsqueeze(0))[:real])
            self._truncate(base + real)
        return torch.cat(rows)[n - num_logits:]

    def _run(self, ids: torch.Tensor, num_logits: int, positions: torch.Tensor | None = None) -> torch.Tensor:
        n = ids.shape[1]
        if positions is None:
            positions = torch.arange(self._len, self._len + n, device=self.device).unsqueeze(0)
        out = self.model(input_ids=ids, position_ids=positions, use_cache=True, logits_to_keep=num_logits,
                         **{self._cache_kwarg: self._cache})
        self._len += n
        return out.logits[0, -num_logits:]

    # Token trees ----------------------------------------------------------------------------------------------
    @property
    def supports_trees(self) -> bool:  # type: ignore[override]
        """Trees need full-attention layers (a sliding-window cache cannot be compacted by index here)."""
        return self._unsupported_attention is None

    @torch.inference_mode()
    def forward_tree(self, input_ids: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """See :meth:`Backend.forward_tree`: one forward with a 4-D tree attention mask (additive, in the model's
        dtype) and position ids by depth; transformers passes a ready 4-D mask to the attention as it is."""
        from adaspec.tree import depths, tree_attention_mask

        self._use(0)
        self._check_not_growing()
        n = len(input_ids)
        if len(parents) != n - 1:
            raise ValueError(f"a tree over {n - 1} nodes needs {n - 1} parents, got {len(parents)}")
        self.check_forward(n, n)
        past = self._len
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.device).unsqueeze(0)
        positions = torch.tensor([past] + [past + d for d in depths(parents)], device=self.device).unsqueeze(0)
        mask = tree_attention_mask(parents, past, self.dtype, self.device)
        out = self.model(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True,
                         logits_to_keep=n, **{self._cache_kwarg: self._cache})
        self._len += n
        return out.logits[0, -n:]

    @property
    def supports_tree_growth(self) -> bool:  # type: ignore[override]
        """Where trees are verified, outside strict mode (whose padded forwards have no tree masks)."""
        return self.supports_trees and not self._invariant

    def _check_not_growing(self) -> None:
        if self._grown is not None:
            raise ValueError(f"{self.name}: a grown tree is pending; keep_tree_path or truncate ends it first")

    @torch.inference_mode()
    def grow_tree(self, input_ids: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """See :meth:`Backend.grow_tree`: one forward over the new nodes with a 4-D mask over the prefix and the
        tree so far (:func:`adaspec.tree.grown_tree_mask`) and position ids by depth."""
        from adaspec.tree import depths, grown_tree_mask

        self._use(0)
        m = len(input_ids)
        if m < 1 or len(parents) != m:
            raise ValueError(f"grow_tree needs m >= 1 nodes and as many parents, got {m} and {len(parents)}")
        if self._grown is None and self._invariant:
            raise ValueError(f"{self.name}: trees are not grown in strict mode")
        base, grown = self._grown or (self._len, [])
        all_parents = grown + [int(p) for p in parents]
        mask = grown_tree_mask(all_parents, m, base, self.dtype, self.device)  # checks the parents
        self.check_forward(m, m)
        depth = depths(all_parents)[len(grown):]
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.device).unsqueeze(0)
        positions = torch.tensor([base + d - 1 for d in depth], device=self.device).unsqueeze(0)
        out = self.model(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True,
                         logits_to_keep=m, **{self._cache_kwarg: self._cache})
        self._len += m
        self._grown = (base, all_parents)
        return out.logits[0, -m:]

    @torch.inference_mode()  # the cache's tensors are inference tensors: in-place updates need the mode
    def keep_tree_path(self, base: int, path: Sequence[int]) -> None:
        self._use(0)
        if not 0 <= base <= self._len or any(not 0 <= base + p < self._len for p in path):
            raise ValueError(f"cannot keep tree path {list(path)} after {base} of {self._len} cached entries")
        if list(path) != list(range(len(path))):  # move the path's entries down to base.. (a few rows per layer)
            index = torch.tensor([base + p for p in path], device=self.device)
            end = base + len(path)
            for layer in self._cache.layers:
                layer.keys[..., base:end, :] = layer.keys.index_select(-2, index)
                layer.values[..., base:end, :] = layer.values.index_select(-2, index)
        self._truncate(base + len(path))

    def truncate(self, length: int) -> None:
        self.truncate_seq(0, length)

    def _truncate(self, length: int) -> None:
        if not 0 <= length <= self._len:
            raise ValueError(f"cannot truncate a cache of {self._len} tokens to {length}")
        self._grown = None
        if length == 0:
            self._cache = DynamicCache(config=self.model.config)
        elif length < self._len:
            self._cache.crop(length - self._len)  # transformers 5.x: a negative count removes that many
        self._len = length

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def weight_bytes(self) -> int:
        seen, total = set(), 0
        for t in list(self.model.parameters()) + list(self.model.buffers()):
            if t.data_ptr() in seen:
                continue
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
        return total

    def kv_bytes_per_token(self) -> int:
        """2 (K and V) × layers × KV heads × head dim × element size of the model's dtype."""
        cfg = self.model.config.get_text_config()
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return 2 * cfg.num_hidden_layers * heads * head_dim * torch.empty(0, dtype=self.dtype).element_size()
