"""Strict mode's pieces for PyTorch: an attention whose result for a position does not depend on the forward's
width or the cache's length (registered with transformers as :data:`INVARIANT_ATTENTION`), the model features it
does not cover, and the measured forward width at which the linear layers give every row the same bits."""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)


INVARIANT_ATTENTION = "adaspec_invariant"
"""Name under which :func:`invariant_attention` is registered in transformers' ``AttentionInterface``."""


def invariant_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                        **kwargs) -> tuple[torch.Tensor, None]:
    """Causal attention whose result for a query row depends only on that row's position, not on how many rows
    the forward has or how long the cache is (strict mode of :class:`~adaspec.backends.torch_backend.TorchBackend`).

    Each query row i of the last ``q`` positions attends to exactly its ``kv - q + i + 1`` visible keys, one row at a
    time (a prefill of an empty cache, ``kv == q``, is the same call in every run and goes to SDPA) (the query heads sharing a KV head form the row block, so grouped-query attention needs no copy of K/V): the
    matrix shapes, hence the kernels and their reduction order, are those of the same position in any other forward.
    Fused attention (SDPA) and eager attention over the whole cache instead reduce over a length that includes the
    masked keys, and their blocking changes with it (measured: bf16 logits differ).

    Args:
        query: ``[B, H, q, D]``; key, value: ``[B, H_kv, kv, D]`` (cache included); attention_mask: additive
            ``[B, 1, q, kv]`` or None (causal); scaling: softmax scale (default D^-0.5). Dropout must be 0.

    Returns:
        ``(attn_output [B, q, H, D], None)`` as transformers' attention functions do.
    """
    b, h, q, d = query.shape
    h_kv, kv = key.shape[1], key.shape[2]
    if kv == q:  # a prefill of an empty cache: the same call in every run, so the fused kernel keeps invariance
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout)
    if attention_mask is not None and attention_mask.dtype == torch.bool:  # "may attend" masks (a view's sdpa mask)
        attention_mask = torch.zeros_like(attention_mask, dtype=query.dtype).masked_fill(~attention_mask,
                                                                                          float("-inf"))
    rep = h // h_kv
    scale = d ** -0.5 if scaling is None else scaling
    rows = []
    for i in range(q):
        n = kv - q + i + 1
        qi = query[:, :, i].reshape(b, h_kv, rep, d)
        scores = torch.matmul(qi, key[:, :, :n].transpose(2, 3)) * scale  # [B, H_kv, rep, n]
        if attention_mask is not None:
            scores = scores + attention_mask[:, :, i, :n].unsqueeze(2)
        probs = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        rows.append(torch.matmul(probs, value[:, :, :n]).reshape(b, h, d))
    return torch.stack(rows, dim=1), None  # [B, q, H, D]


def _register_invariant_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(INVARIANT_ATTENTION, invariant_attention)


_register_invariant_attention()


def strict_unsupported(config) -> str | None:
    """Why :func:`invariant_attention` cannot stand in for a model's attention (None when it can): sliding-window
    layers, attention-logit soft-capping or attention sinks, which it does not implement."""
    types = getattr(config, "layer_types", None)
    if types and any(t != "full_attention" for t in types):
        return f"layer types {sorted(set(types))}"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True) and not types:
        return f"sliding-window attention (window {config.sliding_window})"
    if getattr(config, "attn_logit_softcapping", None):
        return "attention-logit soft-capping"
    if getattr(config, "sinks", None) or "gpt_oss" in str(getattr(config, "model_type", "")):
        return "attention sinks"
    return None


@torch.inference_mode()
def row_invariant_width(model: torch.nn.Module, start: int, *, tries: int = 16) -> int | None:
    """The smallest forward width ``W >= start`` (of ``start .. start + tries - 1``) at which every linear layer of
    ``model`` gives each row of a ``W``-row input the same bits whatever the row's index, measured with the current
    thread count (None when no width in the range is).

    Strict mode pads every forward to one width so each position meets the same kernels, but that alone does not
    make a position's logits independent of *where in the chunk* it sits: with 2 threads, fp32 GEMMs on an AMD EPYC
    (PyTorch 2.13's CPU kernels) split a 9-row input as 8 + 1 and compute the 9th row another way (widths 5-7 and
    9-11 differ, 8 and 12 do not; 1 and 3 threads, and bf16, are invariant at every width). Which widths are safe
    is the kernel library's choice, so it is measured, never assumed: ``[W, in_features]`` inputs of identical
    rows per distinct linear layer shape (``nn.Linear``, and GPT-2's ``Conv1D``; a model with neither is not
    measured: a warning, and ``start``) (the model's own weights, so its dtype, layout and device), and a width
    passes when all output rows are equal for every input. One input is not enough where the outputs are rounded
    coarsely: bf16 rows computed another way (2 threads on an Ice Lake Xeon without AVX512-BF16, odd W >= 5) round
    to the same bits for ~92-96 % of random inputs of a 512- or 896-wide layer, so each layer gets
    ``ceil(DETECT_VALUES / out_features)`` inputs (at most ``MAX_TRIALS``), about 65k output values per row.
    Cost: that many GEMMs per shape and tried width that passes (a failing width stops at its first unequal one).
    """
    layers: dict[tuple, tuple[int, int, torch.nn.Module]] = {}  # one per distinct shape: (in, out, the layer)
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):  # weight [out, in]
            inputs, outputs = module.in_features, module.out_features
        elif type(module).__name__ == "Conv1D" and getattr(module, "weight", None) is not None:  # GPT-2: [in, out]
            inputs, outputs = module.weight.shape
        else:
            continue
        key = (type(module).__name__, tuple(module.weight.shape), module.weight.dtype, module.bias is not None)
        layers.setdefault(key, (inputs, outputs, module))
    if not layers:
        logger.warning("strict mode: %s has no Linear or Conv1D layer to measure; using width %d unmeasured",
                       type(model).__name__, start)
        return start
    generator = torch.Generator().manual_seed(0)
    for width in range(start, start + tries):
        if all(_rows_equal(layer, inputs, outputs, width, generator) for inputs, outputs, layer in layers.values()):
            return width
    return None


DETECT_VALUES = 1 << 16
"""Output values per row that :func:`row_invariant_width` compares per layer and width (over several inputs)."""
MAX_TRIALS = 256
"""At most this many inputs per layer and width."""


def _rows_equal(layer: torch.nn.Module, inputs: int, outputs: int, width: int, generator: torch.Generator) -> bool:
    """Whether ``layer`` (``inputs`` → ``outputs`` features) gives the ``width`` identical rows of each of its trial
    inputs identical outputs."""
    trials = min(MAX_TRIALS, -(-DETECT_VALUES // max(outputs, 1)))
    for _ in range(trials):
        row = torch.randn(1, inputs, generator=generator).to(layer.weight.dtype)
        out = layer(row.to(layer.weight.device).expand(width, -1).contiguous())
        if not bool((out == out[:1]).all()):
            return False
    return True
