"""A draft model with a smaller vocabulary: its LM head and embeddings cut to the most frequent tokens.

A small draft's LM head is a large share of its per-token work (the zoo's 0.5B: 151,936 × 896 of ~494M weights),
yet the tokens it drafts come almost all from a small part of the vocabulary. FR-Spec (Zhao et al. 2025,
arXiv 2502.14856) restricts the draft's LM head to the most frequent tokens; the target still verifies over the
whole vocabulary, so the output does not change, only the drafts (a token outside the kept set is never drafted).

Which tokens: a byte-level BPE vocabulary numbers its tokens in merge order, and a merge is learnt earlier the more
often its pair occurs in the tokenizer's training text, so the first ``keep`` ids are a frequency ranking that needs
no corpus; the control and user-defined tokens (end of turn, tool-call tags), the tokens the file names as special
and any the caller adds (the chat template's own text, which every prompt holds) are kept too.

The pruned GGUF is a valid model of ``len(kept)`` tokens; it records the mapping in its metadata:
``adaspec.vocab.original_size`` (V), ``adaspec.vocab.kept`` (the original id of each new id) and
``adaspec.vocab.stand_in`` (for each original id, the new id fed in its place: itself where kept, otherwise the
kept token that is its longest prefix, so a rare token in the context reaches the draft as its first bytes).
:func:`read_vocab_map` reads it back; the GGUF backends apply it (original ids in, logits over V out).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["VocabMap", "chat_template_ids", "prune_vocab", "read_vocab_map"]

KEY_SIZE = "adaspec.vocab.original_size"
KEY_KEPT = "adaspec.vocab.kept"
KEY_STAND_IN = "adaspec.vocab.stand_in"
_SPECIAL_TYPES = (3, 4)  # llama.cpp token types CONTROL and USER_DEFINED
_VOCAB_TENSORS = ("token_embd.weight", "output.weight")  # rows indexed by token id


@dataclass(frozen=True)
class VocabMap:
    """How a pruned vocabulary maps to the original.

    Attributes:
        original_size: V, the original vocabulary's size.
        kept: int64 ``[V']``, the original id of each pruned id.
        stand_in: int64 ``[V]``, the pruned id fed for each original id.
    """

    original_size: int
    kept: np.ndarray
    stand_in: np.ndarray


def _stand_ins(tokens: list[str], kept: list[int]) -> np.ndarray:
    """For every token, the new id of the longest kept token that is a prefix of it (every single-byte token is
    kept, so one exists for any token made of bytes; a token with none maps to new id 0)."""
    new_id = {tokens[old]: new for new, old in enumerate(kept)}
    longest = max(len(tokens[old]) for old in kept)
    out = np.zeros(len(tokens), dtype=np.int64)
    for old, text in enumerate(tokens):
        for n in range(min(len(text), longest), 0, -1):
            hit = new_id.get(text[:n])
            if hit is not None:
                out[old] = hit
                break
    for new, old in enumerate(kept):  # a kept token stands for itself (even where another spells it the same)
        out[old] = new
    return out


def chat_template_ids(tokenizer) -> set[int]:
    """The token ids of a Hugging Face ``tokenizer``'s chat template around a short system, user and assistant turn
    (the role names, markers and default system text every chat prompt holds): what :func:`prune_vocab` should keep
    as ``extra`` for a chat model. An empty set where the tokenizer has no chat template."""
    if not getattr(tokenizer, "chat_template", None):
        return set()
    system, user, assistant = ({"role": role, "content": "x"} for role in ("system", "user", "assistant"))
    turns = [[user], [system, user, assistant, user]]
    texts = [tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) for msgs in turns]
    return {int(i) for text in texts for i in tokenizer(text, add_special_tokens=False)["input_ids"]}


def prune_vocab(src: str | Path, dst: str | Path, keep: int, extra: Iterable[int] = ()) -> VocabMap:
    """Write ``dst``: the GGUF ``src`` with its vocabulary cut to its first ``keep`` token ids, its control and
    user-defined tokens, the tokens its ``tokenizer.ggml.*_token_id`` keys name, and ``extra`` (e.g. the tokens of
    the chat template's own text, which every prompt holds). Tensors other than the embeddings and the LM head are
    copied byte for byte; those two keep their rows for the kept tokens (any quantisation type: a row is a run of
    whole blocks); the tokenizer's per-token arrays (tokens, types, scores) keep theirs. Written to a temporary file
    and renamed, so a failure leaves no ``dst``.

    Raises:
        ValueError: ``keep`` is not in [256, V); an ``extra`` or named special id is not in [0, V); ``src`` has no
            token list or no token-indexed tensor; no merge of a BPE vocabulary survives the cut.
    """
    import gguf

    reader = gguf.GGUFReader(str(src))
    tokens = reader.get_field("tokenizer.ggml.tokens")
    types = reader.get_field("tokenizer.ggml.token_type")
    if tokens is None or types is None:
        raise ValueError(f"{src}: no tokenizer.ggml.tokens / token_type to prune")
    tokens, types = list(tokens.contents()), list(types.contents())
    size = len(tokens)
    if not 256 <= keep < size:
        raise ValueError(f"keep must be in [256, {size}) for a vocabulary of {size} tokens, got {keep}")
    named = {f.name: int(f.contents()) for f in reader.fields.values()
             if f.name.startswith("tokenizer.ggml.") and f.name.endswith("_token_id")}
    wanted = {int(i) for i in extra} | set(named.values())
    bad = sorted(i for i in wanted if not 0 <= i < size)
    if bad:
        raise ValueError(f"token ids {bad[:5]} out of range for a vocabulary of {size} tokens")
    kept = list(range(keep)) + [i for i in range(keep, size) if types[i] in _SPECIAL_TYPES or i in wanted]
    stand_in = _stand_ins(tokens, kept)
    kept_set = {tokens[i] for i in kept}
    index = np.asarray(kept)

    arch = reader.get_field("general.architecture").contents()
    dst = Path(dst)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.partial")
    writer = gguf.GGUFWriter(str(tmp), arch)
    try:  # into tmp, renamed to dst when complete
        # the map first: read_vocab_map reads the file's first keys only, not its 150k-entry token arrays
        writer.add_key_value(KEY_SIZE, size, gguf.GGUFValueType.UINT32)
        writer.add_key_value(KEY_KEPT, kept, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
        writer.add_key_value(KEY_STAND_IN, stand_in.tolist(), gguf.GGUFValueType.ARRAY,
                             sub_type=gguf.GGUFValueType.INT32)
        for field in reader.fields.values():
            name = field.name
            if name.startswith("GGUF.") or name == "general.architecture":
                continue
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            value = field.contents()
            if name == "tokenizer.ggml.merges":  # only merges whose parts and result are all kept
                value = [m for m in value if (p := m.split(" ", 1)) and len(p) == 2 and p[0] in kept_set
                         and p[1] in kept_set and p[0] + p[1] in kept_set]
                if not value:
                    raise ValueError(f"no merge of {src}'s vocabulary survives a cut to {keep} ids: keep more")
            elif name.startswith("tokenizer.ggml.") and sub is not None and len(value) == size:  # one entry per token
                value = [value[i] for i in kept]
            elif name == f"{arch}.vocab_size":  # some converters record it; the loader checks it against the tokens
                value = len(kept)
            elif name in named:
                value = int(stand_in[named[name]])  # itself: named tokens are kept
            elif name == "general.alignment":
                writer.data_alignment = int(value)  # the writer pads to it, as the file says
            writer.add_key_value(name, value, vtype, sub_type=sub)
        data = {}
        for t in reader.tensors:
            arr = t.data
            if t.name in _VOCAB_TENSORS:
                if arr.shape[0] != size:
                    raise ValueError(f"{src}: {t.name} has {arr.shape[0]} rows, not one per token ({size})")
                arr = np.ascontiguousarray(arr[index])
            data[t.name] = arr
            writer.add_tensor_info(t.name, arr.shape, arr.dtype, arr.nbytes, t.tensor_type)
        if not any(name in data for name in _VOCAB_TENSORS):
            raise ValueError(f"{src}: no token_embd.weight or output.weight to prune")
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in reader.tensors:
            writer.write_tensor_data(data[t.name])
        writer.close()
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    return VocabMap(size, index.astype(np.int64), stand_in)


def _leading_keys(path: str | Path, want: int = 4) -> dict:
    """The first ``want`` metadata keys of a GGUF file whose values are strings, uint32 or int32 arrays, read with
    ``struct`` (GGUF v2/v3, little-endian): stops at the first key of another type. :func:`prune_vocab` writes the
    map there, so reading it costs milliseconds instead of parsing the whole vocabulary."""
    import struct

    out: dict = {}
    with open(path, "rb") as f:
        magic, version, _, n_kv = struct.unpack("<4sIQQ", f.read(24))
        if magic != b"GGUF" or version < 2:
            return out
        for _ in range(min(n_kv, want)):
            key = f.read(struct.unpack("<Q", f.read(8))[0]).decode()
            vtype = struct.unpack("<I", f.read(4))[0]
            if vtype == 8:  # string
                out[key] = f.read(struct.unpack("<Q", f.read(8))[0]).decode(errors="replace")
            elif vtype == 4:  # uint32
                out[key] = struct.unpack("<I", f.read(4))[0]
            elif vtype == 9:  # array: of int32 only
                sub, n = struct.unpack("<IQ", f.read(12))
                if sub != 5:
                    break
                out[key] = np.frombuffer(f.read(4 * n), dtype="<i4").astype(np.int64)
            else:
                break
    return out


def read_vocab_map(path: str | Path) -> VocabMap | None:
    """The mapping a pruned GGUF records (:func:`prune_vocab`), or None for any other GGUF.

    Raises:
        ValueError: the mapping is missing from the file's first keys, where :func:`prune_vocab` writes it, or
            inconsistent (sizes or ids out of range).
    """
    head = _leading_keys(path)
    if KEY_SIZE not in head:
        import gguf

        if gguf.GGUFReader(str(path)).get_field(KEY_SIZE) is None:
            return None
        raise ValueError(f"{path}: its vocabulary map is not among its first keys (not written by prune_vocab?)")
    size, kept, stand_in = int(head[KEY_SIZE]), head.get(KEY_KEPT), head.get(KEY_STAND_IN)
    if (kept is None or stand_in is None or len(stand_in) != size or not len(kept) or kept.min() < 0
            or kept.max() >= size or stand_in.min() < 0 or stand_in.max() >= len(kept)):
        raise ValueError(f"{path}: its vocabulary map ({KEY_KEPT}, {KEY_STAND_IN}) does not describe a vocabulary "
                         f"of {size} tokens")
    return VocabMap(size, kept, stand_in)
