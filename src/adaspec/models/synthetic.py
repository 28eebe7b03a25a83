"""Synthetic models: random weights in the exact shapes of real model families, for timing-only sweeps.

A forward pass costs the same whatever the weights hold, so a model with the right shapes (layers, widths, heads,
vocabulary) times verification and drafting exactly as the real one does, and it can be built on a machine that
cannot download the real one (the GPU machines here take 64 MiB of files and reach no network). The text is
meaningless, so acceptance never comes from these models: the calibrated drafter dials α
(:mod:`adaspec.drafters.calibrated`), and real α comes from real models. Reports mark synthetic points, and
commands that measure text quality refuse them (:func:`refuse_synthetic`).

Spec: ``synthetic:<shape>`` with an optional ``:layers=N`` (the first N layers only, for tests), e.g.
``synthetic:qwen2.5-7b`` or ``synthetic:qwen2.5-0.5b:layers=2``.

Shapes come from each model's ``config.json`` on the Hugging Face hub (``Qwen/Qwen2.5-{0.5B,1.5B,3B,7B,14B,32B}``;
``Qwen/Qwen3-{0.6B,1.7B,4B,8B,32B}``, whose heads are 128 wide whatever the hidden size, 8 KV heads each;
``lmsys/vicuna-7b-v1.3``, ``-13b-v1.3``, ``-33b-v1.3`` and ``double7/vicuna-68m``, the Llama shapes Spec-Bench
measured), copied into :data:`SHAPES`; the package ships the table, not the files.

Tokenizer: byte-level (:class:`SyntheticTokenizer`, transformers' ByT5 tokenizer: ids 3..258 are the UTF-8 bytes),
so text prompts still tokenize to realistic lengths without a vocabulary file; every id of the model's vocabulary
decodes (to some byte), because a random model emits ids from all of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from transformers import ByT5Tokenizer

from adaspec.errors import ConfigError

PREFIX = "synthetic:"


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a decoder-only transformer that set its cost (Llama/Qwen2 layout: GQA attention with
    q/k/v/o projections, a gated MLP of three matrices, RMSNorm).

    Attributes:
        family: ``"qwen2"``, ``"qwen3"`` or ``"llama"`` (the transformers config class the synthetic model is
            built with).
        hidden, intermediate, layers, heads, kv_heads, vocab: as in the model's config.json.
        tied: input embedding and LM head share one matrix (read once per forward).
        qkv_bias: the q/k/v projections have biases (Qwen2).
        max_positions: the context window, tokens.
        explicit_head_dim: the config's ``head_dim`` where it is not ``hidden / heads`` (Qwen3: 128 with 64 heads
            of a 5120-wide model, so q is 8192 × 5120); 0 = ``hidden // heads``.
    """

    family: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    qkv_bias: bool = False
    max_positions: int = 32768
    explicit_head_dim: int = 0

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden // self.heads

    @property
    def layer_params(self) -> int:
        """Matrix parameters of one decoder layer (attention + MLP; norms and biases are negligible)."""
        return sum(o * i for o, i in self.layer_matrices())

    @property
    def matmul_params(self) -> int:
        """Parameters multiplied per token: every layer's matrices plus the LM head (the embedding is a lookup)."""
        return self.layers * self.layer_params + self.vocab * self.hidden

    def layer_matrices(self) -> tuple[tuple[int, int], ...]:
        """One decoder layer's weight matrices in the order a forward multiplies them, ``(out_features,
        in_features)``: q, k, v, o, then the MLP's gate, up and down."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        h, i = self.hidden, self.intermediate
        return ((q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i))

    def matrices(self) -> dict[tuple[int, int], int]:
        """The weight matrices a forward multiplies, as ``{(out_features, in_features): count}``: per layer q, k, v,
        o and the MLP's gate, up and down, and the LM head once."""
        out: dict[tuple[int, int], int] = {}
        for dims in self.layer_matrices():
            out[dims] = out.get(dims, 0) + self.layers
        out[(self.vocab, self.hidden)] = out.get((self.vocab, self.hidden), 0) + 1
        return out

    @property
    def total_params(self) -> int:
        """All parameters (embedding counted once when tied)."""
        return self.matmul_params + (0 if self.tied else self.vocab * self.hidden)

    def weight_bytes(self, bytes_per_param: float) -> float:
        """Bytes a forward reads for its weights: the matrices it multiplies plus one embedding row per token
        (negligible), at ``bytes_per_param`` (2 for bf16/fp16, 4 for fp32, ≈ 0.6 for Q4_K_M)."""
        return self.matmul_params * bytes_per_param

    def kv_bytes_per_token(self, bytes_per_value: float = 2.0) -> float:
        """KV-cache bytes per cached token: K and V, every layer, every KV head."""
        return 2 * self.layers * self.kv_heads * self.head_dim * bytes_per_value

    def flops(self, n: float, context: float) -> float:
        """Floating-point operations of a forward over ``n`` new tokens after ``context`` cached ones:
        2 per multiply-add of the matrices, plus attention (q·k and p·v over the visible keys)."""
        attention = 4 * self.layers * self.heads * self.head_dim * n * (context + (n + 1) / 2)
        return 2.0 * self.matmul_params * n + attention


def _qwen(hidden, intermediate, layers, heads, kv_heads, vocab, tied) -> ModelShape:
    return ModelShape("qwen2", hidden, intermediate, layers, heads, kv_heads, vocab, tied, qkv_bias=True)


def _qwen3(hidden, intermediate, layers, heads, vocab, tied) -> ModelShape:
    return ModelShape("qwen3", hidden, intermediate, layers, heads, 8, vocab, tied, max_positions=40960,
                      explicit_head_dim=128)


def _llama(hidden, intermediate, layers, heads, vocab=32000) -> ModelShape:
    return ModelShape("llama", hidden, intermediate, layers, heads, heads, vocab, False, max_positions=2048)


SHAPES: dict[str, ModelShape] = {
    "qwen2.5-0.5b": _qwen(896, 4864, 24, 14, 2, 151936, True),
    "qwen2.5-1.5b": _qwen(1536, 8960, 28, 12, 2, 151936, True),
    "qwen2.5-3b": _qwen(2048, 11008, 36, 16, 2, 151936, True),
    "qwen2.5-7b": _qwen(3584, 18944, 28, 28, 4, 152064, False),
    "qwen2.5-14b": _qwen(5120, 13824, 48, 40, 8, 152064, False),
    "qwen2.5-32b": _qwen(5120, 27648, 64, 40, 8, 152064, False),
    "qwen3-0.6b": _qwen3(1024, 3072, 28, 16, 151936, True),
    "qwen3-1.7b": _qwen3(2048, 6144, 28, 16, 151936, True),
    "qwen3-4b": _qwen3(2560, 9728, 36, 32, 151936, True),
    "qwen3-8b": _qwen3(4096, 12288, 36, 32, 151936, False),
    "qwen3-32b": _qwen3(5120, 25600, 64, 64, 151936, False),
    "vicuna-68m": _llama(768, 3072, 2, 12),
    "vicuna-7b": _llama(4096, 11008, 32, 32),
    "vicuna-13b": _llama(5120, 13824, 40, 40),
    "vicuna-33b": _llama(6656, 17920, 60, 52),
}
"""Model shapes by name (see the module docstring for the sources). The Qwen2.5-Coder models share the Qwen2.5
shapes of the same size."""

ALIASES = {"0.5b": "qwen2.5-0.5b", "1.5b": "qwen2.5-1.5b", "3b": "qwen2.5-3b", "7b": "qwen2.5-7b",
           "14b": "qwen2.5-14b", "32b": "qwen2.5-32b"}


def shape(name: str) -> ModelShape:
    """The shape named ``name`` (a :data:`SHAPES` key, an alias such as ``7b``, a zoo name such as
    ``qwen2.5-coder-1.5b-instruct``, or a ``synthetic:`` spec).

    Raises:
        ConfigError: an unknown name (the message lists the choices).
    """
    if is_synthetic(name):
        return parse_synthetic(name).shape
    key = shape_key(name)
    if key is None:
        raise ConfigError(f"unknown model shape {name!r}; choose one of {', '.join(SHAPES)} "
                          f"(or {', '.join(ALIASES)})")
    return SHAPES[key]


def shape_key(name: str) -> str | None:
    """The :data:`SHAPES` key for ``name`` (see :func:`shape`), or None."""
    low = name.strip().lower()
    if low.startswith(PREFIX):
        low = low[len(PREFIX):].split(":", 1)[0]
    low = ALIASES.get(low, low)
    if low in SHAPES:
        return low
    m = re.fullmatch(r"(qwen2\.5)-coder-([\d.]+b)(-instruct)?(@\w+)?", low)
    if m and f"{m[1]}-{m[2]}" in SHAPES:
        return f"{m[1]}-{m[2]}"
    return None


def is_synthetic(spec: str | None) -> bool:
    """True for a ``synthetic:`` model spec (or a loaded model's name)."""
    return bool(spec) and str(spec).strip().lower().startswith(PREFIX)


def refuse_synthetic(spec: str | None, what: str) -> None:
    """Raise ConfigError when ``spec`` is synthetic: ``what`` (e.g. "adaspec eval") measures text, and random
    weights have none."""
    if is_synthetic(spec):
        raise ConfigError(f"{spec} is a synthetic model (random weights, for timing only): {what} measures the "
                          "text a model writes, so it needs a real model (a zoo name, a .gguf file, a local "
                          "folder or a Hugging Face id)")


@dataclass(frozen=True)
class SyntheticSpec:
    """A parsed ``synthetic:<shape>[:layers=N]`` spec."""

    key: str
    layers: int | None = None

    @property
    def name(self) -> str:
        return f"{PREFIX}{self.key}" + (f":layers={self.layers}" if self.layers else "")

    @property
    def shape(self) -> ModelShape:
        s = SHAPES[self.key]
        if self.layers:
            from dataclasses import replace

            s = replace(s, layers=self.layers)
        return s


def parse_synthetic(spec: str) -> SyntheticSpec:
    """Parse ``synthetic:<shape>[:layers=N]``.

    Raises:
        ConfigError: not a synthetic spec, an unknown shape (names the choices), or a bad ``layers``.
    """
    if not is_synthetic(spec):
        raise ConfigError(f"{spec!r} is not a synthetic model spec (synthetic:<shape>)")
    body = spec.strip()[len(PREFIX):]
    name, _, option = body.partition(":")
    key = shape_key(name)
    if key is None:
        raise ConfigError(f"unknown synthetic model {spec!r}; choose synthetic:<shape> with a shape from "
                          f"{', '.join(SHAPES)}")
    layers = None
    if option:
        m = re.fullmatch(r"layers=(\d+)", option)
        if not m or not 1 <= int(m[1]) <= SHAPES[key].layers:
            raise ConfigError(f"{spec!r}: expected :layers=N with 1 <= N <= {SHAPES[key].layers}")
        layers = int(m[1])
    return SyntheticSpec(key, layers)


def synthetic_config(spec: SyntheticSpec):
    """The transformers config (``Qwen2Config``, ``Qwen3Config`` or ``LlamaConfig``) of a synthetic spec."""
    return shape_config(spec.shape)


def shape_config(s: ModelShape):
    """The transformers config (``Qwen2Config``, ``Qwen3Config`` or ``LlamaConfig``) of a model shape."""
    common = dict(hidden_size=s.hidden, intermediate_size=s.intermediate, num_hidden_layers=s.layers,
                  num_attention_heads=s.heads, num_key_value_heads=s.kv_heads, vocab_size=s.vocab,
                  tie_word_embeddings=s.tied, max_position_embeddings=s.max_positions, rms_norm_eps=1e-6,
                  bos_token_id=None, eos_token_id=SyntheticTokenizer.EOS_ID, pad_token_id=0)
    if s.family == "qwen2":
        from transformers import Qwen2Config

        return Qwen2Config(rope_theta=1e6, use_sliding_window=False, **common)
    if s.family == "qwen3":
        from transformers import Qwen3Config

        return Qwen3Config(rope_theta=1e6, use_sliding_window=False, head_dim=s.head_dim, **common)
    from transformers import LlamaConfig

    return LlamaConfig(**common)


def build_synthetic(spec: str, *, dtype, device: str = "cpu", seed: int = 0):
    """A random-weight causal LM of the shape ``spec`` names, in eval mode, built directly on ``device``.

    Weights follow transformers' own initialisation (normal, std = the config's ``initializer_range``, 0.02),
    seeded by ``seed`` (the same spec and seed give the same model on the same device).

    Args:
        spec: ``synthetic:<shape>[:layers=N]``.
        dtype: a torch dtype (bf16/fp16 on GPUs; fp32 or bf16 on CPUs).
        device: ``"cpu"`` or ``"cuda"`` (the model is allocated there, never on the host first).

    Raises:
        ConfigError: see :func:`parse_synthetic`.
    """
    import torch
    from transformers import AutoModelForCausalLM

    parsed = parse_synthetic(spec)
    config = synthetic_config(parsed)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


class SyntheticTokenizer(ByT5Tokenizer):
    """Byte-level tokenizer of synthetic models (transformers' ByT5 tokenizer: pad 0, EOS 1, unk 2, byte b at
    id b + 3), extended so every id of a large vocabulary decodes: id i ≥ 259 decodes as byte (i - 3) mod 256."""

    EOS_ID = 1
    _BYTE_IDS = 256 + 3

    def _convert_id_to_token(self, index: int) -> str:
        if index >= self._BYTE_IDS:
            index = 3 + (index - 3) % 256
        return super()._convert_id_to_token(index)
