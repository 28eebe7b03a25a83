"""The runners of ``adaspec compare``'s peers: transformers on adaspec's own model objects, other engines in their
own processes (:mod:`adaspec.peers`)."""

from __future__ import annotations

from pathlib import Path

from adaspec.engine import SpeculativeEngine
from adaspec.errors import ConfigError
from adaspec.peers import parse_peer
from adaspec.spec_setting import SpecSetting


def peer_runners(methods: list[SpecSetting], tgt, drafters: dict, plain: SpeculativeEngine, *, dtype: str | None,
                  progress: bool, device: str = "auto", draft: str = "", threads: int | None = None,
                  log_dir: Path | None = None) -> dict:
    """A runner per peer: transformers peers (:class:`~adaspec.peers.PeerRunner`) on the very model objects adaspec
    runs (the draft model is shared with a loaded ModelDrafter when there is one), which must be on PyTorch; every
    other peer in its own process (:func:`adaspec.peers.make_peer`), on the target's and draft's GGUF files (or the
    OpenVINO exports of the same zoo models), with its log in ``log_dir``.

    Raises:
        ConfigError: a transformers peer on a target that is not on PyTorch.
    """
    from adaspec.api import load_model, split_backend
    from adaspec.drafters import ModelDrafter, MultiDrafter
    from adaspec.peers import PeerRunner, make_peer

    def draft_model(spec: str):
        for d in drafters.values():
            subs = d.drafters.values() if isinstance(d, MultiDrafter) else [d]
            for sub in subs:
                if (isinstance(sub, ModelDrafter) and spec in (sub.name, sub.backend.name)
                        and hasattr(sub.backend, "model")):
                    return sub.backend.model
        model = getattr(load_model(spec, dtype=dtype, device=device, progress=progress).backend, "model", None)
        if model is None:
            raise ConfigError(f"transformers assisted generation needs a PyTorch draft model, not {spec}")
        return model

    runners = {}
    ctx = None
    for m in methods:
        peer = parse_peer(m.label)
        if peer.library != "hf":
            ctx = ctx or peer_context(tgt, draft, threads, plain, log_dir or Path("peers-logs"), split_backend)
            runners[m.label] = make_peer(peer, ctx)
            continue
        if not hasattr(tgt.backend, "model"):
            raise ConfigError(f"{m.label} runs transformers' generate and needs a PyTorch target, not {tgt.name}")
        runners[m.label] = PeerRunner(peer, tgt.backend.model, draft_model(m.drafter) if m.drafter else None,
                                      eos_token_ids=plain.eos_token_ids, pad_token_id=tgt.tokenizer.pad_token_id)
    return runners


def peer_context(tgt, draft: str, threads: int | None, plain: SpeculativeEngine, log_dir: Path, split_backend):
    """What the out-of-process peers start from: the target's GGUF (the file adaspec runs, when it runs one), the
    draft's GGUF (resolved on first use), zoo names, threads, stop tokens and the tokenizer."""
    import torch

    from adaspec.models import resolve_gguf
    from adaspec.peers import PeerContext

    target_name = split_backend(tgt.name)[0]
    draft_name = split_backend(draft)[0]
    path = getattr(tgt.backend, "path", None)
    return PeerContext(
        target=target_name, draft=draft_name, threads=threads or torch.get_num_threads(), log_dir=log_dir,
        eos_token_ids=tuple(plain.eos_token_ids),
        target_gguf=path if path is not None else (lambda: resolve_gguf(target_name, progress=False)[1]),
        draft_gguf=lambda: resolve_gguf(draft_name, progress=False)[1],
        tokenize=lambda text: tgt.tokenizer.encode(text, add_special_tokens=False),
        detokenize=lambda ids: tgt.tokenizer.decode(ids))
