"""Hugging Face transformers' own speculative decoding on the same models, in adaspec's process (a compare peer).

Methods (``hf:`` prefix in ``--methods``):

* ``hf:constant[:K]`` — assisted generation (``generate(assistant_model=...)``) with
  ``num_assistant_tokens_schedule="constant"``, ``num_assistant_tokens=K`` (default 4) and the confidence stop off
  (``assistant_confidence_threshold=0``): K drafts every step.
* ``hf:heuristic[:K]`` — ``num_assistant_tokens_schedule="heuristic"`` starting at K (default 20, transformers'
  default): +2 after a fully accepted draft, −1 otherwise, carried across calls; confidence stop off.
* ``hf:dynamic[:K]`` — transformers' defaults: constant K = 20 cut by the assistant's confidence stop
  (``assistant_confidence_threshold`` 0.4), which transformers re-tunes after every step from the ROC of draft
  probabilities against matches (needs scikit-learn; without it the threshold stays at 0.4 and the row says so).
* ``hf:pld[:N]`` — prompt lookup decoding (``prompt_lookup_num_tokens=N``, default 10; n-grams up to
  ``max_matching_ngram_size`` 2).

The parameter names are those of transformers 5.x (``generation/configuration_utils.py``,
``generation/candidate_generator.py``): the assistant's schedule, K and confidence threshold are read from the
*assistant's* ``generation_config``, so each peer keeps its own copy of it (the heuristic schedule writes its K
back there after each call, which is how transformers carries it across calls).

The whole ``generate`` call is timed (compare subtracts the target's prompt prefill, measured on the same prompt,
to time decoding as for adaspec's methods). α and τ are not exposed by transformers, so they are None in the rows.

transformers 5.24's assisted generation and prompt lookup return wrong tokens when ``generate`` starts from a
pre-filled cache (``past_key_values``/``cache`` holding the prompt prefix: the output drifts from greedy decoding
after a few steps, while plain ``generate`` from the same cache is right; see tests/bench/test_compare_peers.py), so
peers always prefill the prompt themselves (compare leaves prefills out of its decoding times).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

from adaspec.errors import ConfigError

KINDS = {"constant": 4, "heuristic": 20, "dynamic": 20, "pld": 10}


@dataclass(frozen=True)
class Peer:
    """A transformers peer: ``kind`` in :data:`KINDS` and its K (draft tokens, or lookup tokens for pld)."""

    label: str
    kind: str
    k: int
    library: str = "hf"

    @property
    def needs_draft_model(self) -> bool:
        return self.kind != "pld"


def parse_peer(text: str) -> Peer | None:
    """``hf:KIND[:K]`` → Peer; None for a method that is not one. Raises ConfigError on a malformed one."""
    library, sep, rest = text.partition(":")
    kinds = KINDS if library == "hf" else None
    if not sep or kinds is None:
        return None
    kind, _, k = rest.partition(":")
    if kind not in kinds:
        raise ConfigError(f"bad method {text!r}: {library} peers are {', '.join(f'{library}:{k}' for k in kinds)}")
    try:
        k_value = int(k) if k else KINDS[kind]
    except ValueError:
        raise ConfigError(f"bad method {text!r}: K must be an integer") from None
    if k_value < 1:
        raise ConfigError(f"bad method {text!r}: K must be >= 1")
    return Peer(text, kind, k_value, library)


def sklearn_available() -> bool:
    try:
        import sklearn  # noqa: F401
    except ImportError:
        return False
    return True


class PeerRunner:
    """Runs one peer's ``generate`` on a target model (and the draft model for assisted generation).

    Args:
        peer: the peer.
        target_model, draft_model: transformers causal LMs (the same objects adaspec's backends hold, so the same
            weights, dtype and threads).
        eos_token_ids: ids that end generation (adaspec's engine defaults, for identical stopping).
        pad_token_id: id transformers pads with (batch size 1 never pads; it silences a warning).
    """

    def __init__(self, peer: Peer, target_model, draft_model=None, *, eos_token_ids=(), pad_token_id=None) -> None:
        if peer.needs_draft_model and draft_model is None:
            raise ConfigError(f"{peer.label} needs a draft model")
        self.peer = peer
        self.target = target_model
        self.draft = draft_model
        self.eos = list(eos_token_ids)
        self.pad = pad_token_id if pad_token_id is not None else (self.eos[0] if self.eos else None)
        self.note = ""
        self.assistant_config = None
        if peer.needs_draft_model:
            cfg = copy.deepcopy(draft_model.generation_config)
            cfg.num_assistant_tokens = peer.k
            cfg.num_assistant_tokens_schedule = "heuristic" if peer.kind == "heuristic" else "constant"
            cfg.assistant_confidence_threshold = 0.4 if peer.kind == "dynamic" else 0.0
            self.assistant_config = cfg
            if peer.kind == "dynamic" and not sklearn_available():
                self.note = "scikit-learn missing: confidence threshold fixed at 0.4, not tuned"

    def generate(self, prompt_ids: list[int], *, max_new_tokens: int, temperature: float = 0.0,
                 seed: int = 0) -> dict:
        """One generation; returns the result fields of a compare row."""
        import torch

        ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.target.device)
        kwargs = dict(max_new_tokens=max_new_tokens, eos_token_id=self.eos or None, pad_token_id=self.pad,
                      attention_mask=torch.ones_like(ids))
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        if self.peer.kind == "pld":
            kwargs["prompt_lookup_num_tokens"] = self.peer.k
        else:
            kwargs["assistant_model"] = self.draft
        saved = self.draft.generation_config if self.draft is not None else None
        torch.manual_seed(seed)
        try:
            if self.assistant_config is not None:
                self.draft.generation_config = self.assistant_config
            start = time.perf_counter()
            with torch.inference_mode():
                out = self.target.generate(ids, **kwargs)
            end = time.perf_counter()
        finally:
            if saved is not None:
                self.draft.generation_config = saved
        new = out[0, ids.shape[1]:].tolist()
        finish = "stop" if new and new[-1] in self.eos else "length"
        total_ms = (end - start) * 1e3
        return {"finish_reason": finish, "token_ids": new, "prompt_tokens": len(prompt_ids),
                "new_tokens": len(new), "total_ms": round(total_ms, 2), "decode_ms": None, "decode_tokens": None,
                "tokens_per_s": round(len(new) / (total_ms / 1e3), 3) if total_ms > 0 else 0.0,
                "steps": None, "speculation_steps": None, "draft_tokens": None, "accepted_tokens": None,
                "acceptance_rate": None, "mean_accepted_tokens": None, "prefill_ms": None, "draft_ms": None,
                "verify_ms": None, "other_ms": None, "peer": True, "peer_note": self.note,
                "peer_k_after": getattr(self.assistant_config, "num_assistant_tokens", None)}

    def warmup(self) -> None:
        self.generate([1, 2, 3, 4, 5, 6, 7, 8], max_new_tokens=3)
