"""Which methods ``adaspec compare`` runs: method strings, presets, and their parser.

Method syntax: ``plain`` | ``fixed:K`` | ``CONTROLLER[:K]`` (any of :data:`adaspec.controllers.CONTROLLERS`, with
the default drafter), or ``DRAFTER/CONTROLLER[:K]`` with any drafter spec of :func:`adaspec.api.make_drafter`, e.g.
``ngram/fixed:4``; ``hybrid/...`` is n-gram lookup plus the default draft model, chosen per step, and
``hybrid-suffix/...`` suffix decoding, n-gram lookup and the default draft model. Modifiers follow with ``+``:
``+strict`` (strict mode: a batch-invariant target, see :class:`~adaspec.request.GenerationConfig`), one lossy
acceptance rule of :data:`adaspec.verify.LOSSY_RULES` (``+typical[:ε]``, ``+topk[:k]``, ``+bild[:nats]``) and
``+tree:N[:always][:expand=E]`` (token trees of up to N draft nodes, :mod:`adaspec.tree`; chain or tree chosen per
step from measured goodput, or a tree every step with ``:always``; a draft model's tree expands E nodes per level).
These are parsed by :func:`adaspec.spec_setting.parse_method`. A strict method's identity is counted against
``plain+strict``.

Peers, parsed here: ``hf:KIND[:K]`` runs a Hugging Face transformers peer on the same models; ``llama-server:...``,
``llamacpp:pld[:N]``, ``openvino:...``, ``vllm@URL`` run other engines, each in its own process
(:mod:`adaspec.peers`). Peers take no modifiers.
"""

from __future__ import annotations

from adaspec import spec_setting
from adaspec.defaults import DEFAULT_CONTROLLER, DEFAULT_DRAFTER
from adaspec.errors import ConfigError
from adaspec.peers import is_combined_peer, parse_peer
from adaspec.spec_setting import SpecSetting, parse_modifiers, split_method

DEFAULT_METHOD = f"{DEFAULT_DRAFTER}/{DEFAULT_CONTROLLER}"
"""What ``adaspec generate`` does by default (the method the target check is about)."""
STRUCTURED = "structured"  # the structured-output workload (adaspec.structured_workload): rows carry valid, exact

FIXED_KS = (1, 2, 3, 4, 6, 8)
CONTROLLER_METHODS = tuple(dict.fromkeys((  # the default first; hybrid/goodput is the default of before 2026-12-05
    "goodput", DEFAULT_METHOD, "hybrid/goodput", "adaptive", "heuristic", "confidence", "entropy", "bandit",
    "hybrid/bandit", "hybrid/fixed:4")))
PEER_METHODS = ("hf:constant:4", "hf:heuristic", "hf:dynamic", "hf:pld")
SPECBENCH = "specbench"
WARMUP_PROMPT_TOKENS, WARMUP_TOKENS = 48, 24  # each adaspec method's untimed warm-up generation

PRESETS = {
    # About 15-20 minutes on 2 CPU cores (AVX2, bf16) with the default pair: three workloads (code, maths, and a
    # Spec-Bench category where speculation loses), one prompt each, greedy and sampling, 32 tokens; the fixed K that
    # can be the oracle there, the default and the goodput controller alone, and two transformers peers.
    "quick": dict(workloads=["humaneval", "gsm8k", "specbench:translation"], limit=1, max_new_tokens=32,
                  temperatures=[0.0, 1.0],
                  methods=["plain", "fixed:1", "fixed:2", "fixed:3", "goodput", DEFAULT_METHOD, "hf:dynamic",
                           "hf:pld"]),
    # Many hours here: every method of the issue, 10 prompts per category, 128 tokens, greedy and sampling.
    "full": dict(workloads=["humaneval", "gsm8k", SPECBENCH], limit=10, max_new_tokens=128, temperatures=[0.0, 1.0],
                 methods=["plain", *(f"fixed:{k}" for k in FIXED_KS), *CONTROLLER_METHODS, *PEER_METHODS]),
}


Method = SpecSetting  # a compare method is a labelled speculation setting (peers: controller = their library)


def parse_method(text: str, default_draft: str) -> SpecSetting:
    """Parse a method string (see module docstring). Raises ConfigError on a malformed one.

    A transformers peer is ``SpecSetting(draft model spec or None for prompt lookup, "hf", K, label=text)``; every
    other method is :func:`adaspec.spec_setting.parse_method`'s.
    """
    if is_combined_peer(text):  # llama-server:draft+ngram, vllm@http://...: no modifiers, no drafter prefix
        return _peer_method(text, parse_peer(text), default_draft)
    head, mods = split_method(text)
    parse_modifiers(text, mods)  # a malformed modifier is named before anything else
    if head != "plain":
        peer = parse_peer(head)
        if peer is not None:
            if mods:
                raise ConfigError(f"bad method {text!r}: modifiers apply to adaspec's methods, not to peers")
            return _peer_method(text, peer, default_draft)
    return spec_setting.parse_method(text, default_draft)


def _peer_method(text: str, peer, default_draft: str) -> SpecSetting:
    return SpecSetting(default_draft if peer.needs_draft_model else None, peer.library, peer.k, label=text)
