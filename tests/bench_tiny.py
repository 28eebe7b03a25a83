"""Tiny random models and a byte-level tokenizer for the benchmark tests (built in-process, no downloads)."""

from __future__ import annotations

import zlib

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from adaspec.api import LoadedModel
from adaspec.backends import TorchBackend

VOCAB = 256


class ByteTokenizer:
    """Bytes as token ids: enough of the Hugging Face tokenizer interface for prompts and detokenising."""

    chat_template = None
    eos_token_id = None

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": list(text.encode("utf-8"))}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")

    def get_vocab(self) -> dict:
        return {}


def tiny_model(seed: int = 0, layers: int = 2, dtype: torch.dtype = torch.float32) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    return Qwen2ForCausalLM(cfg).to(dtype).eval()


def tiny_loader(spec: str, dtype: str, max_sequences: int = 1) -> LoadedModel:
    """``tiny-target`` (2 layers) or any other name (1 layer, seeded by the name), always fp32."""
    layers = 2 if spec == "tiny-target" else 1
    model = tiny_model(zlib.crc32(spec.encode()) % 1000, layers)
    return LoadedModel(TorchBackend(model, spec, max_sequences=max_sequences), ByteTokenizer(), spec)
