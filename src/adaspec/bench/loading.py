"""What a sweep loads for one hardware setting: the model spec on the setting's backend, the models' context
window, and the loaded target and drafters with their prompt caches."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from adaspec.backends.prefix_cache import PrefixCacheBackend
from adaspec.bench.grid import Point, Setting
from adaspec.bench.measure import rss_bytes
from adaspec.bench.results import record_hash
from adaspec.drafters.suffix import CachePerMethod
from adaspec.errors import ConfigError


@dataclass
class Models:
    """Everything loaded for one (target, dtype, backend); the thread counts of a setting share it."""

    target: object  # LoadedModel
    backend: PrefixCacheBackend
    drafts: dict[str, object] = field(default_factory=dict)  # spec -> Drafter with a wrapped backend
    draft_bytes: dict[str, dict] = field(default_factory=dict)
    pricer: object = None  # BatchPricer calibrated for the setting's batch size (batch > 1)
    own: CachePerMethod = field(default_factory=CachePerMethod)  # each method's suffix caches, across its prompts

    def drafter_for(self, p: Point):
        """The drafter ``p`` runs with: the loaded one, or its method's copy when it holds a suffix drafter (the
        points of one method share a suffix cache across prompts, never with another method)."""
        return self.own.get((p.setting, p.temperature, p.drafter, p.k, p.controller, p.tree, p.tree_choice),
                            self.drafts.get(p.drafter))


def default_loader(spec: str, dtype: str, *, max_context: int | None = None, device: str = "auto",
                   max_sequences: int = 1):
    """Load ``spec`` (``NAME`` on PyTorch in ``dtype``, or ``NAME@llamacpp`` / ``NAME@ik`` with a KV cache of
    ``max_context`` tokens: GGUF runtimes allocate it up front), holding ``max_sequences`` sequences (batch axis)."""
    from adaspec.api import load_model, split_backend
    from adaspec.backends.select import GGUF_RUNTIMES

    if split_backend(spec)[1] in GGUF_RUNTIMES:
        return load_model(spec, max_context=max_context, max_sequences=max_sequences)
    return load_model(spec, dtype=dtype, device=device, max_sequences=max_sequences)


def on_backend(spec: str, setting: Setting) -> str:
    """The model spec to load for ``setting``: ``NAME@llamacpp`` / ``NAME@ik`` for a model on a GGUF-runtime
    setting, else as is.

    Raises:
        ConfigError: ``spec`` names another backend than the setting's (the backend is a bench axis).
    """
    from adaspec.api import split_backend
    from adaspec.spec_setting import builtin_drafter

    if spec == "calibrated" or builtin_drafter(spec):
        return spec
    name, backend = split_backend(spec)
    if backend is not None and backend != setting.backend:
        raise ConfigError(f"{spec}: adaspec bench puts every model of a setting on the setting's backend "
                          f"({setting.backend}); write {name} and list the backends in bench.backend")
    return name if setting.backend == "torch" else f"{name}@{setting.backend}"


def context_needed(cfg: dict) -> int:
    """Tokens of context the largest run of ``cfg`` needs: the micro-measurements' longest context plus its widest
    verify, or a sweep's longest prompt plus its new tokens and draft, with room for the chat template."""
    micro = cfg["micro"]
    need = max(micro["contexts"]) + max(micro["verify_tokens"]) + 1
    for s in cfg["sweep"]:
        need = max(need, max(s["context"]) + int(cfg["bench"]["max_new_tokens"]) + max(s["k"]) + 1)
    return need + 64


def prefill_draft(drafter, prompt: Sequence[int]) -> float:
    """Feed ``prompt`` (all but its last token) to a draft model whose backend is a :class:`PrefixCacheBackend`,
    before a timed run: the drafter's lazy prefill then finds it cached, so the run's decode time holds drafting
    and verification only. Returns the time it took, ms (a cold prefill when the cache was empty)."""
    backend = drafter.backend
    backend.reset()
    start = time.perf_counter()
    if 1 < len(prompt) < backend.max_context:  # beyond the draft's own window it never drafts (ModelDrafter)
        backend.forward(list(prompt[:-1]), 1)
        backend.synchronize()
    return (time.perf_counter() - start) * 1e3


def tokenizer_of(loaded):
    tok = loaded.tokenizer
    return tok if hasattr(tok, "decode") else None


def load_setting(loader, setting: Setting, specs: Iterable[str], log: Callable[[str], None]) -> tuple[Models, dict]:
    """Load ``setting``'s target with ``loader`` (see :class:`adaspec.bench.sweep.SweepRunner`) and the drafters
    ``specs`` (builtin drafters, or draft models on the setting's backend, their tokenizers checked against the
    target's), each model's cache behind a :class:`PrefixCacheBackend`. Returns the models and the ``memory``
    record (bytes of weights, resident memory and KV cache per token of each model)."""
    from adaspec.api import make_drafter
    from adaspec.spec_setting import builtin_drafter
    from adaspec.drafters.model import ModelDrafter

    log(f"loading {setting.target} ({setting.dtype}, {setting.backend}"
        + (f", {setting.batch} sequences)" if setting.batch > 1 else ")"))
    before = rss_bytes()
    target = load_on(loader, on_backend(setting.target, setting), setting)
    wrapped = PrefixCacheBackend(target.backend)
    models = Models(target, wrapped)
    target_rss = rss_bytes() - before
    for spec in sorted(specs):
        before = rss_bytes()
        if builtin_drafter(spec):
            drafter = make_drafter(spec, target, max_sequences=setting.batch)
        else:
            draft = load_on(loader, on_backend(spec, setting), setting)
            from adaspec.models import check_tokenizers_compatible

            if hasattr(target.tokenizer, "get_vocab") and hasattr(draft.tokenizer, "get_vocab"):
                check_tokenizers_compatible(target.tokenizer, draft.tokenizer, target_name=target.name,
                                            draft_name=draft.name)
            drafter = ModelDrafter(draft.backend)
        if isinstance(drafter, ModelDrafter):
            shares = spec.startswith("layerskip:")
            models.draft_bytes[spec] = {
                "param_bytes": 0 if shares else drafter.backend.weight_bytes(),
                "rss_delta_bytes": rss_bytes() - before,
                "kv_bytes_per_token": drafter.backend.kv_bytes_per_token()}
            drafter.backend = PrefixCacheBackend(drafter.backend)
        else:
            models.draft_bytes[spec] = {"param_bytes": 0, "rss_delta_bytes": rss_bytes() - before,
                                        "kv_bytes_per_token": 0}
        models.drafts[spec] = drafter
    memory = {"kind": "memory", "key": f"mem-{record_hash([setting.__dict__, time.time()])}",
              **setting.__dict__, "target_param_bytes": target.backend.weight_bytes(),
              "target_rss_delta_bytes": target_rss,
              "target_kv_bytes_per_token": target.backend.kv_bytes_per_token(),
              "drafts": models.draft_bytes, "rss_bytes": rss_bytes(), "cores": os.cpu_count()}
    return models, memory


def load_on(loader, spec: str, setting: Setting):
    """``loader(spec, dtype)``, holding ``setting.batch`` sequences when it is more than one."""
    if setting.batch == 1:
        return loader(spec, setting.dtype)
    return loader(spec, setting.dtype, max_sequences=setting.batch)
