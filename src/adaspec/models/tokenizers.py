"""Checking that a draft model's tokenizer can stand in for the target's."""

from __future__ import annotations

from typing import Any

from ..errors import TokenizerMismatchError

__all__ = ["check_tokenizers_compatible"]

_MISSING = object()


def _vocab(tok: Any) -> dict[str, int]:
    get_vocab = getattr(tok, "get_vocab", None)
    if get_vocab is None:
        raise TypeError(f"{type(tok).__name__} has no get_vocab(); pass a Hugging Face tokenizer")
    return get_vocab()


def check_tokenizers_compatible(
    target_tok: Any, draft_tok: Any, *, target_name: str = "target", draft_name: str = "draft"
) -> None:
    """Raise TokenizerMismatchError unless both tokenizers map every token string to the same id
    (added/special tokens included) and agree on the EOS token id.

    Tokenizers are compared, not the models' logit widths: a model's embedding matrix is often padded
    beyond its tokenizer (Qwen2.5 0.5B and 1.5B both pad to 151,936 rows).
    """
    tv, dv = _vocab(target_tok), _vocab(draft_tok)
    if tv != dv:  # dict equality runs in C: the common, compatible case costs a few milliseconds
        differing = [t for t, i in tv.items() if dv.get(t, _MISSING) != i]
        differing += [t for t in dv.keys() - tv.keys()]
        examples = []
        for token in sorted(differing, key=lambda t: (tv.get(t, dv.get(t, 0)), t))[:3]:
            t_id = tv.get(token, "absent")
            d_id = dv.get(token, "absent")
            examples.append(f"{token!r}: {target_name} id {t_id}, {draft_name} id {d_id}")
        raise TokenizerMismatchError(
            f"the {draft_name} tokenizer cannot be used with the {target_name} tokenizer: "
            f"{len(differing):,} of {max(len(tv), len(dv)):,} tokens map to different ids or exist in only one "
            f"({target_name} has {len(tv):,} tokens, {draft_name} {len(dv):,}); e.g. "
            + "; ".join(examples)
            + ". Pick a draft model from the same family as the target."
        )
    t_eos = getattr(target_tok, "eos_token_id", None)
    d_eos = getattr(draft_tok, "eos_token_id", None)
    if t_eos != d_eos:
        raise TokenizerMismatchError(
            f"the {draft_name} and {target_name} tokenizers share a vocabulary but disagree on the end-of-sequence "
            f"token: {target_name} EOS id {t_eos} ({getattr(target_tok, 'eos_token', None)!r}), {draft_name} EOS id "
            f"{d_eos} ({getattr(draft_tok, 'eos_token', None)!r})"
        )
