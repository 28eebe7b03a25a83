"""Backends: a model with a KV cache behind one small interface."""

from adaspec.backends.base import Backend
from adaspec.backends.torch_backend import TorchBackend
from adaspec.backends.torch_models import load_causal_lm, resolve_dtype, truncated_layers

__all__ = ["Backend", "TorchBackend", "load_causal_lm", "resolve_dtype", "truncated_layers"]
