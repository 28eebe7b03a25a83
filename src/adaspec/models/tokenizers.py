"""Checking that a draft model's tokenizer can stand in for the target's."""

from __future__ import annotations

import heapq
from pathlib import Path
from typing import Any

from ..errors import TokenizerMismatchError

__all__ = ["check_tokenizers_compatible"]

def _backend(tok: Any) -> Any:
    return getattr(tok, "backend_tokenizer", None) or getattr(tok, "_tokenizer", None)


def _tokenizer_file(tok: Any) -> Path | None:
    """The ``tokenizer.json`` a tokenizer was loaded from, when it came from a local folder."""
    name = getattr(tok, "name_or_path", None)
    if not name:
        return None
    path = Path(str(name)) / "tokenizer.json"
    try:
        return path if path.is_file() else None
    except OSError:
        return None


def _same_file_bytes(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            ca, cb = fa.read(1 << 22), fb.read(1 << 22)
            if ca != cb:
                return False
            if not ca:
                return True


def _certainly_same_vocab(a: Any, b: Any) -> bool:
    """True when both tokenizers were loaded from byte-identical ``tokenizer.json`` files and have the
    same added tokens and length -- then ``get_vocab()`` is equal without building two 150k-entry
    dicts, which ``tokenizers`` does slowly (~0.3 s each on a small 2-core CPU). False means "not
    known", not "different": the caller then compares the vocabularies exactly.
    """
    fa, fb = _tokenizer_file(a), _tokenizer_file(b)
    ba, bb = _backend(a), _backend(b)
    if fa is None or fb is None or ba is None or bb is None:
        return False
    try:
        if len(a) != len(b):
            return False
        added_a = {i: t.content for i, t in ba.get_added_tokens_decoder().items()}
        added_b = {i: t.content for i, t in bb.get_added_tokens_decoder().items()}
        return added_a == added_b and _same_file_bytes(fa, fb)
    except Exception:  # not a `tokenizers` backend after all, or a file vanished
        return False


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
    beyond its tokenizer (Qwen2.5's hub tokenizer has 151,665 tokens for 151,936 embedding rows; the
    GGUF-derived ones fill ids 151,665-151,935 with ``[PAD<id>]`` tokens).
    """
    if target_tok is draft_tok or _certainly_same_vocab(target_tok, draft_tok):
        tv = dv = None
    else:
        tv, dv = _vocab(target_tok), _vocab(draft_tok)
    if tv != dv:
        differing = {token for token, _ in tv.items() ^ dv.items()}  # set algebra in C, not a Python loop
        total = len(tv.keys() | dv.keys())
        examples = []
        for token in heapq.nsmallest(3, differing, key=lambda t: (tv.get(t, dv.get(t, 0)), t)):
            t_id = tv.get(token, "absent")
            d_id = dv.get(token, "absent")
            examples.append(f"{token!r}: {target_name} id {t_id}, {draft_name} id {d_id}")
        raise TokenizerMismatchError(
            f"the {draft_name} tokenizer cannot be used with the {target_name} tokenizer: "
            f"{len(differing):,} of {total:,} distinct tokens map to different ids or exist in only one "
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
