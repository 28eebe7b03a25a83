"""The kernel noise of a target: how far its logits move between a one-token forward and a wider one over the same
tokens (:func:`kernel_noise`); a divergence threshold is :data:`NOISE_FACTOR` times it."""

from __future__ import annotations

NOISE_FACTOR = 4.0


def kernel_noise(backend, prompt_ids: list[int], *, tokens: int = 32, widths: tuple[int, ...] = (3, 5, 9)) -> float:
    """The largest logit difference (logit units) between decoding ``tokens`` tokens one per forward and verifying
    the same tokens ``width`` per forward (for each of ``widths``), after the same prompt, on ``backend`` with
    strict mode off (that is the noise a non-strict speculative run meets)."""
    return max(_noise(backend, prompt_ids, tokens=tokens, width=w) for w in widths)


def _noise(backend, prompt_ids: list[int], *, tokens: int, width: int) -> float:
    was = backend.batch_invariant
    backend.batch_invariant = False
    try:
        backend.reset()
        logits = backend.forward(prompt_ids, 1)
        seq, one = [], []
        for _ in range(tokens):
            seq.append(int(logits[-1].argmax()))
            logits = backend.forward([seq[-1]], 1)
            one.append(logits[-1].float())
        backend.reset()
        backend.forward(prompt_ids, 1)
        many = []
        for start in range(0, tokens, width):
            chunk = seq[start:start + width]
            many.extend(backend.forward(chunk, len(chunk)).float())
        return float(max((a - b).abs().max() for a, b in zip(one, many)))
    finally:
        backend.reset()
        backend.batch_invariant = was
