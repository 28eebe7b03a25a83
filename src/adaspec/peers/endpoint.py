"""An OpenAI-compatible endpoint the user started (vLLM, or any server with ``/v1/completions``) as a compare peer:
``vllm@URL`` or ``openai@URL``, e.g. ``vllm@http://127.0.0.1:8000``.

The comparison does not start or stop it (its launcher, with its own model and speculative configuration, is the
user's). Each request streams ``/v1/completions`` with the prompt as token ids, the comparison's token budget and
temperature (vLLM's ``return_token_ids`` asks for the generated ids; a server that does not send them gets its text
re-tokenised with the comparison's tokenizer, and the row says so). Timing is taken here, from the streamed
chunks: ``decode_ms`` from the first chunk with text to the last, ``decode_tokens`` the completion tokens after the
first (the server's ``usage`` when it sends it). Where the server exposes vLLM's ``vllm:spec_decode_num_draft_tokens``
/ ``..._num_accepted_tokens`` counters on ``/metrics``, their increase over the request gives α.
"""

from __future__ import annotations

import json
import time

import httpx

from adaspec.errors import ConfigError
from adaspec.peers.base import (FAILED, NOT_RUNNING, TIMED_OUT, PeerContext, PeerFailure, PeerSpec, complete_row,
                                failure_row, peer_row)

SPEC_COUNTERS = {"vllm:spec_decode_num_draft_tokens": "draft", "vllm:spec_decode_num_accepted_tokens": "accepted"}


def parse(text: str) -> PeerSpec:
    """``vllm@URL`` / ``openai@URL`` → PeerSpec. Raises ConfigError."""
    library, _, url = text.partition("@")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"bad method {text!r}: give the endpoint's base URL, e.g. {library}@http://127.0.0.1:8000")
    return PeerSpec(text, library, "endpoint", url=url.rstrip("/").removesuffix("/v1"))


class EndpointPeer:
    """Asks a running OpenAI-compatible server (see the module docstring)."""

    def __init__(self, spec: PeerSpec, ctx: PeerContext) -> None:
        self.spec = spec
        self.ctx = ctx
        self.model: str | None = None
        self.weights = ""

    def _model(self) -> str:
        if self.model is None:
            try:
                models = httpx.get(f"{self.spec.url}/v1/models", timeout=10).json()["data"]
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
                raise PeerFailure(NOT_RUNNING, f"no OpenAI server answering at {self.spec.url} ({e}); start it "
                                               "first (see docs/guide/peers.md)") from None
            if not models:
                raise PeerFailure(FAILED, f"{self.spec.url}/v1/models lists no model")
            self.model = models[0]["id"]
            self.weights = f"as served: {self.model}"
        return self.model

    def _counters(self) -> dict[str, float]:
        try:
            from prometheus_client.parser import text_string_to_metric_families

            text = httpx.get(f"{self.spec.url}/metrics", timeout=10).text
            out: dict[str, float] = {}
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    name = sample.name.removesuffix("_total")
                    if name in SPEC_COUNTERS:
                        out[SPEC_COUNTERS[name]] = out.get(SPEC_COUNTERS[name], 0.0) + sample.value
            return out
        except Exception:  # noqa: BLE001 - counters are optional
            return {}

    def generate(self, prompt_ids: list[int], *, max_new_tokens: int, temperature: float = 0.0,
                 seed: int = 0) -> dict:
        try:
            return complete_row(self._generate(list(prompt_ids), max_new_tokens, temperature, seed), self.ctx)
        except PeerFailure as failure:
            return failure_row(failure, "", self.weights)

    def _generate(self, ids: list[int], max_new_tokens: int, temperature: float, seed: int) -> dict:
        body = {"model": self._model(), "prompt": ids, "max_tokens": max_new_tokens, "temperature": temperature,
                "top_p": 1.0, "seed": seed, "stream": True, "stream_options": {"include_usage": True},
                "return_token_ids": True, "skip_special_tokens": False}
        before = self._counters()
        text, tokens, usage, finish = [], [], None, "length"
        start = time.perf_counter()
        first = last = None
        try:
            with httpx.stream("POST", f"{self.spec.url}/v1/completions", json=body,
                              timeout=self.ctx.timeout_s) as r:
                if r.status_code != 200:
                    raise PeerFailure(FAILED, f"HTTP {r.status_code}: {r.read()[:300].decode(errors='replace')}")
                for line in r.iter_lines():
                    if not line.startswith("data:") or line.strip() == "data: [DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices") or []:
                        now = time.perf_counter()
                        if choice.get("text") or choice.get("token_ids"):
                            first = first or now
                            last = now
                        text.append(choice.get("text") or "")
                        tokens.extend(choice.get("token_ids") or [])
                        finish = choice.get("finish_reason") or finish
        except httpx.ConnectError as e:
            raise PeerFailure(NOT_RUNNING, f"no OpenAI server answering at {self.spec.url} ({e}); start it first "
                                           "(see docs/guide/peers.md)") from None
        except httpx.TimeoutException:
            raise PeerFailure(TIMED_OUT, f"no answer within {self.ctx.timeout_s:g} s") from None
        except (httpx.HTTPError, ValueError) as e:
            raise PeerFailure(FAILED, f"{self.spec.url}: {e}") from None
        total_ms = (time.perf_counter() - start) * 1e3
        after = self._counters()
        drafted = accepted = None
        if "draft" in after and "draft" in before:
            drafted = int(after["draft"] - before["draft"])
            accepted = int(after.get("accepted", 0) - before.get("accepted", 0))
        n = (usage or {}).get("completion_tokens") or len(tokens)
        return peer_row(token_ids=tokens or None, text="".join(text), finish_reason=finish,
                        prompt_tokens=len(ids), total_ms=total_ms,
                        decode_ms=(last - first) * 1e3 if first is not None else None,
                        decode_tokens=max(n - 1, 0) if n else None,
                        timing_source="client side: first streamed chunk to last",
                        weights=self.weights, draft_tokens=drafted, accepted_tokens=accepted,
                        )

    def warmup(self) -> None:
        self.generate([1, 2, 3, 4, 5, 6, 7, 8], max_new_tokens=3)

    def stop(self) -> None:
        """Nothing to stop: the endpoint is the user's."""

    close = stop
