"""Peers that run a Python worker script in their own process, talking JSON lines over stdin/stdout
(:mod:`adaspec.peers.workers.adaspec_worker_loop`): llama-cpp-python's prompt lookup (``llamacpp:pld[:N]``, in
adaspec's own Python) and OpenVINO GenAI (``openvino:plain|draft[:K]|lookup[:K]``, in the OpenVINO environment's
Python).

OpenVINO is found through ``ADASPEC_OPENVINO_PYTHON`` (a Python with ``openvino-genai``), else
``$ADASPEC_PEERS_DIR/openvino/bin/python`` (``make peers``; ``ADASPEC_PEERS_DIR`` defaults to ``.peers``); its
models, exported to OpenVINO IR, in ``$ADASPEC_OPENVINO_MODELS/<zoo name>`` (default
``$ADASPEC_PEERS_DIR/openvino/models``).
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path

from adaspec.errors import ConfigError
from adaspec.peers.base import (FAILED, NOT_INSTALLED, TIMED_OUT, PeerContext, PeerFailure, PeerSpec, ProcessPeer,
                                gguf_weights, peer_row)

WORKERS = Path(__file__).parent / "workers"
PLD_K = 10
OPENVINO_K = {"draft": 4, "lookup": 4}
OPENVINO_HOW = ("set ADASPEC_OPENVINO_PYTHON=/path/to/python (with openvino-genai) and export the models with "
                "`make peers` (or optimum-cli export openvino --weight-format int4, see docs/guide/peers.md)")


def parse_llamacpp(text: str) -> PeerSpec:
    """``llamacpp:pld[:N]`` → PeerSpec. Raises ConfigError."""
    kind, _, k = text.partition(":")[2].partition(":")
    if kind != "pld":
        raise ConfigError(f"bad method {text!r}: llama-cpp-python peers are llamacpp:pld[:N]")
    return PeerSpec(text, "llamacpp", "pld", _number(text, k, PLD_K))


def parse_openvino(text: str) -> PeerSpec:
    """``openvino:plain|draft[:K]|lookup[:K]`` → PeerSpec. Raises ConfigError."""
    kind, _, k = text.partition(":")[2].partition(":")
    if kind not in ("plain", "draft", "lookup"):
        raise ConfigError(f"bad method {text!r}: OpenVINO peers are openvino:plain, openvino:draft[:K] and "
                          "openvino:lookup[:K]")
    if kind == "plain":
        if k:
            raise ConfigError(f"bad method {text!r}: openvino:plain takes no number")
        return PeerSpec(text, "openvino", "plain")
    return PeerSpec(text, "openvino", kind, _number(text, k, OPENVINO_K[kind]))


def _number(text: str, value: str, default: int) -> int:
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"bad method {text!r}: K must be an integer") from None
    if number < 1:
        raise ConfigError(f"bad method {text!r}: K must be >= 1")
    return number


class WorkerPeer(ProcessPeer):
    """A worker script in its own Python process; subclasses give :meth:`python` and :meth:`load_request`."""

    script = ""

    def python(self) -> str:
        raise NotImplementedError

    def load_request(self) -> dict:
        raise NotImplementedError

    def command(self) -> tuple[list[str], dict]:
        python = self.python()
        request = self.load_request()  # may raise NOT_INSTALLED before anything starts
        self._load = request
        path = os.pathsep.join(x for x in (str(WORKERS), os.environ.get("PYTHONPATH", "")) if x)
        return [python, "-u", str(WORKERS / self.script)], {"PYTHONPATH": path}

    def _stdout(self):
        return subprocess.PIPE

    def _call(self, request: dict, deadline: float) -> dict:
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        line = self._read_line(deadline)
        reply = json.loads(line)
        if not reply.get("ok"):
            raise PeerFailure(reply.get("status", FAILED), reply.get("error", "worker failed"))
        return reply

    def _read_line(self, deadline: float) -> bytes:
        buf = b""
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while not buf.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PeerFailure(TIMED_OUT, "no answer from the worker within the time limit")
                if not sel.select(min(left, 1.0)):
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:  # the worker's stdout closed: it died
                    try:
                        self.proc.wait(2)
                    except subprocess.TimeoutExpired:
                        pass
                    raise self.exited()
                buf += chunk
        return buf

    def wait_ready(self, deadline: float) -> None:
        try:
            reply = self._call({"op": "load", **self._load}, deadline)
        except (BrokenPipeError, ValueError) as e:
            raise PeerFailure(FAILED, f"worker did not start: {e}") from None
        self.note = reply.get("note", "")
        self.engine = reply.get("engine", "")

    def ask(self, ids: list[int], max_new_tokens: int, temperature: float, seed: int) -> dict:
        request = {"op": "generate", "ids": ids, "max_new_tokens": max_new_tokens, "temperature": temperature,
                   "seed": seed}
        start = time.perf_counter()
        try:
            r = self._call(request, time.monotonic() + self.ctx.timeout_s)
        except BrokenPipeError:
            raise self.exited() from None
        except ValueError as e:
            raise PeerFailure(FAILED, f"bad answer from the worker: {e}") from None
        total_ms = r.get("total_ms", (time.perf_counter() - start) * 1e3)
        note = "; ".join(x for x in (getattr(self, "engine", ""), getattr(self, "note", "")) if x)
        return peer_row(token_ids=r["token_ids"], text=r.get("text"), finish_reason=r["finish_reason"],
                        prompt_tokens=len(ids), total_ms=total_ms, decode_ms=r.get("decode_ms"),
                        decode_tokens=r.get("decode_tokens"), timing_source=r.get("timing_source", ""),
                        weights=self.weights, draft_tokens=r.get("draft_tokens"),
                        accepted_tokens=r.get("accepted_tokens"), prefill_ms=r.get("prefill_ms"), note=note)


class LlamaCppPldPeer(WorkerPeer):
    """``llamacpp:pld[:N]``: llama-cpp-python's prompt lookup in a worker on adaspec's own Python, on the target's
    GGUF (needs the ``llamacpp`` extra; without it the row says not installed)."""

    script = "llamacpp_worker.py"

    def python(self) -> str:
        return sys.executable

    def load_request(self) -> dict:
        target = self.ctx.gguf("target")
        self.weights = gguf_weights(target)
        return {"gguf": str(target), "k": self.spec.k, "threads": self.ctx.threads, "n_ctx": self.ctx.n_ctx,
                "eos_token_ids": list(self.ctx.eos_token_ids)}


def peers_dir() -> Path:
    return Path(os.environ.get("ADASPEC_PEERS_DIR", ".peers"))


class OpenVinoPeer(WorkerPeer):
    """``openvino:plain|draft[:K]|lookup[:K]`` (see the module docstring)."""

    script = "openvino_worker.py"

    def python(self) -> str:
        env = os.environ.get("ADASPEC_OPENVINO_PYTHON")
        python = Path(env) if env else peers_dir() / "openvino" / "bin" / "python"
        if not python.exists():
            raise PeerFailure(NOT_INSTALLED, f"no OpenVINO Python at {python}: {OPENVINO_HOW}")
        return str(python)

    def _ir(self, model: str) -> Path:
        """The export of zoo model ``model``; a requantised GGUF variant (e.g. the Q4_0 draft) has no weights of its
        own outside the GGUF runtimes, so its base model's export stands in (the row's weights label says which)."""
        from adaspec.models.requantize import runnable_spec

        root = Path(os.environ.get("ADASPEC_OPENVINO_MODELS", peers_dir() / "openvino" / "models"))
        folder = root / model
        if not folder.exists():
            folder = root / runnable_spec(model, "torch")[0]
        if not (folder / "openvino_model.xml").is_file():
            raise PeerFailure(NOT_INSTALLED, f"no OpenVINO export of {model} at {folder}: {OPENVINO_HOW}")
        return folder

    def load_request(self) -> dict:
        target = self._ir(self.ctx.target)
        self.weights = ir_weights(target)
        request = {"target": str(target), "kind": self.spec.kind, "k": self.spec.k, "threads": self.ctx.threads,
                   "eos_token_ids": list(self.ctx.eos_token_ids)}
        if self.spec.kind == "draft":
            draft = self._ir(self.ctx.draft)
            request["draft"] = str(draft)
            self.weights += f", draft {draft.name} {ir_weights(draft)}"
        return request


def ir_weights(folder: Path) -> str:
    """``"OpenVINO int4_asym (group 128, backup int8_asym)"``-style label from the weight-compression record NNCF
    writes at the end of ``openvino_model.xml`` (optimum-intel 2.x leaves ``openvino_config.json`` without the bits);
    ``"OpenVINO IR"`` when there is none."""
    import re

    try:
        with open(folder / "openvino_model.xml", "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 20000))
            tail = f.read().decode(errors="replace")
    except OSError:
        return "OpenVINO IR"
    block = tail[tail.find("<weight_compression>"):] if "<weight_compression>" in tail else ""
    fields = dict(re.findall(r'<(mode|group_size|backup_mode) value="([^"]*)"', block))
    if "mode" not in fields:
        return "OpenVINO IR"
    extra = ", ".join(x for x in (f"group {fields['group_size']}" if "group_size" in fields else "",
                                  f"backup {fields['backup_mode']}" if "backup_mode" in fields else "") if x)
    return f"OpenVINO {fields['mode']}" + (f" ({extra})" if extra else "")
