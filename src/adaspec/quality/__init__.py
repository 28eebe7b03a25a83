"""Task-accuracy scoring of LLM completions, for comparing plain against speculative decoding.

* :mod:`~adaspec.quality.sandbox`: HumanEval functional correctness (the completion runs against the problem's
  tests in a fresh, resource-limited process; needs ``pip install 'adaspec[eval]'``; not a security sandbox).
* :mod:`~adaspec.quality.gsm8k`: GSM8K reference and final-answer extraction, as in lm-evaluation-harness.
* :mod:`~adaspec.quality.stats`: Wilson intervals, exact McNemar test, Newcombe paired-difference interval.
* :mod:`~adaspec.quality.evaluate`: ``adaspec eval``, over :mod:`~adaspec.quality.noise` (the divergence threshold),
  :mod:`~adaspec.quality.scoring`, :mod:`~adaspec.quality.analysis` and :mod:`~adaspec.quality.report`.
"""

from adaspec.quality.gsm8k import (
    GSM8K_PROMPT,
    extract_answer,
    flexible_extract,
    is_correct,
    reference_answer,
    stated_answer,
    strict_match,
)
from adaspec.quality.sandbox import build_program, check_humaneval, check_many
from adaspec.quality.stats import mcnemar_exact, paired_difference, wilson_interval

__all__ = [
    "GSM8K_PROMPT",
    "build_program",
    "check_humaneval",
    "check_many",
    "extract_answer",
    "flexible_extract",
    "is_correct",
    "mcnemar_exact",
    "paired_difference",
    "reference_answer",
    "stated_answer",
    "strict_match",
    "wilson_interval",
]
