"""A multi-sequence ik_llama.cpp cache under batch-server traffic: rows admitted, prefilled, decoding with drafts
of which a random tail is rejected, and released, over many steps (the pattern that made ik_llama.cpp return NaN
logits for a newly admitted row once released rows had left holes in the shared cells; the NaN then reached every
row through the cells). The backend compacts the cache after every truncation, and refuses non-finite logits: the
call is undone and RuntimeError names the problem."""

from __future__ import annotations

import importlib.util
import random

import numpy as np
import pytest

from adaspec.api import load_model
from adaspec.backends.base import BatchRow

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("ik_llama_cpp") is None, reason="needs ik-llama-cpp-python")]

MODEL = "smollm2-135m-instruct"


@pytest.fixture()
def backend():
    b = load_model(f"{MODEL}@ik", progress=False, threads=2, max_sequences=4).backend
    yield b
    b.close()


def serve_like_traffic(b, steps: int, seed: int) -> int:
    """Drive ``b`` as the batch engine does; returns the steps run. Raises what the backend raises."""
    rng = random.Random(seed)
    rows_state: dict[int, dict] = {}
    for step in range(steps):
        for s in range(b.max_sequences):
            if s not in rows_state and rng.random() < 0.5:  # admitted: its slot is emptied first
                b.truncate_seq(s, 0)
                n = rng.choice([6, 7, 7, 64, 256])
                rows_state[s] = {"prompt": [rng.randrange(100, 2000) for _ in range(n)], "life": rng.randrange(5, 60)}
        rows = []
        for s, st in rows_state.items():
            if st["prompt"]:  # a prefill chunk
                chunk, st["prompt"] = st["prompt"][:64], st["prompt"][64:]
                rows.append(BatchRow(s, chunk, 1))
            else:  # the last token and k drafts
                k = rng.choice([0, 0, 1, 2, 4])
                rows.append(BatchRow(s, [rng.randrange(100, 2000) for _ in range(k + 1)], k + 1))
        before = {r.seq: b.seq_len_of(r.seq) for r in rows}
        outs = b.forward_batch(rows)
        for r, o in zip(rows, outs):
            assert np.isfinite(o.numpy()).all(), (step, r.seq)
            st = rows_state[r.seq]
            if r.num_logits > 1:  # a random tail of the drafts rejected
                b.truncate_seq(r.seq, before[r.seq] + rng.randrange(1, len(r.input_ids) + 1))
            st["life"] -= 1
            if st["life"] <= 0 and not st["prompt"]:  # released
                b.truncate_seq(r.seq, 0)
                del rows_state[r.seq]
    return steps


def test_rows_released_and_admitted_for_many_steps_keep_finite_logits(backend):
    assert backend.compacts_holes
    assert serve_like_traffic(backend, 600, seed=1) == 600


def test_without_compaction_the_runtime_returns_nan_and_the_backend_refuses_it(backend, monkeypatch):
    """The negative control: the same traffic without compaction hits the runtime's NaN (if ik_llama.cpp is fixed
    upstream this fails, and the compaction can go). The refused call leaves every cache as it was."""
    monkeypatch.setattr(type(backend), "compacts_holes", False)
    lengths = []
    real = backend.forward_batch

    def recording(rows):
        lengths[:] = [backend.seq_len_of(s) for s in range(backend.max_sequences)]
        return real(rows)

    monkeypatch.setattr(backend, "forward_batch", recording)
    with pytest.raises(RuntimeError, match="non-finite logits"):
        serve_like_traffic(backend, 600, seed=1)
    assert [backend.seq_len_of(s) for s in range(backend.max_sequences)] == lengths
