"""The Python API: load a target (+ drafter) by name and generate from text.

    >>> import adaspec
    >>> lm = adaspec.load("qwen2.5-coder-1.5b-instruct", draft="qwen2.5-coder-0.5b-instruct")
    >>> out = lm.generate("Write a Python function that reverses a string.", max_new_tokens=64)
    >>> out.text, out.stats.acceptance_rate, out.stats.tokens_per_s

Model specs accepted for ``target`` and ``draft``: a zoo name (``adaspec models list``), a local ``.gguf`` file, a
local Hugging Face folder, or a Hugging Face hub id. ``draft`` also accepts ``"ngram"`` (prompt lookup),
``"ngram-tree"`` (prompt lookup whose matches branch into a token tree, with ``tree_budget``), ``"suffix"``
(SuffixDecoding over the request and earlier responses, :mod:`adaspec.drafters.suffix`; ``suffix:KEY=VALUE,...``
sets its options; the drafter, and so its cache, outlives requests), ``"layerskip:N"`` (the target's first N layers, sharing its weights), ``"A+B"`` (several drafters, one chosen per
step: :class:`~adaspec.drafters.multi.MultiDrafter`), ``"hybrid"`` (= ``ngram+`` the default draft model),
``"hybrid-suffix"`` (= ``suffix+ngram+`` the default draft model) and
``"none"`` (plain decoding).

Backends (:mod:`adaspec.backends.select`): ``load(..., backend="auto")`` runs each model on the fastest path this
machine has, measured: PyTorch on CUDA; on a CPU the fastest installed GGUF runtime for zoo names and ``.gguf``
files (ik_llama.cpp or llama.cpp, running the GGUF file itself, quantised), PyTorch for Hugging Face folders and hub
ids. ``backend="torch" | "llamacpp" | "ik"`` names one; a model spec may pin its own with a suffix: ``@torch`` (the
GGUF converted once to a bf16/fp32 HF folder), ``@llamacpp`` (llama-cpp-python) or ``@ik`` (ik-llama-cpp-python).
Target and draft may use different backends, e.g. target ``qwen2.5-coder-1.5b-instruct@torch`` with draft
``qwen2.5-coder-1.5b-instruct@ik`` (quantised self-drafting), as long as their tokenizers agree.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import torch

from adaspec.backends.base import Backend
from adaspec.backends.cpu import cpu_simd
from adaspec.backends.select import (BACKENDS, GGUF_RUNTIMES, RUNTIME_LABELS, choose_backend, make_gguf_backend,
                                     normalize_backend, require_runtime, resolve_device)
from adaspec.backends.torch_backend import TorchBackend, load_causal_lm, resolve_dtype, truncated_layers
from adaspec.controllers import make_controller
from adaspec.controllers.base import Controller
from adaspec.drafters import Drafter, ModelDrafter, NgramDrafter, NgramTreeDrafter
from adaspec.drafters.model import check_catch_up
from adaspec.drafters.multi import MultiDrafter
from adaspec.drafters.suffix import is_suffix_spec, suffix_from_spec
from adaspec.engine import SpeculativeEngine
from adaspec.defaults import DEFAULT_CONTROLLER, DEFAULT_DRAFT_CATCH_UP, DEFAULT_DRAFTER
from adaspec.errors import ConfigError
from adaspec.models import DEFAULT_DRAFT, DEFAULT_TARGET, check_tokenizers_compatible, resolve
from adaspec.models.requantize import runnable_spec
from adaspec.models.synthetic import SyntheticTokenizer, build_synthetic, is_synthetic, parse_synthetic
from adaspec.request import GenerationConfig, GenerationResult, StreamChunk
from adaspec.spec_setting import expand_drafter, layerskip_layers, validate


def set_threads(threads: int | None) -> int:
    """Set PyTorch's intra-op thread count (default: all cores); returns the count in use."""
    n = threads or os.cpu_count() or 1
    if n < 1:
        raise ConfigError(f"threads must be >= 1, got {n}")
    torch.set_num_threads(n)
    return n


def split_backend(spec: str) -> tuple[str, str | None]:
    """``"name@ik"`` -> ``("name", "ik")``; no suffix -> ``(spec, None)`` (the caller's ``backend`` applies).

    Raises:
        ConfigError: an unknown backend after ``@`` (lists the choices).
    """
    name, sep, backend = str(spec).rpartition("@")
    if not sep or not name or not re.fullmatch(r"[A-Za-z_.]+", backend):  # e.g. a path with "@" in a folder name
        return spec, None
    try:
        return name, normalize_backend(backend, allow_auto=False)
    except ConfigError:
        raise ConfigError(f"unknown backend {backend!r} in model spec {spec!r}; use "
                          f"@{' or @'.join(BACKENDS[1:])}") from None


@dataclass
class LoadedModel:
    """A backend plus the tokenizer and the resolved spec it came from (``name`` carries ``@llamacpp`` / ``@ik``
    for GGUF-runtime models, so a model on two backends has two names). ``runtime_reason``: why ``auto`` chose
    this backend (empty when the backend was named)."""

    backend: Backend
    tokenizer: object
    name: str
    runtime_reason: str = ""


def load_model(spec: str, *, backend: str = "torch", dtype: str | None = None, device: str = "auto",
               progress: bool = True, threads: int | None = None, max_context: int | None = None,
               max_sequences: int = 1) -> LoadedModel:
    """Resolve ``spec`` and load it on the backend its ``@backend`` suffix names, else on ``backend``.

    ``backend``: ``torch`` (this function's default), ``llamacpp``, ``ik`` or ``auto`` (the fastest path on this
    machine, measured: see :mod:`adaspec.backends.select`). ``device``: ``auto`` (default: CUDA for PyTorch when
    PyTorch sees a GPU, else the CPU; the CPU for GGUF runtimes), ``cpu``, ``cuda``. PyTorch: a zoo model is fetched and converted on first
    use; ``dtype`` (default ``bfloat16``) and ``device`` apply. GGUF runtimes (llama.cpp, ik_llama.cpp): the file
    runs as it is (its own quantisation; ``dtype`` does not apply) on the CPU with ``threads`` threads (default:
    PyTorch's current thread count, which :func:`set_threads` sets). ``max_context`` (tokens) sets the context
    window (default: the model's own; GGUF runtimes: 8192, as they allocate the KV cache up front, and never beyond
    the training context).

    Raises:
        UnknownModelError, ModelFetchError, CorruptModelError: see :func:`adaspec.models.resolve`.
        ConfigError: unknown backend or device; a runtime's package missing (names the install command);
            ``--device cuda`` without CUDA.
    """
    from transformers import AutoTokenizer

    spec, pinned = split_backend(spec)
    asked_device = (device or "auto").strip().lower()
    device = resolve_device(device)
    threads = threads or torch.get_num_threads()
    reason = ""
    backend = pinned or normalize_backend(backend)
    if is_synthetic(spec):
        return _load_synthetic(spec, backend=backend, dtype=dtype, device=device, max_context=max_context,
                               max_sequences=max_sequences)
    spec, note = runnable_spec(spec, backend)  # a requantised variant falls back to its base where it cannot run
    if backend == "auto":
        choice = choose_backend(spec, device=device, dtype=dtype, threads=threads, progress=progress)
        backend, reason = choice.backend, choice.reason
        if not note:  # auto may have chosen PyTorch, where a variant cannot run
            spec, note = runnable_spec(spec, backend)
    if note:
        reason = f"{reason}; {note}" if reason else note
    if backend in GGUF_RUNTIMES and asked_device == "auto":
        device = "cpu"  # "auto" means the best device for each model: the GGUF runtimes here run on the CPU
    if backend in GGUF_RUNTIMES:
        from adaspec.models import resolve_gguf

        require_runtime(backend)  # fail before fetching anything when the package is not installed
        if device != "cpu":
            raise ConfigError(f"{spec}@{backend}: the {RUNTIME_LABELS[backend]} backend runs on the CPU here "
                              f"(device={device!r}); use --device cpu, or --backend torch for {device}")
        name, gguf_file, tok_dir = resolve_gguf(spec, progress=progress)
        label = f"{name}@{backend}"
        tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
        gguf_backend = make_gguf_backend(backend, gguf_file, name=label, threads=threads, max_context=max_context,
                                         max_sequences=max_sequences)
        if backend == "ik" and gguf_backend.simd == "AVX2" and cpu_simd() == "AVX-512":
            hint = ("ik_llama.cpp's prebuilt wheel runs AVX2 kernels on this AVX-512 CPU; `make ik-native` rebuilds "
                    "it for this CPU (faster verification: docs/findings/ik-native.md)")
            reason = f"{reason}; {hint}" if reason else hint
        return LoadedModel(gguf_backend, tokenizer, label, reason)
    resolved = resolve(spec, progress=progress)
    model = load_causal_lm(resolved.path, dtype=dtype or "bfloat16", device=device)
    tokenizer = AutoTokenizer.from_pretrained(resolved.path)
    return LoadedModel(TorchBackend(model, resolved.name, max_context=max_context, max_sequences=max_sequences),
                       tokenizer, resolved.name, reason)


def _load_synthetic(spec: str, *, backend: str, dtype: str | None, device: str, max_context: int | None,
                    max_sequences: int) -> LoadedModel:
    """A ``synthetic:`` model (random weights, see :mod:`adaspec.models.synthetic`) on PyTorch."""
    if backend not in ("torch", "auto"):
        raise ConfigError(f"{spec}: synthetic models are built in PyTorch; they cannot run on "
                          f"{RUNTIME_LABELS.get(backend, backend)} (use --backend torch or auto)")
    name = parse_synthetic(spec).name
    model = build_synthetic(name, dtype=resolve_dtype(dtype or "bfloat16"), device=device)
    return LoadedModel(TorchBackend(model, name, max_context=max_context, max_sequences=max_sequences),
                       SyntheticTokenizer(extra_ids=0), name, "synthetic models are built in PyTorch")


def make_drafter(spec: str | None, target: LoadedModel, *, dtype: str | None = None, device: str = "auto",
                 progress: bool = True, reuse: dict[str, Drafter] | None = None,
                 backend: str = "torch", max_sequences: int = 1,
                 catch_up: int | None = DEFAULT_DRAFT_CATCH_UP) -> Drafter | None:
    """Build the drafter named by ``spec`` for ``target`` (see the module docstring for the forms).

    ``reuse`` maps specs to drafters already built; the parts of an ``A+B`` spec found there are shared. A draft
    model loads on ``backend`` unless its spec ends in ``@backend`` (see :func:`load_model`), with caches for
    ``max_sequences`` sequences (batched rows draft on their own: :meth:`Drafter.for_sequence`). A draft model
    feeds at most ``catch_up`` tokens at once (:class:`~adaspec.drafters.model.ModelDrafter`; None: no bound).

    Raises:
        TokenizerMismatchError: a draft model whose tokenizer disagrees with the target's.
        ConfigError: a malformed ``layerskip:N``, or ``layerskip`` for a target that is not on PyTorch;
            ``catch_up`` < 2.
    """
    check_catch_up(catch_up)
    if spec is None or spec.lower() == "none":
        return None
    spec = expand_drafter(spec, DEFAULT_DRAFT)
    if "+" in spec:  # several drafters, one chosen per step (n-gram lookup of >= 2 tokens when it matches)
        parts = {}
        for part in spec.split("+"):
            d = (NgramDrafter(max_ngram=4, min_ngram=2) if part.lower() == "ngram" else (reuse or {}).get(part)
                 or make_drafter(part, target, dtype=dtype, device=device, progress=progress, backend=backend,
                                 max_sequences=max_sequences, catch_up=catch_up))
            if d is None:
                raise ConfigError(f"drafter {spec!r}: {part!r} is not a drafter")
            parts[d.name] = d
        return MultiDrafter(parts)
    if spec.lower() == "ngram":
        return NgramDrafter()
    if is_suffix_spec(spec):  # suffix decoding: this request's text and a cache of earlier responses
        return suffix_from_spec(spec, tokenizer=getattr(target, "tokenizer", None))
    if spec.lower() == "ngram-tree":  # prompt lookup whose several matches become a token tree (tree_budget > 0)
        return NgramTreeDrafter()
    n = layerskip_layers(spec)
    if n is not None:
        if not isinstance(target.backend, TorchBackend):
            raise ConfigError(f"layerskip drafting needs a PyTorch target; {target.name} runs on another backend "
                              "(use --backend torch, or a target spec ending in @torch)")
        backend = TorchBackend(truncated_layers(target.backend.model, n), f"{target.name}[:{n} layers]",
                               max_sequences=max_sequences)
        return ModelDrafter(backend, catch_up=catch_up)
    draft = load_model(spec, backend=backend, dtype=dtype, device=device, progress=progress,
                       max_sequences=max_sequences)
    check_tokenizers_compatible(target.tokenizer, draft.tokenizer, target_name=target.name, draft_name=draft.name)
    return ModelDrafter(draft.backend, catch_up=catch_up)


class SpeculativeLM:
    """Text in, text out: a tokenizer (with its chat template) in front of a :class:`SpeculativeEngine`."""

    def __init__(self, target: LoadedModel, drafter: Drafter | None, controller: Controller) -> None:
        self.target = target
        self.tokenizer = target.tokenizer
        self.engine = SpeculativeEngine(target.backend, drafter, controller, tokenizer=target.tokenizer)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def encode(self, prompt: str | Sequence[dict], chat: bool | None = None, tools: list[dict] | None = None
               ) -> list[int]:
        """Token ids for a prompt string, or for OpenAI-style ``messages``; ``chat=None`` applies the chat template
        when the model has one, with ``tools`` (OpenAI tool definitions) rendered by it when given."""
        chat = self.has_chat_template if chat is None else chat
        if not isinstance(prompt, str):
            chat = True
            messages = list(prompt)
        else:
            messages = [{"role": "user", "content": prompt}]
        if chat:
            if not self.has_chat_template:
                raise ConfigError(f"{self.target.name} has no chat template; use chat=False")
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                      **({"tools": tools} if tools else {}))
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return self.tokenizer(prompt)["input_ids"]

    def generate(self, prompt: str | Sequence[dict], *, chat: bool | None = None,
                 config: GenerationConfig | None = None, **kwargs) -> GenerationResult:
        """Generate from a prompt; keyword arguments are :class:`GenerationConfig` fields."""
        return self.engine.generate(self.encode(prompt, chat), _config(config, kwargs))

    def generate_n(self, prompt: str | Sequence[dict], num_return_sequences: int, *, chat: bool | None = None,
                   config: GenerationConfig | None = None, **kwargs) -> list[GenerationResult]:
        """``num_return_sequences`` generations of one prompt (Hugging Face's name; OpenAI's ``n``), one after
        another on this engine; generation i samples with ``seed + i`` when a seed is given (as vLLM does for n).

        Raises:
            ConfigError: ``num_return_sequences`` < 1, or invalid settings.
        """
        if num_return_sequences < 1:
            raise ConfigError(f"num_return_sequences must be >= 1, got {num_return_sequences}")
        cfg = _config(config, kwargs)
        ids = self.encode(prompt, chat)
        return [self.engine.generate(ids, cfg if i == 0 or cfg.seed is None else replace(cfg, seed=cfg.seed + i))
                for i in range(num_return_sequences)]

    def stream(self, prompt: str | Sequence[dict], *, chat: bool | None = None,
               config: GenerationConfig | None = None, **kwargs) -> Iterator[StreamChunk]:
        """Like :meth:`generate`, yielding text as tokens are accepted (the last chunk carries the result)."""
        return self.engine.stream(self.encode(prompt, chat), _config(config, kwargs))

    def plain(self) -> SpeculativeEngine:
        """An engine over the same target without a drafter (K = 0): the baseline."""
        return SpeculativeEngine(self.target.backend, None, None, tokenizer=self.tokenizer)


def _config(config: GenerationConfig | None, kwargs: dict) -> GenerationConfig:
    return replace(config, **kwargs) if config is not None else GenerationConfig(**kwargs)


def load(target: str = DEFAULT_TARGET, draft: str | None = DEFAULT_DRAFTER, *, controller: str = DEFAULT_CONTROLLER,
         k: int | None = None, backend: str = "auto", device: str = "auto", dtype: str | None = None,
         threads: int | None = None, progress: bool = True,
         draft_catch_up: int | None = DEFAULT_DRAFT_CATCH_UP) -> SpeculativeLM:
    """Load a target and a drafter and return a ready :class:`SpeculativeLM`.

    Args:
        target: target model spec. draft: drafter spec (see module docstring), None/"none" for plain decoding.
        controller: one of :data:`adaspec.controllers.CONTROLLERS` (default ``"goodput"``); k: fixed K or initial K.
        backend: ``auto`` (default: the fastest path measured on this machine, see :mod:`adaspec.backends.select`),
            ``torch``, ``llamacpp`` or ``ik``; a ``@backend`` suffix on a model spec wins.
        device: ``auto`` (CUDA when PyTorch sees one, else the CPU), ``cpu`` or ``cuda``.
        dtype: PyTorch dtype, ``"bfloat16"`` or ``"float32"``; giving one makes ``auto`` choose PyTorch (GGUF
            runtimes run the file's own quantisation). Default: bfloat16 on PyTorch.
        threads: PyTorch intra-op threads and GGUF-runtime threads (default: all cores).
        draft_catch_up: the most tokens a draft model feeds at once to catch up (see :func:`make_drafter`).

    Raises:
        ConfigError: unknown controller, backend or device; see also :func:`load_model` and :func:`make_drafter`.
    """
    set_threads(threads)
    setting = validate(draft, controller, k)  # before loading anything heavy
    check_catch_up(draft_catch_up)
    ctrl = make_controller(setting.controller, setting.k)
    tgt = load_model(target, backend=backend, dtype=dtype, device=device, progress=progress)
    drafter = make_drafter(draft, tgt, dtype=dtype, device=device, progress=progress, backend=backend,
                           catch_up=draft_catch_up)
    if drafter is None:
        ctrl = make_controller("fixed", 0)
    return SpeculativeLM(tgt, drafter, ctrl)
