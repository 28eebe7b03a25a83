"""Backend conformance: the same checks on every backend, on a real model (smollm2-135m-instruct from the zoo).

* ``torch``: the converted fp32 model. Equal up to fp32 rounding (atol 1e-4 on logits).
* ``llamacpp``: the GGUF itself (Q4_1) through llama-cpp-python (the ``llamacpp`` extra; skipped when it is not
  installed -- CI installs it). llama.cpp evaluates a one-token batch with other kernels than a batch of >= 2 tokens,
  whose rows are bit-identical however tokens are split into batches of >= 2. So a truncated cache, extended with
  one token, equals a fresh evaluation with the same batch shapes *exactly*; and greedy speculative decoding (verify
  batches of K + 1) equals plain decoding (one-token batches) except where the kernels flip a near-tie.
* ``llamacpp-invariant``: llama.cpp with ``batch_invariant=True`` (no one-token batches): greedy speculative output
  is token-for-token identical to plain greedy output.
* ``ik`` / ``ik-invariant``: the same GGUF on ik_llama.cpp (ik-llama-cpp-python, repacked tensors), with the same
  claims as llama.cpp. (ik_llama.cpp 0.1.5 computes SmolLM2 differently from llama.cpp -- see
  tests/backends/test_runtime_select.py -- but consistently with itself, which is what these checks are about.)

For all: logits after truncating the KV cache equal a fresh evaluation of the kept prefix; greedy speculative
decoding reproduces the same backend's plain greedy decoding (as precisely as stated above); mixed-backend pairs
refuse mismatched tokenizers.
"""

from __future__ import annotations

import importlib.util
import random

import pytest
import torch

from adaspec.api import LoadedModel, load_model, make_drafter
from adaspec.backends import TorchBackend
from adaspec.controllers import make_controller
from adaspec.drafters import ModelDrafter, NgramDrafter
from adaspec.engine import GenerationConfig, SpeculativeEngine
from adaspec.errors import ConfigError, ContextLengthError, TokenizerMismatchError, UnknownModelError

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
HAVE_LLAMACPP = importlib.util.find_spec("llama_cpp") is not None
HAVE_IK = importlib.util.find_spec("ik_llama_cpp") is not None
needs_llamacpp = pytest.mark.skipif(not HAVE_LLAMACPP, reason="llama-cpp-python not installed (extra: llamacpp)")
needs_ik = pytest.mark.skipif(not HAVE_IK, reason="ik-llama-cpp-python not installed")
BACKENDS = ["torch", pytest.param("llamacpp", marks=needs_llamacpp),
            pytest.param("llamacpp-invariant", marks=needs_llamacpp),
            pytest.param("ik", marks=needs_ik), pytest.param("ik-invariant", marks=needs_ik)]
# max |Δlogit| between a truncated-then-extended cache and a fresh evaluation with the same batch shapes
ATOL = {"torch": 1e-4, "llamacpp": 0.0, "llamacpp-invariant": 0.0, "ik": 0.0, "ik-invariant": 0.0}
NEAR_TIE = 1.0  # llama.cpp: largest |Δlogit| seen between its one-token and multi-token kernels on this model: 0.94
PROMPTS = [
    "Write a Python function that returns the factorial of n.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "List three prime numbers and explain why they are prime.",
]


def _load(backend: str) -> LoadedModel:
    runtime = backend.removesuffix("-invariant")
    spec = MODEL if backend == "torch" else f"{MODEL}@{runtime}"
    lm = load_model(spec, dtype="float32", progress=False, threads=2)
    if backend.endswith("-invariant"):
        lm.backend.batch_invariant = True
    return lm


@pytest.fixture(scope="module", params=BACKENDS)
def pair(request):
    """Two independent instances of the model on one backend: ``a`` is exercised, ``b`` gives fresh evaluations."""
    torch.set_num_threads(2)
    return request.param, _load(request.param), _load(request.param)


def _ids(lm: LoadedModel, text: str) -> list[int]:
    return lm.tokenizer(text)["input_ids"]


def _assert_close(backend: str, got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape
    diff = (got.float() - want.float()).abs().max().item()
    assert diff <= ATOL[backend], f"max |Δlogit| = {diff}"
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize("k", [1, 4])
def test_logits_after_truncation_equal_fresh_evaluation(pair, k):
    backend, lm, fresh = pair
    rng = random.Random(k)
    prompt = _ids(lm, PROMPTS[0])
    vocab = len(lm.tokenizer)
    block = [rng.randrange(vocab) for _ in range(k + 1)]  # [pending] + K drafts
    b = lm.backend
    for keep in range(k + 2):  # every accept/reject pattern
        b.reset()
        b.forward(prompt, 1)
        verify = b.forward(block, k + 1)
        assert verify.shape == (k + 1, b.vocab_size)
        assert b.seq_len == len(prompt) + k + 1
        fresh.backend.reset()
        _assert_close(backend, verify, fresh.backend.forward(prompt + block, k + 1))
        b.truncate(len(prompt) + keep)
        assert b.seq_len == len(prompt) + keep
        nxt = rng.randrange(vocab)
        got = b.forward([nxt], 1)
        fresh.backend.reset()  # same batch shapes: the kept prefix in one batch, then the new token alone
        fresh.backend.forward(prompt + block[:keep], 1)
        _assert_close(backend, got, fresh.backend.forward([nxt], 1))
        if keep:  # the check can fail: a cache holding one wrong token gives clearly different logits
            fresh.backend.reset()
            fresh.backend.forward(prompt + block[:keep - 1] + [(block[keep - 1] + 1) % vocab], 1)
            assert (got - fresh.backend.forward([nxt], 1)).abs().max().item() > 0.5


def test_a_restored_snapshot_holds_the_cache_it_copied(pair):
    """snapshot/restore (a prefix cache's stored copies): after another sequence ran in between, the restored cache
    gives the logits the copied one gave, whole and cut back."""
    backend, lm, fresh = pair
    b = lm.backend
    prompt, other = _ids(lm, PROMPTS[1]), _ids(lm, PROMPTS[2])
    b.reset()
    b.forward(prompt, 1)
    snap = b.snapshot()
    assert snap.length == len(prompt) and snap.nbytes >= len(prompt) * b.kv_bytes_per_token() // 2
    want = b.forward(other[:2], 2)
    b.truncate(len(prompt) - 3)
    want_cut = b.forward(other[:2], 2)
    b.reset()
    b.forward(other, 1)  # another sequence fills the cache
    with pytest.raises(ValueError, match="empty"):
        b.restore(snap)
    b.reset()
    b.restore(snap)
    assert b.seq_len == len(prompt)
    got = b.forward(other[:2], 2)
    _assert_close(backend, got, want)
    b.truncate(len(prompt) - 3)
    _assert_close(backend, b.forward(other[:2], 2), want_cut)
    assert (got - want_cut).abs().max().item() > 0.5  # the check can fail: another cache, other logits
    b.reset()
    b.restore(snap)  # one token after it: strict mode re-runs the restored last token, as after a prefill
    fresh.backend.reset()
    fresh.backend.forward(prompt, 1)
    _assert_close(backend, b.forward(other[:1], 1), fresh.backend.forward(other[:1], 1))


def test_backend_errors(pair):
    _, lm, _ = pair
    b = lm.backend
    b.reset()
    b.forward([1, 2, 3], 1)
    with pytest.raises(ValueError, match="num_logits"):
        b.forward([4], 2)
    with pytest.raises(ValueError, match="truncate"):
        b.truncate(4)
    with pytest.raises(ContextLengthError, match="context window"):
        b.forward([1] * (b.max_context - 2), 1)
    assert b.seq_len == 3  # a refused forward leaves the cache as it was
    b.truncate(0)
    assert b.seq_len == 0


def _first_divergence_is_near_tie(lm: LoadedModel, prompt: list[int], want: list[int], got: list[int]) -> float:
    """At the first position where speculative output ``got`` leaves plain output ``want``, the logit gap between
    the two tokens in plain decoding's own (one-token) evaluation; asserts it is a near-tie."""
    j = next(i for i, (a, b) in enumerate(zip(want, got)) if a != b)
    assert j > 0  # the first token comes from the prompt's prefill in both
    b = lm.backend
    b.reset()
    logits = b.forward(prompt, 1)[0]
    for token in want[:j]:  # replay plain decoding exactly: one token per forward
        logits = b.forward([token], 1)[0]
    gap = (logits[want[j]] - logits[got[j]]).item()
    assert 0 <= gap < NEAR_TIE, f"position {j}: speculative token {got[j]} trails plain's {want[j]} by {gap}"
    return gap


@pytest.mark.parametrize("drafter_kind,k", [("ngram", 4), ("self", 3)])
def test_greedy_speculative_equals_plain(pair, drafter_kind, k):
    backend, lm, other = pair
    if drafter_kind == "self" and backend != "torch":
        other.backend.batch_invariant = lm.backend.batch_invariant
    drafter = NgramDrafter() if drafter_kind == "ngram" else ModelDrafter(other.backend)
    cfg = GenerationConfig(max_new_tokens=40)
    plain = SpeculativeEngine(lm.backend, None, None, tokenizer=lm.tokenizer)
    spec = SpeculativeEngine(lm.backend, drafter, make_controller("fixed", k), tokenizer=lm.tokenizer)
    drafted = accepted = 0
    for text in PROMPTS:
        ids = _ids(lm, text)
        want = plain.generate(ids, cfg)
        got = spec.generate(ids, cfg)
        drafted += got.stats.draft_tokens
        accepted += got.stats.accepted_tokens
        if backend in ("llamacpp", "ik") and got.token_ids != want.token_ids:  # exact up to a kernel near-tie
            _first_divergence_is_near_tie(lm, ids, want.token_ids, got.token_ids)
            continue
        assert got.token_ids == want.token_ids, text
    assert drafted > 0
    if drafter_kind == "self":  # the same model on the same backend drafts its own greedy tokens
        assert accepted / drafted > 0.9


@needs_llamacpp
def test_mixed_pair_torch_target_llamacpp_draft_is_lossless():
    """Target on PyTorch fp32, draft = the same GGUF on llama.cpp: greedy output equals PyTorch's plain output
    exactly (verification is PyTorch's), and the quantised self-draft is accepted most of the time."""
    torch.set_num_threads(2)
    tgt = load_model(MODEL, dtype="float32", progress=False, threads=2)
    drafter = make_drafter(f"{MODEL}@llamacpp", tgt, progress=False)
    assert isinstance(drafter, ModelDrafter) and drafter.name == f"{MODEL}@llamacpp"
    cfg = GenerationConfig(max_new_tokens=40)
    plain = SpeculativeEngine(tgt.backend, None, None, tokenizer=tgt.tokenizer)
    spec = SpeculativeEngine(tgt.backend, drafter, make_controller("fixed", 4), tokenizer=tgt.tokenizer)
    drafted = accepted = 0
    for text in PROMPTS:
        ids = _ids(tgt, text)
        got = spec.generate(ids, cfg)
        assert got.token_ids == plain.generate(ids, cfg).token_ids
        drafted += got.stats.draft_tokens
        accepted += got.stats.accepted_tokens
    assert drafted > 0 and accepted / drafted > 0.7


@needs_llamacpp
def test_mixed_pair_refuses_mismatched_tokenizer(qwen, tokenizer):
    """A tiny PyTorch target with a 64-word tokenizer cannot be drafted for by smollm2 on llama.cpp."""
    target = LoadedModel(TorchBackend(qwen), tokenizer, "tiny-qwen")
    with pytest.raises(TokenizerMismatchError):
        make_drafter(f"{MODEL}@llamacpp", target, progress=False)


@needs_llamacpp
def test_llamacpp_spec_errors():
    with pytest.raises(UnknownModelError, match="GGUF"):
        load_model("Qwen/Qwen2.5-0.5B@llamacpp", progress=False)
    with pytest.raises(ConfigError, match="CPU"):
        load_model(f"{MODEL}@llamacpp", device="cuda", progress=False)


@pytest.mark.parametrize("runtime", [pytest.param("llamacpp", marks=needs_llamacpp), pytest.param("ik", marks=needs_ik)])
def test_gguf_chunked_prefill_is_exact_and_the_backend_refuses_use_after_close(runtime):
    """Prefill split into batches of 4 (the last chunk never a single token in batch-invariant mode), logits spanning
    two chunks: bit-identical to one batch."""
    from adaspec.backends.select import make_gguf_backend
    from adaspec.models import resolve_gguf

    path = resolve_gguf(MODEL, progress=False)[1]
    whole = make_gguf_backend(runtime, path, threads=2, max_context=256, batch_invariant=True)
    small = make_gguf_backend(runtime, path, threads=2, max_context=256, n_batch=4, batch_invariant=True)
    assert small.n_batch == 4 and small.max_context == 256
    ids = list(range(1000, 1013))  # 13 tokens: chunks 4 + 4 + 3 + 2, not 4 + 4 + 4 + 1
    torch.testing.assert_close(small.forward(ids, 6), whole.forward(ids, 6), atol=0, rtol=0)
    torch.testing.assert_close(small.forward([7], 1), whole.forward([7], 1), atol=0, rtol=0)
    assert small.seq_len == whole.seq_len == 14
    small.close()
    with pytest.raises(RuntimeError, match="closed"):
        small.forward([1], 1)


@needs_llamacpp
def test_llamacpp_pld_peer_runs_and_matches_greedy(tmp_path):
    """llama-cpp-python's own prompt lookup decoding (a peer in ``adaspec compare``, run in a worker process of its
    own) on the same GGUF: greedy, so its tokens equal adaspec's plain greedy decoding on the llama.cpp backend (up
    to batched-kernel near-ties: at least the first 16 tokens); the worker stops with the peer."""
    from adaspec.models import resolve_gguf
    from adaspec.peers import PeerContext, make_peer, parse_peer

    lm = _load("llamacpp")
    peer = parse_peer("llamacpp:pld:6")
    assert (peer.library, peer.kind, peer.k) == ("llamacpp", "pld", 6)
    plain = SpeculativeEngine(lm.backend, None, None, tokenizer=lm.tokenizer)
    ctx = PeerContext(target=MODEL, draft=MODEL, threads=2, log_dir=tmp_path, eos_token_ids=plain.eos_token_ids,
                      target_gguf=resolve_gguf(MODEL, progress=False)[1])
    runner = make_peer(peer, ctx)
    ids = _ids(lm, PROMPTS[1])
    try:
        row = runner.generate(ids, max_new_tokens=32)
    finally:
        runner.stop()
    assert row["peer_status"] == "ok", row
    want = plain.generate(ids, GenerationConfig(max_new_tokens=32)).token_ids
    assert row["new_tokens"] == len(row["token_ids"]) > 16
    assert row["token_ids"][:16] == want[:16]
    assert 0 < row["decode_ms"] < row["total_ms"] and row["decode_tokens"] == row["new_tokens"] - 1
    assert runner.proc is None and row["weights"].startswith("GGUF")
