"""Per-step records and per-request statistics.

Following vLLM's spec-decode metrics, everything is derived from a few raw counters: draft tokens proposed,
draft tokens accepted, speculation steps, and per-position accepted counts. Terms:

* α (acceptance rate) = accepted draft tokens / proposed draft tokens.
* τ (mean accepted tokens per step) = tokens emitted per target forward in steps that drafted at least one token
  (accepted drafts + the one correction/bonus token), the Spec-Bench "mean accepted tokens" convention.
* TTFT = wall time from the call to the first generated token (the target's prefill); TPOT = mean time per output
  token after the first.
"""

from __future__ import annotations

import resource
import sys
from dataclasses import asdict, dataclass, field


@dataclass
class StepRecord:
    """One decoding step: draft (K >= 1) or plain (K = 0), then one target forward.

    Attributes:
        k: draft length the controller asked for (after clamping to the tokens left).
        drafted: tokens actually proposed (< k after a confidence stop or a short n-gram match).
        accepted: draft tokens accepted by the verifier (<= drafted).
        emitted: tokens appended to the output (accepted + 1, fewer when a stop condition cut the step).
        context_len: tokens in the sequence before the step.
        draft_ms / verify_ms / total_ms: wall time of drafting, of the target forward + verification + cache
            rollback, and of the whole step, in milliseconds (in a batch, verify_ms is the batch's forward).
        drafter: name of the drafter that proposed ("" for a plain step).
        batch: rows in the target forward of this step (1 outside :class:`~adaspec.batch.BatchEngine`).
        tree: the step proposed a token tree (:mod:`adaspec.tree`) rather than a chain.
        forced: tokens verified ahead of ``drafted`` that the request's grammar forced (drafted free,
            :class:`~adaspec.drafters.forced.ForcedDrafter`): 0 in the engines' records, where the draft counts
            them; set in the step a controller sees (:func:`~adaspec.drafters.forced.without_forced`), whose
            ``drafted`` and ``accepted`` are the wrapped drafter's own, so the forward was ``forced + drafted + 1``
            tokens wide.
    """

    k: int
    drafted: int
    accepted: int
    emitted: int
    context_len: int
    draft_ms: float
    verify_ms: float
    total_ms: float
    drafter: str = ""
    batch: int = 1
    tree: bool = False
    forced: int = 0

    @property
    def depth(self) -> int:
        """Draft positions in a row that the verifier judged along one path: ``drafted`` for a chain; for a tree
        (whose ``drafted`` counts every node), its depth ``k``. Acceptance per position is counted over these: a
        tree that accepted its whole path of depth k was rejected at no position, however many nodes it had."""
        return min(self.drafted, self.k) if self.tree else self.drafted


@dataclass
class GenerationStats:
    """Statistics of one request. Times in milliseconds, memory in bytes."""

    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens not prefilled: from a prefix cache (Backend.reused_tokens) or a batch row
    # that held them (Backend.share_prefix)
    new_tokens: int = 0
    prefill_ms: float = 0.0
    ttft_ms: float = 0.0
    total_ms: float = 0.0
    peak_rss_bytes: int = 0
    steps: list[StepRecord] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    tree_fallback: str = ""  # why a request that asked for token trees verified chains ("" = it did not ask)
    grammar_ms: float = 0.0  # time in the grammar engine (masks, cuts, forced tokens) of a constrained request

    def record(self, step: StepRecord) -> None:
        self.steps.append(step)
        if step.accepted:
            if len(self.accepted_per_position) < step.accepted:
                self.accepted_per_position.extend([0] * (step.accepted - len(self.accepted_per_position)))
            for i in range(step.accepted):
                self.accepted_per_position[i] += 1

    # Raw counters -------------------------------------------------------------------------------------------
    @property
    def speculation_steps(self) -> int:
        return sum(1 for s in self.steps if s.drafted > 0)

    @property
    def draft_tokens(self) -> int:
        return sum(s.drafted for s in self.steps)

    @property
    def accepted_tokens(self) -> int:
        return sum(s.accepted for s in self.steps)

    # Derived ------------------------------------------------------------------------------------------------
    @property
    def acceptance_rate(self) -> float:
        """α = accepted / proposed draft tokens (0.0 when nothing was drafted)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_accepted_tokens(self) -> float:
        """τ = tokens emitted per target forward over steps that drafted (0.0 when none did)."""
        spec = [s for s in self.steps if s.drafted > 0]
        return sum(s.accepted + 1 for s in spec) / len(spec) if spec else 0.0

    @property
    def draft_ms(self) -> float:
        return sum(s.draft_ms for s in self.steps)

    @property
    def verify_ms(self) -> float:
        return sum(s.verify_ms for s in self.steps)

    @property
    def other_ms(self) -> float:
        """Everything that is neither prefill, drafting nor verification (stop checks, detokenising, ...)."""
        return max(0.0, self.total_ms - self.prefill_ms - self.draft_ms - self.verify_ms)

    @property
    def tokens_per_s(self) -> float:
        """New tokens / total wall time (prefill included), tokens/s."""
        return self.new_tokens / (self.total_ms / 1e3) if self.total_ms > 0 else 0.0

    @property
    def tpot_ms(self) -> float:
        """Mean time per output token after the first, ms."""
        return (self.total_ms - self.ttft_ms) / (self.new_tokens - 1) if self.new_tokens > 1 else 0.0

    @property
    def k_trace(self) -> list[int]:
        return [s.k for s in self.steps]

    def summary(self) -> dict:
        """A flat JSON-ready dict of the counters and derived values (no per-step list)."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "new_tokens": self.new_tokens,
            "steps": len(self.steps),
            "speculation_steps": self.speculation_steps,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted_tokens": round(self.mean_accepted_tokens, 4),
            "accepted_per_position": list(self.accepted_per_position),
            "k_trace": self.k_trace,
            "prefill_ms": round(self.prefill_ms, 2),
            "draft_ms": round(self.draft_ms, 2),
            "verify_ms": round(self.verify_ms, 2),
            "other_ms": round(self.other_ms, 2),
            "total_ms": round(self.total_ms, 2),
            "ttft_ms": round(self.ttft_ms, 2),
            "tpot_ms": round(self.tpot_ms, 2),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "peak_rss_bytes": self.peak_rss_bytes,
            **({"tree_fallback": self.tree_fallback} if self.tree_fallback else {}),
            **({"tree_steps": sum(s.tree for s in self.steps)} if any(s.tree for s in self.steps) else {}),
            **({"grammar_ms": round(self.grammar_ms, 2)} if self.grammar_ms else {}),
        }

    def to_dict(self) -> dict:
        """:meth:`summary` plus every :class:`StepRecord`."""
        return {**self.summary(), "step_records": [asdict(s) for s in self.steps]}


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far, bytes (``getrusage``; kB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def compress_trace(trace: list[int], limit: int = 120) -> str:
    """Run-length encode a K trace: [4, 4, 4, 0] → "4x3 0", cut to ``limit`` characters."""
    parts, i = [], 0
    while i < len(trace):
        j = i
        while j < len(trace) and trace[j] == trace[i]:
            j += 1
        parts.append(f"{trace[i]}x{j - i}" if j - i > 1 else str(trace[i]))
        i = j
    text = " ".join(parts)
    return text if len(text) <= limit else text[:limit - 3] + "..."
