"""Shared fixtures: tiny random-weight models built in-process, a word-level tokenizer, and engine builders.

Nothing here downloads anything. The models are fp32 and deterministic (fixed ``torch.manual_seed``):

* ``qwen``: a 4-layer Qwen2 target. Its LM head is scaled up so argmaxes are decisive (a random model's logits
  are near-uniform otherwise), and its top two layers are damped so the 2-layer self-draft
  (:func:`adaspec.backends.truncated_layers`, weights shared) agrees with it part of the time.
* ``qwen_indep``: an independently random 2-layer Qwen2 with the same vocabulary (agrees rarely).
* ``llama``: a 4-layer Llama target, so two architectures are covered.
* :class:`MarkovBackend`: a model-free :class:`~adaspec.backends.Backend` whose next-token logits depend on the
  last two tokens, for the statistical tests that need thousands of generations.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from adaspec.backends import Backend, TorchBackend, truncated_layers
from adaspec.controllers import Controller, FixedController, make_controller
from adaspec.drafters import ModelDrafter, NgramDrafter
from adaspec.engine import SpeculativeEngine
from adaspec.errors import ContextLengthError

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _restore_threads():
    """Tests that set PyTorch's thread count (to exercise 2-thread kernels) must not leave it for the next test:
    kernels' row splits, hence strict mode's measured width, depend on it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


VOCAB = 64
EOS_WORD = "<eos>"


def tiny_model(arch: str = "qwen", *, seed: int = 0, layers: int = 4, vocab: int = VOCAB, head_scale: float = 20.0,
               damp_from: int | None = 2, damp: float = 0.4, max_positions: int = 256):
    """A tiny random causal LM (fp32, eval mode)."""
    torch.manual_seed(seed)
    kw = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
              tie_word_embeddings=False)
    if arch == "qwen":
        model = Qwen2ForCausalLM(Qwen2Config(**kw))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**kw))
    else:
        raise ValueError(arch)
    model = model.float().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
        if damp_from is not None:
            for layer in model.model.layers[damp_from:]:
                layer.self_attn.o_proj.weight.mul_(damp)
                layer.mlp.down_proj.weight.mul_(damp)
    return model


@pytest.fixture(scope="session")
def qwen():
    return tiny_model("qwen", seed=0)


@pytest.fixture(scope="session")
def qwen_indep():
    return tiny_model("qwen", seed=1, layers=2, damp_from=None)


@pytest.fixture(scope="session")
def llama():
    return tiny_model("llama", seed=2)


@pytest.fixture(scope="session")
def models(qwen, qwen_indep, llama):
    return {"qwen": qwen, "qwen_indep": qwen_indep, "llama": llama}


def make_drafter(kind: str | None, target_model, *, indep_model=None, max_context: int | None = None):
    """``kind``: None, "trunc" (2-layer self-draft), "indep" (independent model), "self" (the target itself: a
    perfect drafter), "ngram"."""
    if kind is None:
        return None
    if kind == "ngram":
        return NgramDrafter()
    if kind == "trunc":
        return ModelDrafter(TorchBackend(truncated_layers(target_model, 2), "trunc", max_context=max_context))
    if kind == "indep":
        assert indep_model is not None
        return ModelDrafter(TorchBackend(indep_model, "indep", max_context=max_context))
    if kind == "self":
        return ModelDrafter(TorchBackend(target_model, "self", max_context=max_context))
    raise ValueError(kind)


def make_controller_spec(spec: str | int | Controller | None) -> Controller | None:
    """An int is a fixed K; a string is a controller name (adaptive/heuristic/fixed)."""
    if spec is None or isinstance(spec, Controller):
        return spec
    if isinstance(spec, int):
        return FixedController(spec)
    return make_controller(spec)


@pytest.fixture(scope="session")
def make_engine(models):
    """``make_engine(target="qwen", drafter=None, controller=0, tokenizer=None, max_context=None, ...)``: a fresh
    engine with fresh backends (fresh KV caches) over the session's shared tiny models."""

    def build(target: str = "qwen", drafter: str | None = None, controller: str | int | Controller | None = None,
              *, tokenizer=None, max_context: int | None = None, prefill_chunk: int = 2048,
              eos_token_ids: Sequence[int] | None = None, indep: str = "qwen_indep") -> SpeculativeEngine:
        target_model = models[target]
        backend = TorchBackend(target_model, target, max_context=max_context, prefill_chunk=prefill_chunk)
        dr = make_drafter(drafter, target_model, indep_model=models[indep])
        ctrl = make_controller_spec(controller)
        return SpeculativeEngine(backend, dr, ctrl, tokenizer=tokenizer, eos_token_ids=eos_token_ids)

    return build


# A word-level tokenizer over the tiny vocabulary -------------------------------------------------------------
def word(i: int) -> str:
    return EOS_WORD if i == VOCAB - 1 else f"w{i}"


@pytest.fixture(scope="session")
def tokenizer():
    """id i <-> word "w{i}" (id VOCAB-1 is the special "<eos>"); decode joins words with single spaces."""
    from tokenizers import Tokenizer, decoders, models as tok_models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {word(i): i for i in range(VOCAB)}
    tok = Tokenizer(tok_models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with " "
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_WORD)
    assert hf.decode([1, 2, 30], skip_special_tokens=True) == "w1 w2 w30"
    assert hf.eos_token_id == VOCAB - 1
    return hf


# A model-free backend for statistics -------------------------------------------------------------------------
class MarkovBackend(Backend):
    """Next-token logits = ``table[prev2, prev1]`` (a second-order Markov chain; position 0 uses prev2 = 0).

    Honours the Backend cache contract exactly (``seq_len``, ``forward`` appends, ``truncate`` drops), so it
    exercises the engine's bookkeeping without a network's cost.
    """

    def __init__(self, table: torch.Tensor, name: str = "markov", max_context: int = 1 << 20) -> None:
        assert table.dim() == 3 and table.shape[0] == table.shape[1]
        self.table = table.float()
        self.name = name
        self.vocab_size = table.shape[-1]
        self.max_context = max_context
        self.ids: list[int] = []
        self.forward_calls = 0

    @property
    def seq_len(self) -> int:
        return len(self.ids)

    def forward(self, input_ids: Sequence[int], num_logits: int = 1) -> torch.Tensor:
        n = len(input_ids)
        assert 1 <= num_logits <= n
        if len(self.ids) + n > self.max_context:
            raise ContextLengthError(f"{self.name}: over {self.max_context}")
        self.forward_calls += 1
        self.ids.extend(int(t) for t in input_ids)
        rows = []
        for pos in range(len(self.ids) - num_logits, len(self.ids)):
            prev2 = self.ids[pos - 1] if pos >= 1 else 0
            rows.append(self.table[prev2, self.ids[pos]])
        return torch.stack(rows)

    def truncate(self, length: int) -> None:
        assert 0 <= length <= len(self.ids)
        del self.ids[length:]

    def next_probs(self, seq: Sequence[int], temperature: float = 1.0) -> torch.Tensor:
        """Exact next-token distribution after ``seq`` (for reference computations)."""
        prev2 = seq[-2] if len(seq) >= 2 else 0
        return torch.softmax(self.table[prev2, seq[-1]] / temperature, -1)


def markov_table(vocab: int, seed: int, scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(vocab, vocab, vocab, generator=g) * scale
