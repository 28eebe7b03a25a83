"""Per-request limits of ``adaspec serve`` that protect the other clients (issue 41).

* :func:`lone_surrogate` finds a string with a lone UTF-16 surrogate (``"\\ud800"``, valid JSON but not Unicode
  text: tokenizers and UTF-8 encoders raise on it) anywhere in a request, so it is refused with a 400 naming the
  field instead of failing deep in encoding with a 500.
* :class:`ScoringBudget`: ``echo`` + ``logprobs`` scores every prompt position. The scored prompt tokens of one
  request are capped (``--max-scored-tokens``), they are scored once for all ``n`` choices, and the logits of one
  forward that keeps scored positions are capped in bytes (``--max-scored-logits-mb``): the prefill advances by
  chunks of at most :meth:`ScoringBudget.rows` positions and each chunk's log-softmax is computed and reduced to
  the asked top-k before the next (:func:`adaspec.scoring.scored_logprobs`).
* :func:`default_slots_per_request`: the running slots one request's ``n`` choices may hold at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adaspec.server.protocol import APIError

DEFAULT_MAX_SCORED_TOKENS = 4096
DEFAULT_MAX_SCORED_LOGITS_MB = 256


def lone_surrogate(value: Any, path: str = "") -> str | None:
    """The dotted path (``messages.0.content``) of the first string in ``value`` (nested dicts, lists, tuples,
    keys included) that holds a lone UTF-16 surrogate; None when there is none."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "body"
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            where = f"{path}.{k}" if path else str(k)
            bad = lone_surrogate(k, where) or lone_surrogate(v, where)
            if bad:
                return bad
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            bad = lone_surrogate(v, f"{path}.{i}" if path else str(i))
            if bad:
                return bad
    return None


def refuse_lone_surrogates(body: Any) -> None:
    """Raises APIError 400 naming the field when the request ``body`` (a pydantic model) holds a lone surrogate."""
    bad = lone_surrogate(body.model_dump(exclude_none=True))
    if bad:
        raise APIError(400, f"{bad}: the text holds a lone UTF-16 surrogate (such as \\ud800), which is not valid "
                            "Unicode; send well-formed text", param=bad.split(".", 1)[0])


@dataclass(frozen=True)
class ScoringBudget:
    """Limits on scored prompt logits (``echo`` + ``logprobs``).

    Attributes:
        max_tokens: prompt tokens one request may have scored (its ``n`` choices share one scoring).
        max_logits_bytes: bytes of float32 logits kept at once for scored positions in one forward (bounds a
            scored prefill chunk to ``max_logits_bytes // (4 * vocab)`` positions, at least 1).
    """

    max_tokens: int = DEFAULT_MAX_SCORED_TOKENS
    max_logits_bytes: int = DEFAULT_MAX_SCORED_LOGITS_MB << 20

    def rows(self, vocab: int) -> int:
        """Scored positions per forward for a vocabulary of ``vocab`` (float32 logits)."""
        return max(1, self.max_logits_bytes // (4 * max(1, vocab)))

    def check(self, prompt_tokens: int) -> None:
        """Raises APIError 413 (``param='echo'``) when ``prompt_tokens`` exceed :attr:`max_tokens`."""
        if prompt_tokens > self.max_tokens:
            raise APIError(413, f"echo with logprobs scores at most {self.max_tokens} prompt tokens per request "
                                f"(this server's --max-scored-tokens); this prompt has {prompt_tokens}",
                           param="echo", code="scored_prompt_too_long")


def default_slots_per_request(slots: int) -> int:
    """Half the running slots (at least 1): one request's ``n`` choices never take every slot."""
    return max(1, slots // 2)
