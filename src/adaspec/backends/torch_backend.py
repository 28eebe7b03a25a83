"""PyTorch backend over Hugging Face transformers causal LMs, with a DynamicCache rolled back by cropping."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from adaspec.backends.base import Backend
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


class TorchBackend(Backend):
    """A transformers causal LM behind the :class:`Backend` interface (batch size 1).

    Args:
        model: a loaded ``PreTrainedModel`` (any dtype/device), put in eval mode.
        name: display name.
        max_context: context window in tokens (default: ``config.max_position_embeddings``).
        prefill_chunk: long inputs are run in chunks of this many tokens to bound activation memory.
    """

    def __init__(self, model: PreTrainedModel, name: str = "model", *, max_context: int | None = None,
                 prefill_chunk: int = 2048) -> None:
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

    @property
    def seq_len(self) -> int:
        return self._len

    @torch.inference_mode()
    def forward(self, input_ids: Sequence[int], num_logits: int = 1) -> torch.Tensor:
        n = len(input_ids)
        self.check_forward(n, num_logits)
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.device).unsqueeze(0)
        # Run all but the final segment in chunks (their logits are not needed), then the final segment, which
        # holds at least the positions whose logits we return.
        last_start = max(0, min(n - num_logits, (n - 1) // self.prefill_chunk * self.prefill_chunk))
        for start in range(0, last_start, self.prefill_chunk):
            self._run(ids[:, start:min(start + self.prefill_chunk, last_start)], 1)
        return self._run(ids[:, last_start:], num_logits)

    def _run(self, ids: torch.Tensor, num_logits: int) -> torch.Tensor:
        n = ids.shape[1]
        positions = torch.arange(self._len, self._len + n, device=self.device).unsqueeze(0)
        out = self.model(input_ids=ids, position_ids=positions, use_cache=True, logits_to_keep=num_logits,
                         **{self._cache_kwarg: self._cache})
        self._len += n
        return out.logits[0, -num_logits:]

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self._len:
            raise ValueError(f"cannot truncate a cache of {self._len} tokens to {length}")
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
