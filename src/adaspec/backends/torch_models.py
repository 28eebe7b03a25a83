"""Loading a transformers causal LM in a named dtype, and a view of one that runs only its first layers."""

from __future__ import annotations

import copy

import torch
from transformers import PreTrainedModel

from adaspec.errors import ConfigError


DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32,
          "float16": torch.float16, "fp16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Map ``"bf16"``/``"bfloat16"``/``"fp32"``/... (or a torch.dtype) to a torch.dtype; ConfigError otherwise."""
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ConfigError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}") from None


def load_causal_lm(path: str, *, dtype: str | torch.dtype = "bfloat16", device: str = "cpu") -> PreTrainedModel:
    """Load a transformers causal LM from a local folder or hub id, in eval mode, on ``device``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(dtype))
    return model.to(device).eval()


def truncated_layers(model: PreTrainedModel, num_layers: int) -> PreTrainedModel:
    """A view of ``model`` that runs only its first ``num_layers`` decoder layers, then the final norm and LM head.

    Shares every weight with ``model`` (no copy). Used as a cheap self-draft (layer skipping with an early exit at
    the top: LayerSkip, Elhoushi et al. 2024, without the early-exit training) and in tests.
    """
    inner = model.get_decoder()
    total = len(inner.layers)
    if not 1 <= num_layers <= total:
        raise ConfigError(f"num_layers must be in [1, {total}] for this model, got {num_layers}")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:num_layers]
    new_inner = copy.copy(inner)
    new_inner._modules = dict(inner._modules)
    new_inner.layers = torch.nn.ModuleList(list(inner.layers)[:num_layers])
    new_inner.config = config
    new_model = copy.copy(model)
    new_model._modules = dict(model._modules)
    setattr(new_model, model.base_model_prefix, new_inner)
    new_model.config = config
    return new_model
