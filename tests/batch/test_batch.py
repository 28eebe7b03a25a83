"""Batched speculative decoding (adaspec.batch): each row as if alone, continuous joins and leaves, bad input,
and the batch pricer's choice of K."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from conftest import tiny_model

from adaspec.api import load_model
from adaspec.backends.base import BatchRow
from adaspec.backends.torch_backend import TorchBackend
from adaspec.batch import BatchEngine
from adaspec.controllers import make_controller
from adaspec.controllers.batch import BatchPricer, RowEstimate, expected
from adaspec.drafters.model import ModelDrafter
from adaspec.drafters.ngram import NgramDrafter
from adaspec.engine import GenerationConfig, SpeculativeEngine
from adaspec.errors import ConfigError, ContextLengthError

HAVE_LLAMACPP = importlib.util.find_spec("llama_cpp") is not None
HAVE_IK = importlib.util.find_spec("ik_llama_cpp") is not None
GGUF_MODEL = "smollm2-135m-instruct"
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 1, 2, 3] * 3, [10, 11, 12, 13] * 4, [20, 21, 22, 23, 24], [30, 31, 32] * 5,
           [40, 41] * 6]


def _alone(target, drafter, k, prompts, cfg):
    engine = SpeculativeEngine(target, drafter, make_controller("fixed", k) if drafter else None)
    return [engine.generate(p, cfg).token_ids for p in prompts]


@pytest.mark.parametrize("drafter", ["none", "ngram", "model"])
def test_torch_fp32_batched_rows_equal_each_request_alone(drafter):
    torch.set_num_threads(2)
    model = tiny_model("qwen", seed=0)
    target = TorchBackend(model, "t", max_sequences=3)
    draft = TorchBackend(tiny_model("qwen", seed=0, layers=2), "d", max_sequences=3)
    prompts = [[p % 64 for p in prompt] for prompt in PROMPTS]
    cfg = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    make = {"none": None, "ngram": lambda seq: NgramDrafter(),
            "model": lambda seq: ModelDrafter(draft.sequence(seq))}[drafter]
    engine = BatchEngine(target, make, (lambda: make_controller("fixed", 3)) if make else None, max_batch=3)
    results = engine.generate(prompts, cfg)  # 5 requests through 3 rows: two join as others finish
    alone_target = TorchBackend(model, "t")
    alone_draft = ModelDrafter(TorchBackend(draft.model, "d")) if drafter == "model" else (
        NgramDrafter() if drafter == "ngram" else None)
    want = _alone(alone_target, alone_draft, 3, prompts, cfg)
    assert [r.token_ids for r in results] == want
    assert all(len(r.token_ids) == 24 and r.finish_reason == "length" for r in results)
    if drafter != "none":
        assert sum(r.stats.draft_tokens for r in results) > 0
        assert max(s.batch for r in results for s in r.stats.steps) == 3


@pytest.mark.skipif(not HAVE_LLAMACPP, reason="needs llama-cpp-python")
@pytest.mark.parametrize("batch", [2, 4])
def test_llamacpp_refuses_strict_in_a_batch_and_strict_alone_is_exact(batch):
    """llama.cpp rows can change with the other rows of a batch (measured on an AVX2 machine), so a strict request
    in a batch is refused; strict requests one at a time (max_batch 1) stay token-for-token plain strict decoding,
    and non-strict batching runs."""
    from adaspec.backends.llamacpp_backend import LlamaCppBackend

    path = load_model(f"{GGUF_MODEL}@llamacpp", progress=False, threads=2).backend.path
    target = LlamaCppBackend(path, max_context=512, threads=2, max_sequences=batch, batch_invariant=True)
    alone = LlamaCppBackend(path, max_context=512, threads=2, batch_invariant=True)
    cfg = GenerationConfig(max_new_tokens=24, ignore_eos=True, strict=True)
    engine = BatchEngine(target, lambda seq: NgramDrafter(), lambda: make_controller("fixed", 3))
    with pytest.raises(ConfigError, match="rows do not mix"):
        engine.add(PROMPTS[0], cfg)
    one = BatchEngine(target, lambda seq: NgramDrafter(), lambda: make_controller("fixed", 3), max_batch=1)
    results = one.generate(PROMPTS[:2], cfg)
    assert [r.token_ids for r in results] == _alone(alone, None, 0, PROMPTS[:2], cfg)
    target.batch_invariant = False
    loose = engine.generate(PROMPTS, GenerationConfig(max_new_tokens=8, ignore_eos=True))
    assert [len(r.token_ids) for r in loose] == [8] * len(PROMPTS)
    assert max(s.batch for r in loose for s in r.stats.steps) == batch


@pytest.mark.skipif(not HAVE_IK, reason="needs ik-llama-cpp-python")
def test_ik_refuses_strict_in_a_batch_but_batches_otherwise():
    from adaspec.backends.ik_backend import IkLlamaBackend

    path = load_model(f"{GGUF_MODEL}@ik", progress=False, threads=2).backend.path
    target = IkLlamaBackend(path, max_context=256, threads=2, max_sequences=2)
    engine = BatchEngine(target)
    with pytest.raises(ConfigError, match="rows do not mix"):
        engine.add([1, 2, 3], GenerationConfig(strict=True))
    results = engine.generate(PROMPTS[:3], GenerationConfig(max_new_tokens=8, ignore_eos=True))
    assert [len(r.token_ids) for r in results] == [8, 8, 8]


def test_joins_leaves_cancel_and_bad_input():
    model = tiny_model("qwen", seed=0)
    target = TorchBackend(model, "t", max_context=64, max_sequences=2)
    engine = BatchEngine(target, lambda seq: NgramDrafter(), lambda: make_controller("fixed", 2))
    with pytest.raises(ContextLengthError, match="context window is 64"):
        engine.add(list(range(64)))
    with pytest.raises(ConfigError, match="empty"):
        engine.add([])
    with pytest.raises(ConfigError, match="max_batch"):
        BatchEngine(target, max_batch=3)
    assert not engine  # nothing was queued by the refused requests
    cfg = GenerationConfig(max_new_tokens=10, ignore_eos=True)
    a, b, c = (engine.add([i + 1, i + 2, i + 3], cfg) for i in range(3))
    first = engine.step()
    assert set(first) == {a, b} and engine.waiting == 1  # FIFO: the third waits for a free row
    assert engine.cancel(a) and not engine.cancel(a)
    second = engine.step()
    assert set(second) == {b, c}  # c took a's row at the step boundary; b went on
    done = {}
    while engine:
        for rid, chunk in engine.step().items():
            if chunk.result is not None:
                done[rid] = chunk.result
    alone = SpeculativeEngine(TorchBackend(model, "t"), NgramDrafter(), make_controller("fixed", 2))
    assert done[b].token_ids == alone.generate([2, 3, 4], cfg).token_ids
    assert done[c].token_ids == alone.generate([3, 4, 5], cfg).token_ids


def test_forward_batch_validates_before_touching_a_cache():
    target = TorchBackend(tiny_model("qwen", seed=0), "t", max_context=16, max_sequences=2)
    target.forward_batch([BatchRow(0, [1, 2, 3]), BatchRow(1, [4, 5])])
    with pytest.raises(ValueError, match="twice"):
        target.forward_batch([BatchRow(1, [1]), BatchRow(1, [2])])
    with pytest.raises(ValueError, match="out of range"):
        target.forward_batch([BatchRow(2, [1])])
    with pytest.raises(ContextLengthError, match="sequence 1"):
        target.forward_batch([BatchRow(0, [1]), BatchRow(1, list(range(15)))])
    assert (target.seq_len_of(0), target.seq_len_of(1)) == (3, 2)


@pytest.mark.parametrize("arch", ["qwen", "llama"])
def test_padded_forward_equals_each_sequence_alone(arch):
    """Rows of different cache lengths and new-token counts in one padded forward: the logits of each row equal
    that sequence run alone (fp32 kernel tolerance), caches keep exactly the real tokens, rollback works after it,
    a long row (prefill) runs alone in the same call, and strict mode takes the bit-exact per-row path."""
    model = tiny_model(arch, seed=3)
    batched = TorchBackend(model, "t", max_sequences=4, pad_batch_max_tokens=8)
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9], [], list(range(40, 60))]
    steps = [[[20, 21], [22], [30, 31, 32, 33], [9]], [[5], [6, 7, 8], [2], [3, 4]]]
    calls = []
    original = batched._forward_padded
    batched._forward_padded = lambda rows: calls.append([r.seq for r in rows]) or original(rows)
    history = [list(p) for p in prompts]
    first = [BatchRow(i, p) for i, p in enumerate(prompts) if p]
    batched.forward_batch(first)
    assert calls == [[0, 1]]  # the 20-token prompt is over pad_batch_max_tokens: it ran alone
    alone = TorchBackend(model, "t")
    for step in steps:
        rows = [BatchRow(i, s, len(s)) for i, s in enumerate(step)]
        out = batched.forward_batch(rows)
        for i, s in enumerate(step):
            alone.truncate(0)
            if history[i]:
                alone.forward(history[i])
            want = alone.forward(s, len(s))
            assert out[i].shape == want.shape
            torch.testing.assert_close(out[i], want, atol=1e-5, rtol=1e-5)
            assert out[i].argmax(-1).tolist() == want.argmax(-1).tolist()
            history[i] += s
            assert batched.seq_len_of(i) == len(history[i])
    assert calls[1:] == [[0, 1, 2, 3], [0, 1, 2, 3]]
    batched.truncate_seq(2, 2)  # rollback after a padded step, then another padded step
    history[2] = history[2][:2]
    out = batched.forward_batch([BatchRow(2, [11, 12], 2), BatchRow(0, [13], 1)])
    alone.truncate(0)
    alone.forward(history[2])
    torch.testing.assert_close(out[0], alone.forward([11, 12], 2), atol=1e-5, rtol=1e-5)
    batched.batch_invariant = True
    calls.clear()
    batched.forward_batch([BatchRow(0, [1]), BatchRow(1, [2])])
    assert calls == []  # strict mode: one row after another


def test_padded_forward_at_the_end_of_a_learned_position_table():
    """GPT-2 has a learned position table of max_context rows: a padding query must not ask for a position past a
    row's last real one (row 0 ends at 31 of 32; row 1's 5 tokens pad row 0's single token to 5)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2)).eval()
    batched = TorchBackend(model, "g", max_sequences=2)
    batched.forward_batch([BatchRow(0, list(range(1, 31))), BatchRow(1, [1, 2])])
    out = batched.forward_batch([BatchRow(0, [5]), BatchRow(1, [1, 2, 3, 4, 5])])
    alone = TorchBackend(model, "a")
    alone.forward(list(range(1, 31)))
    torch.testing.assert_close(out[0], alone.forward([5]), atol=1e-5, rtol=1e-5)
    assert (batched.seq_len_of(0), batched.seq_len_of(1)) == (31, 7)


def test_pricer_shrinks_k_as_the_batch_grows_on_a_compute_bound_curve():
    # a CPU-like curve: 60 ms for one token, +12 ms per extra token (compute-bound)
    curve = {n: 60.0 + 12.0 * (n - 1) for n in (1, 2, 4, 8, 16, 32, 64, 128)}
    pricer = BatchPricer(curve)
    row = RowEstimate(k=8, alpha=0.7, draft_ms=5.0)
    caps = [pricer.cap([row] * b) for b in (1, 2, 4, 8, 16)]
    assert caps[0] >= 2 and caps == sorted(caps, reverse=True) and caps[-1] == 0
    # a flat (memory-bound) curve keeps speculating at every batch size when drafting is cheap (n-gram) ...
    flat = BatchPricer({n: 60.0 for n in (1, 128)})
    cheap = RowEstimate(k=8, alpha=0.7, draft_ms=0.1)
    assert flat.cap([cheap] * 16) >= 4
    # ... but not when every row's drafts cost a draft-model forward each (they run row after row)
    assert flat.cap([row] * 16) == 0
    # the goodput it compares is the formula's
    assert pricer.goodput([row], 2) == pytest.approx(expected(0.7, 2) / (10.0 + curve[1] + 24.0))
    assert expected(0.5, 2) == pytest.approx(1.75) and expected(1.0, 3) == 4.0
    assert BatchPricer().cap([row]) == 8  # not calibrated: the rows' own K


def test_a_zero_cap_still_probes_so_acceptance_is_measured():
    """A curve on which the acceptance prior (0.6) says K = 0 for two rows: without probes the rows never draft, so
    their acceptance (1.0 on these repeating prompts) is never seen; with probe_every = 4 every 4th step drafts. A
    lone row is not capped at all (its own controller prices its forward)."""
    curve = {n: 10.0 + 15.0 * (n - 1) for n in (1, 2, 4, 8, 16)}
    model = tiny_model("qwen", seed=0)
    prompts = [[3, 4, 5, 6] * 6, [7, 8, 9] * 8]
    cfg = GenerationConfig(max_new_tokens=24)
    want = _alone(TorchBackend(model, "t"), None, 0, prompts, cfg)
    two = [RowEstimate(4, 0.6, 0.0)] * 2
    assert BatchPricer(curve).cap(two) == 0 and BatchPricer(curve).best_positive(two) >= 1
    for probe_every, expect_drafts in ((0, False), (4, True)):
        engine = BatchEngine(TorchBackend(model, "t", max_sequences=2), lambda seq: NgramDrafter(),
                             lambda: make_controller("fixed", 4), max_batch=2, pricer=BatchPricer(curve),
                             probe_every=probe_every)
        rids = [engine.add(p, cfg) for p in prompts]
        caps, results = [], {}
        while len(results) < 2:
            for rid, chunk in engine.step().items():
                if chunk.result is not None:
                    results[rid] = chunk.result
            caps.append(engine.last_cap)
        assert [results[r].token_ids for r in rids] == want
        assert all((results[r].stats.draft_tokens > 0) == expect_drafts for r in rids)
        priced = [c for c in caps if c is not None][:8]
        assert all((c > 0) == (bool(probe_every) and i % 4 == 3) for i, c in enumerate(priced))
    lone = BatchEngine(TorchBackend(model, "t", max_sequences=1), lambda seq: NgramDrafter(),
                       lambda: make_controller("fixed", 4), max_batch=1, pricer=BatchPricer(curve), probe_every=0)
    rid = lone.add(prompts[0], cfg)
    result = None
    while result is None:
        result = lone.step()[rid].result
    assert result.token_ids == want[0] and result.stats.draft_tokens > 0 and lone.last_cap is None


def test_a_new_rows_goodput_controller_is_seeded_with_the_batch_curve():
    from adaspec.controllers.goodput import GoodputController

    curve = {1: 20.0, 2: 24.0, 5: 30.0, 9: 40.0}
    made: list[GoodputController] = []

    def factory():
        made.append(GoodputController())
        return made[-1]
    pricer = BatchPricer(curve)
    engine = BatchEngine(TorchBackend(tiny_model("qwen", seed=0), "t", max_sequences=2), lambda seq: NgramDrafter(),
                         factory, max_batch=2, pricer=pricer)
    engine.add([1, 2, 3, 1, 2, 3], GenerationConfig(max_new_tokens=2))
    engine.step()
    row = made[-1]
    assert row.costs.measured and row.costs.seeded == {next(iter(row.costs.seeded)): curve}
    uncalibrated = BatchEngine(TorchBackend(tiny_model("qwen", seed=0), "t", max_sequences=2),
                               lambda seq: NgramDrafter(), factory, max_batch=2)
    uncalibrated.add([1, 2, 3], GenerationConfig(max_new_tokens=2))
    uncalibrated.step()
    assert not made[-1].costs.seeded  # nothing measured: nothing seeded


def test_hybrid_drafter_under_goodput_routes_per_row_and_stays_exact():
    """The default drafter (n-gram or draft model, chosen per step by the goodput controller) in a batch: both
    sub-drafters are used, and fp32 rows equal plain decoding of each request alone."""
    from adaspec.drafters.multi import MultiDrafter

    model = tiny_model("qwen", seed=0)
    target = TorchBackend(model, "t", max_sequences=2)
    draft = TorchBackend(tiny_model("qwen", seed=0, layers=2), "d", max_sequences=2)
    engine = BatchEngine(target,
                         lambda seq: MultiDrafter({"ngram": NgramDrafter(), "d": ModelDrafter(draft.sequence(seq))}),
                         lambda: make_controller("goodput", None))
    prompts = [[1, 2, 3, 4, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    cfg = GenerationConfig(max_new_tokens=30, ignore_eos=True)
    results = engine.generate(prompts, cfg)
    assert [r.token_ids for r in results] == _alone(TorchBackend(model, "t"), None, 0, prompts, cfg)
    assert {s.drafter for r in results for s in r.stats.steps} >= {"ngram", "d"}


def test_per_request_drafters_and_controllers_in_one_batch():
    """Rows with different drafters (none, n-gram, draft model) and K share one batch; each equals itself alone."""
    torch.set_num_threads(2)
    model, dmodel = tiny_model("qwen", seed=0), tiny_model("qwen", seed=0, layers=2)
    target, draft = TorchBackend(model, "t", max_sequences=3), TorchBackend(dmodel, "d", max_sequences=3)
    prompts = [[p % 64 for p in prompt] for prompt in PROMPTS[:3]]
    cfg = GenerationConfig(max_new_tokens=20, ignore_eos=True)
    engine = BatchEngine(target, max_batch=3)
    model_drafter = ModelDrafter(draft)
    specs = [(None, 0), (NgramDrafter().for_sequence, 2), (model_drafter.for_sequence, 4)]
    rids = [engine.add(p, cfg, drafter_for=d, controller_factory=(lambda k=k: make_controller("fixed", k)))
            for p, (d, k) in zip(prompts, specs)]
    results = {}
    while engine:
        for rid, chunk in engine.step().items():
            assert chunk.error is None
            if chunk.result is not None:
                results[rid] = chunk.result
    alone = TorchBackend(model, "t")
    want = [_alone(alone, None, 0, prompts[:1], cfg)[0], _alone(alone, NgramDrafter(), 2, prompts[1:2], cfg)[0],
            _alone(alone, ModelDrafter(TorchBackend(dmodel, "d")), 4, prompts[2:], cfg)[0]]
    assert [results[r].token_ids for r in rids] == want
    assert results[rids[0]].stats.draft_tokens == 0
    assert max(s.k for s in results[rids[2]].stats.steps) == 4 and max(s.k for s in results[rids[1]].stats.steps) <= 2
    with pytest.raises(ConfigError, match="needs a drafter"):
        engine.add([1, 2], cfg, controller_factory=lambda: make_controller("fixed", 3))


class _Boom(NgramDrafter):
    """An n-gram drafter that raises on its ``fail_at``-th proposal."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.calls, self.fail_at = 0, fail_at

    def propose(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("drafter exploded")
        return super().propose(*args, **kwargs)


class _FlakyBackend(TorchBackend):
    """Fails any forward that contains the token ``poison`` (the batched one, and the poisoned row alone)."""

    poison = 63

    def forward_batch(self, rows):
        if any(self.poison in r.input_ids for r in rows):
            healthy = [r for r in rows if self.poison not in r.input_ids]
            if healthy:  # the healthy rows' caches already hold their tokens, as a runtime failing midway leaves them
                super().forward_batch(healthy)
            raise RuntimeError("decode failed")
        return super().forward_batch(rows)


def _drain(engine: BatchEngine) -> tuple[dict, dict]:
    """Step until the batch is empty: (results, errors) by request id."""
    results, errors = {}, {}
    while engine:
        for rid, chunk in engine.step().items():
            if chunk.error is not None:
                errors[rid] = chunk.error
            elif chunk.result is not None:
                results[rid] = chunk.result
    return results, errors


def test_a_failing_row_leaves_the_batch_and_the_others_are_untouched():
    torch.set_num_threads(2)
    model = tiny_model("qwen", seed=0)
    prompts = [[p % 64 for p in prompt] for prompt in PROMPTS[:3]]
    cfg = GenerationConfig(max_new_tokens=16, ignore_eos=True)
    want = _alone(TorchBackend(model, "t"), NgramDrafter(), 3, prompts, cfg)
    # 1. a drafter that raises mid-request: that row ends with the error, the others finish as if alone
    target = TorchBackend(model, "t", max_sequences=3)
    engine = BatchEngine(target, lambda seq: _Boom(3) if seq == 1 else NgramDrafter(),
                         lambda: make_controller("fixed", 3), max_batch=3)
    rids = [engine.add(p, cfg) for p in prompts]
    results, errors = _drain(engine)
    assert list(errors) == [rids[1]] and "exploded" in str(errors[rids[1]])
    assert [results[rids[0]].token_ids, results[rids[2]].token_ids] == [want[0], want[2]]
    # 2. the runtime rejects one row's tokens: the batch is retried row by row, only that row fails
    flaky = _FlakyBackend(model, "t", max_sequences=3)
    engine = BatchEngine(flaky, lambda seq: NgramDrafter(), lambda: make_controller("fixed", 3), max_batch=3)
    rids = [engine.add(p, cfg) for p in [prompts[0], prompts[1] + [_FlakyBackend.poison], prompts[2]]]
    results, errors = _drain(engine)
    assert list(errors) == [rids[1]] and "decode failed" in str(errors[rids[1]])
    assert [results[rids[0]].token_ids, results[rids[2]].token_ids] == [want[0], want[2]]
    # the freed row serves the next request
    assert engine.generate([prompts[1]], cfg)[0].token_ids == want[1]
    # generate() raises a row's error
    engine = BatchEngine(TorchBackend(model, "t", max_sequences=2), lambda seq: _Boom(1),
                         lambda: make_controller("fixed", 3))
    with pytest.raises(RuntimeError, match="exploded"):
        engine.generate(prompts[:2], cfg)
    assert not engine


def test_draft_models_draft_for_every_row_in_one_forward_per_draft_step():
    """Batched drafting: K draft steps of B rows are K forwards of the multi-sequence draft backend, each over every
    row still drafting (not B·K one-row forwards); rows stay exact."""
    torch.set_num_threads(2)
    model, dmodel = tiny_model("qwen", seed=0), tiny_model("qwen", seed=0, layers=2)
    target, draft = TorchBackend(model, "t", max_sequences=3), TorchBackend(dmodel, "d", max_sequences=3)
    calls: list[list[int]] = []
    original = draft.forward_batch

    def spy(rows):
        calls.append(sorted(r.seq for r in rows))
        return original(rows)

    draft.forward_batch = spy
    prompts = [[p % 64 for p in prompt] for prompt in PROMPTS[:3]]
    cfg = GenerationConfig(max_new_tokens=12, ignore_eos=True)
    engine = BatchEngine(target, lambda seq: ModelDrafter(draft.sequence(seq)), lambda: make_controller("fixed", 3))
    rids = [engine.add(p, cfg) for p in prompts]
    engine.step()  # the prefill step: no drafting
    assert calls == []
    engine.step()  # every row drafts 3 tokens: its catch-up feed, then 2 one-token feeds, all rows together
    assert calls == [[0, 1, 2]] * 3
    results = {}
    while engine:
        for rid, chunk in engine.step().items():
            if chunk.result is not None:
                results[rid] = chunk.result
    want = _alone(TorchBackend(model, "t"), ModelDrafter(TorchBackend(dmodel, "d")), 3, prompts, cfg)
    assert [results[r].token_ids for r in rids] == want


def test_calibrate_measures_the_draft_model_and_seeds_every_new_row():
    """BatchEngine.calibrate measures the draft model's per-token draft and catch-up costs (hybrid drafter: the
    model part only, the n-gram lookup is free); each new row's goodput controller starts with them, and what a
    finished row measured replaces them for the rows after it."""
    from adaspec.controllers.goodput import GoodputController
    from adaspec.drafters.multi import MultiDrafter

    target = TorchBackend(tiny_model("qwen", seed=0), "t", max_sequences=2, max_context=256)
    draft = TorchBackend(tiny_model("qwen", seed=0, layers=2), "d", max_sequences=2, max_context=256)
    made: list[GoodputController] = []

    def factory():
        made.append(GoodputController())
        return made[-1]
    engine = BatchEngine(target, lambda seq: MultiDrafter({"ngram": NgramDrafter(),
                                                           "d": ModelDrafter(draft.sequence(seq))}), factory)
    engine.calibrate(repeats=1)
    assert set(engine.draft_costs) == {"d"}
    draft_ms, feed_ms = engine.draft_costs["d"]
    assert draft_ms > 0 and feed_ms > 0
    assert draft.seq_len_of(0) == 0  # the measurement left the draft cache as it was
    engine.add([1, 2, 3, 4, 5, 6, 7, 8], GenerationConfig(max_new_tokens=12, ignore_eos=True))
    engine.add([5, 6, 7, 5, 6, 7], GenerationConfig(max_new_tokens=12, ignore_eos=True),
               drafter_for=lambda seq: NgramDrafter())
    engine.step()
    hybrid, lookup = made[-2:]
    assert hybrid.costs.draft_seed == {"d": (draft_ms, feed_ms)}
    assert lookup.costs.draft_seed == {}  # a row is seeded with its own draft models only
    while engine:
        engine.step()
    # a row that drafted with the model passes what it measured on (the lookup drafter's costs are not kept)
    class Always(GoodputController):
        """Drafts K = 2 with "d" after the first step (deterministic, whatever the timings), measuring as usual."""

        def decide(self, options):
            return (None, 0) if self.fresh else ("d", 2)

    def always():
        made.append(Always())
        return made[-1]
    alone = BatchEngine(target, lambda seq: ModelDrafter(draft.sequence(seq)), always)
    alone.draft_costs["d"] = (draft_ms, feed_ms)
    result = alone.generate([[1, 2, 3, 4, 5, 6, 7, 8]], GenerationConfig(max_new_tokens=24, ignore_eos=True))[0]
    assert any(s.drafter == "d" for s in result.stats.steps)
    assert alone.draft_costs["d"] == made[-1].draft_costs()["d"] != (draft_ms, feed_ms)
    alone.draft_costs["d"] = (0.0, 1.0)
    alone._learn({"d": (-1.0, 1.0), "x": (2.0, -1.0)})  # invalid costs are not kept
    assert alone.draft_costs == {"d": (0.0, 1.0)}


def test_the_pricer_charges_a_draft_models_catch_up_and_probes_only_without_one():
    """A row whose draft model must first feed its prompt (a lazily prefilled draft) stalls the whole batch: the
    pricer charges that catch-up (spread over its horizon) and does not probe through it. Measured on this CPU before
    (docs/journal/2026-12-01-batching.md): rows probing through 500-token catch-ups ran at 0.50-0.69x plain at B = 2-4."""
    curve = {n: 70.0 + 12.0 * (n - 1) for n in (1, 2, 4, 8, 16, 32, 64)}
    pricer = BatchPricer(curve, horizon=16)
    steady = RowEstimate(k=4, alpha=0.95, draft_ms=20.0)
    lagging = RowEstimate(k=4, alpha=0.95, draft_ms=20.0, catch_up_ms=2000.0)
    assert pricer.cap([steady] * 2) > 0  # drafts that are in step pay at α 0.95
    assert pricer.cap([lagging] * 2) == 0  # 2 s of prompt to feed first do not
    assert pricer.goodput([lagging, steady], 3) == pytest.approx(
        2 * expected(0.95, 3) / (2 * 20.0 * 3 + 2000.0 / 16 + curve[8]))
    assert pricer.goodput([lagging], 0) == pytest.approx(1 / curve[1])  # no catch-up charged to a plain step
    weak = RowEstimate(k=4, alpha=0.3, draft_ms=20.0)
    assert pricer.cap([weak] * 2) == 0 and pricer.probe_cap([weak] * 2) == pricer.best_positive([weak] * 2) > 0
    slow = RowEstimate(k=4, alpha=0.3, draft_ms=20.0, catch_up_ms=500.0)
    assert pricer.probe_cap([slow, weak]) == 0  # a probe would stall the batch 500 ms > one plain step (82 ms)
    assert pricer.probe_cap([RowEstimate(4, 0.3, 20.0, catch_up_ms=50.0), weak]) > 0  # a short catch-up is fine


def test_a_goodput_rows_plan_carries_its_draft_and_catch_up_costs():
    from adaspec.controllers.goodput import GoodputController
    from adaspec.stats import StepRecord

    ctrl = GoodputController()
    ctrl.seed_verify_costs({1: 100.0, 2: 104.0, 5: 116.0, 9: 132.0}, 40)
    ctrl.seed_draft_costs({"d": (10.0, 2.0)})
    ctrl.set_synced({"d": 0})
    ctrl.update(StepRecord(k=0, drafted=0, accepted=0, emitted=1, context_len=40, draft_ms=0.0, verify_ms=100.0,
                           total_ms=100.0))
    assert ctrl.next_k() > 0  # 39 tokens to feed at 2 ms: it pays
    assert ctrl.planned == (10.0, pytest.approx(2.0 * (41 - 2)))  # the draft model lacks 41 tokens, 2 come anyway
    ctrl.reset()
    assert ctrl.next_k() == 0 and ctrl.planned == (0.0, 0.0)  # a plain step plans nothing


def test_batched_rows_with_a_bounded_draft_catch_up_equal_each_request_alone():
    """Draft models that feed at most 8 tokens at once (``catch_up``), with draft catch-up spread over steps in
    chunks of 4 (prompts of 30 tokens lag the draft by more than the bound): every row's output is its request's
    alone (fp32 greedy), and no draft forward of a row ever fed more than the bound."""
    torch.set_num_threads(2)
    model = tiny_model("qwen", seed=0)
    draft = TorchBackend(tiny_model("qwen", seed=0, layers=2), "d", max_sequences=3)
    widest: list[int] = []
    forward_batch = draft.forward_batch
    draft.forward_batch = lambda rows: (widest.extend(len(r.input_ids) for r in rows), forward_batch(rows))[1]
    prompts = [[p % 64 for p in prompt] for prompt in PROMPTS]
    cfg = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    engine = BatchEngine(TorchBackend(model, "t", max_sequences=3),
                         lambda seq: ModelDrafter(draft.sequence(seq), catch_up=8),
                         lambda: make_controller("fixed", 3), max_batch=3, prefill_chunk=4)
    results = engine.generate(prompts, cfg)
    want = _alone(TorchBackend(model, "t"), ModelDrafter(TorchBackend(draft.model, "d")), 3, prompts, cfg)
    assert [r.token_ids for r in results] == want
    assert sum(r.stats.draft_tokens for r in results) > 0
    assert widest and max(widest) <= 8
