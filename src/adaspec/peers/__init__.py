"""Peers for ``adaspec compare``: what a user would run instead of adaspec, measured on the same prompts.

One module per engine:

* :mod:`~adaspec.peers.hf` — transformers' assisted generation and prompt lookup (``hf:...``), in this process on
  the very model objects adaspec runs.
* :mod:`~adaspec.peers.llama_server` — llama.cpp's own server (``llama-server:plain|draft[:K]|ngram[:N]|
  draft[:K]+ngram[:N]``), one server process per method.
* :mod:`~adaspec.peers.worker` — Python worker processes speaking JSON lines: llama-cpp-python's prompt lookup
  (``llamacpp:pld[:N]``) and OpenVINO GenAI (``openvino:plain|draft[:K]|lookup[:K]``, in its own environment).
* :mod:`~adaspec.peers.endpoint` — an OpenAI-compatible server the user started (``vllm@URL``, ``openai@URL``).

:mod:`~adaspec.peers.base` holds what the out-of-process peers share (start, ask, stop, failure rows);
:mod:`~adaspec.peers.report` the report's peer sections (failures with log tails, first differences). How to
install them: ``make peers`` and docs/guide/peers.md.
"""

from __future__ import annotations

from adaspec.peers.base import PeerContext, PeerSpec, first_difference
from adaspec.peers.hf import KINDS, Peer, PeerRunner

PROCESS_LIBRARIES = ("llama-server", "llamacpp", "openvino", "vllm", "openai")
PEER_LIBRARIES = ("hf", *PROCESS_LIBRARIES)
ENDPOINT_PREFIXES = ("vllm@", "openai@")

__all__ = ["KINDS", "PEER_LIBRARIES", "PROCESS_LIBRARIES", "Peer", "PeerContext", "PeerRunner", "PeerSpec",
           "first_difference", "is_combined_peer", "make_peer", "parse_peer"]


def is_combined_peer(text: str) -> bool:
    """Whether ``text`` is a peer whose syntax uses ``+`` or ``/`` (llama-server combinations, endpoint URLs), so
    compare must parse it before reading ``+modifiers``."""
    return text.startswith(("llama-server:", *ENDPOINT_PREFIXES))


def parse_peer(text: str) -> Peer | PeerSpec | None:
    """A peer method → its spec (:class:`~adaspec.peers.hf.Peer` for transformers, :class:`PeerSpec` for the
    others); None for a method that is not a peer. Raises ConfigError on a malformed one."""
    if text.startswith(ENDPOINT_PREFIXES):
        from adaspec.peers.endpoint import parse

        return parse(text)
    library, sep, _ = text.partition(":")
    if not sep:
        return None
    if library == "hf":
        from adaspec.peers.hf import parse_peer as parse_hf

        return parse_hf(text)
    if library == "llama-server":
        from adaspec.peers.llama_server import parse

        return parse(text)
    if library == "llamacpp":
        from adaspec.peers.worker import parse_llamacpp

        return parse_llamacpp(text)
    if library == "openvino":
        from adaspec.peers.worker import parse_openvino

        return parse_openvino(text)
    return None


def make_peer(spec: PeerSpec, ctx: PeerContext):
    """The runner of an out-of-process peer: ``generate(ids, max_new_tokens=, temperature=, seed=) -> row``,
    ``warmup()``, ``stop()``."""
    if spec.library == "llama-server":
        from adaspec.peers.llama_server import LlamaServerPeer

        return LlamaServerPeer(spec, ctx)
    if spec.library == "llamacpp":
        from adaspec.peers.worker import LlamaCppPldPeer

        return LlamaCppPldPeer(spec, ctx)
    if spec.library == "openvino":
        from adaspec.peers.worker import OpenVinoPeer

        return OpenVinoPeer(spec, ctx)
    from adaspec.peers.endpoint import EndpointPeer

    return EndpointPeer(spec, ctx)
