"""GSM8K scoring: the reference answer, the model's final answer, and whether they agree.

Follows EleutherAI lm-evaluation-harness, task ``gsm8k`` (``lm_eval/tasks/gsm8k/gsm8k.yaml``, version 3.0):

* reference: the dataset's ``answer`` field ends in ``#### <number>``; the metric drops everything up to
  ``"#### "`` and every ``,`` and ``$`` (``regexes_to_ignore``).
* ``strict-match`` filter: the first match of ``#### (\\-?[0-9\\.\\,]+)``.
* ``flexible-extract`` filter: the last match of ``(-?[$0-9.,]{2,})|(-?[0-9]+)``.
* both then normalised by ``regexes_to_ignore``: remove ``,`` and ``$``, and one trailing ``.``.

:func:`strict_match` and :func:`flexible_extract` reproduce those two filters exactly. :func:`extract_answer`,
the one used for scoring, is a cascade for chat models, which often ignore the ``####`` convention:

1. ``#### N`` (first occurrence; like strict-match but also accepting ``####N`` and ``#### $N``);
2. ``answer is N`` / ``answer: N`` (last occurrence; also ``The final answer is $\\boxed{N}$``, ``**N**``);
   lm-eval's ``gsm8k-cot`` task uses ``The answer is (\\-?[0-9\\.\\,]+).`` as its strict filter;
3. the last number, by the flexible-extract regex, skipping matches without a digit (``"..."``).

:func:`stated_answer` is steps 1–2 only, the analogue of lm-eval's ``strict-match`` for chat models: the answer the
model stated as final. It differs from the cascade on answers that state no final answer, above all those cut by
``max_new_tokens``: there step 3 scores whichever number the unfinished reasoning happened to end on.

:func:`is_correct` compares numerically (``"18.00" == "18"``, ``"1,000" == "1000"``), exactly (fractions, no
float rounding), falling back to string equality when either side is not a number.
"""

from __future__ import annotations

import re
from fractions import Fraction

GSM8K_PROMPT = "Solve the problem step by step, then write the final answer as '#### <number>'."
"""Instruction appended to a GSM8K question for a chat model (zero-shot), so that strict-match applies."""

_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")  # lm-eval strict-match
_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")  # lm-eval flexible-extract
_HASHES = re.compile(r"####\s*\$?\s*(-?[0-9.,]+)")
_ANSWER_IS = re.compile(r"answer(?:\s+is|\s*:)[\s:*$\\]*(?:boxed\{\s*)?(-?[0-9][0-9,]*(?:\.[0-9]+)?)", re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\{\s*\\?\$?\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")


def _normalize(answer: str) -> str:
    """lm-eval's ``regexes_to_ignore`` for GSM8K: drop ``,`` and ``$``, then one trailing ``.``; strip spaces."""
    return re.sub(r"\.$", "", answer.replace(",", "").replace("$", "").strip()).strip()


def reference_answer(answer_field: str) -> str:
    """The gold answer of a GSM8K row: what follows the last ``####``, without commas (``"1,000"`` -> ``"1000"``).

    Raises:
        ValueError: ``answer_field`` has no ``####``.
    """
    if "####" not in answer_field:
        raise ValueError(f"not a GSM8K answer (no '####'): {answer_field[-80:]!r}")
    return _normalize(answer_field.rsplit("####", 1)[1])


def strict_match(text: str) -> str | None:
    """lm-eval's ``strict-match`` filter, normalised; ``None`` when the text has no ``#### N``."""
    m = _STRICT.search(text)
    return _normalize(m.group(1)) if m else None


def flexible_extract(text: str) -> str | None:
    """lm-eval's ``flexible-extract`` filter (the last match, as is), normalised; ``None`` without a match."""
    matches = _FLEXIBLE.findall(text)
    return _normalize(matches[-1][0] or matches[-1][1]) if matches else None


def stated_answer(text: str) -> str | None:
    """The final answer ``text`` states (normalised), ``None`` if it states none: ``#### N`` (first), else the last
    ``answer is N`` / ``answer: N`` / ``\\boxed{N}``. No last-number fallback (see the module docstring)."""
    for m in _HASHES.finditer(text):
        answer = _normalize(m.group(1))
        if any(c.isdigit() for c in answer):
            return answer
    stated = [(m.start(), m.group(1)) for pattern in (_ANSWER_IS, _BOXED) for m in pattern.finditer(text)]
    return _normalize(max(stated)[1]) if stated else None


def extract_answer(text: str) -> str | None:
    """The model's final answer in ``text`` (normalised: no ``$``, ``,`` or trailing ``.``), ``None`` if none.

    Priority: ``#### N``, then ``answer is N`` / ``answer: N`` / ``\\boxed{N}`` (the last one), then the last
    number (see the module docstring).
    """
    stated = stated_answer(text)
    if stated is not None:
        return stated
    for groups in reversed(_FLEXIBLE.findall(text)):
        answer = _normalize(groups[0] or groups[1])
        if any(c.isdigit() for c in answer):
            return answer
    return None


def _number(s: str) -> Fraction | None:
    try:
        return Fraction(_normalize(s))
    except (ValueError, ZeroDivisionError):
        return None


def is_correct(text: str, reference: str, *, stated_only: bool = False) -> bool:
    """Whether the answer extracted from ``text`` equals ``reference`` (as from :func:`reference_answer`).

    ``stated_only`` scores :func:`stated_answer` (no last-number fallback) instead of :func:`extract_answer`.
    Numeric comparison when both parse as numbers, exact string comparison (after normalising) otherwise.
    """
    predicted = stated_answer(text) if stated_only else extract_answer(text)
    if predicted is None:
        return False
    a, b = _number(predicted), _number(reference)
    if a is not None and b is not None:
        return a == b
    return predicted == _normalize(reference)
