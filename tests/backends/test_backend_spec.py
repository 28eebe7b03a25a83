"""Model specs naming a backend (``NAME@llamacpp``): parsing and errors (no model is loaded)."""

from __future__ import annotations

import pytest

from adaspec.api import split_backend
from adaspec.errors import ConfigError


def test_split_backend():
    assert split_backend("qwen2.5-coder-0.5b-instruct") == ("qwen2.5-coder-0.5b-instruct", None)  # the caller's
    assert split_backend("org/name") == ("org/name", None)
    assert split_backend("m@llamacpp") == ("m", "llamacpp")
    assert split_backend("m@llama.cpp") == ("m", "llamacpp")
    assert split_backend("m@PyTorch") == ("m", "torch")
    assert split_backend("m@ik") == ("m", "ik")
    assert split_backend("m@ik_llama.cpp") == ("m", "ik")
    assert split_backend("/data/a@b/model.gguf") == ("/data/a@b/model.gguf", None)  # "@" inside a path
    assert split_backend("/data/a@b/model.gguf@llamacpp") == ("/data/a@b/model.gguf", "llamacpp")


def test_unknown_backend_is_named():
    with pytest.raises(ConfigError, match="unknown backend 'vllm'.*@torch or @llamacpp or @ik"):
        split_backend("m@vllm")
