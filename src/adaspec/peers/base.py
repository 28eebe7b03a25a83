"""What every out-of-process peer shares: its spec, the context it starts from, start/ask/stop of its process, the
row it returns, and how a failure (not installed, crashed, timed out) becomes a row instead of an exception.

A peer's process is started on first use (the untimed warm-up), kept across the run's prompts, restarted after a
crash or a timeout, and stopped when the comparison ends (:meth:`ProcessPeer.stop`: SIGTERM to its process group,
SIGKILL after 5 s). Its stdout and stderr go to a log file; a failure row carries the log's last lines.

Every peer reports decoding the way adaspec's rows do (``decode_ms``: time after the first token, ``decode_tokens``:
tokens after the first) and says where the numbers come from in ``timing_source``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

LOG_TAIL_LINES = 20
DEFAULT_TIMEOUT_S = 600.0  # one request (ADASPEC_PEER_TIMEOUT)
DEFAULT_START_TIMEOUT_S = 300.0  # start-up and model load (ADASPEC_PEER_START_TIMEOUT)

NOT_INSTALLED, NOT_RUNNING, CRASHED, TIMED_OUT, FAILED = ("not installed", "not running", "crashed", "timed out",
                                                        "failed")


class PeerFailure(Exception):
    """A peer could not answer. ``status``: ``not installed``, ``not running`` (an endpoint), ``crashed``,
    ``timed out`` or ``failed``."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True)
class PeerSpec:
    """A parsed out-of-process peer method.

    ``library``: ``llama-server``, ``llamacpp``, ``openvino``, ``vllm`` or ``openai``; ``kind``: the mode (``plain``,
    ``draft``, ``ngram``, ``draft+ngram``, ``pld``, ``lookup``, ``endpoint``); ``k``: draft tokens per step (or
    lookup tokens), None for plain; ``ngram``: n-gram size for n-gram modes; ``url``: an endpoint's base URL.
    """

    label: str
    library: str
    kind: str
    k: int | None = None
    ngram: int | None = None
    url: str | None = None

    @property
    def needs_draft_model(self) -> bool:
        return "draft" in self.kind.split("+")


@dataclass
class PeerContext:
    """What a peer starts from: the comparison's models, threads and limits.

    ``target_gguf`` / ``draft_gguf``: the GGUF files (paths, or callables resolving them on first use);
    ``target`` / ``draft``: the zoo names (OpenVINO looks its exports up by them). ``eos_token_ids``: adaspec's stop
    tokens. ``log_dir``: where each peer's log file goes. Timeouts in seconds (env ``ADASPEC_PEER_TIMEOUT``,
    ``ADASPEC_PEER_START_TIMEOUT`` override the defaults).
    """

    target: str
    draft: str
    threads: int
    log_dir: Path
    eos_token_ids: tuple[int, ...] = ()
    target_gguf: object = None
    draft_gguf: object = None
    n_ctx: int = 4096
    tokenize: object = None  # text -> token ids (the comparison's tokenizer), for a peer that answers with text only
    detokenize: object = None  # token ids -> text, for a peer that answers with ids only
    timeout_s: float = field(default_factory=lambda: float(os.environ.get("ADASPEC_PEER_TIMEOUT",
                                                                          DEFAULT_TIMEOUT_S)))
    start_timeout_s: float = field(default_factory=lambda: float(os.environ.get("ADASPEC_PEER_START_TIMEOUT",
                                                                                DEFAULT_START_TIMEOUT_S)))

    def gguf(self, which: str) -> Path:
        """The target's or draft's GGUF file (``which``: ``target`` / ``draft``), resolved once."""
        attr = f"{which}_gguf"
        value = getattr(self, attr)
        if callable(value):
            try:
                value = value()
            except Exception as e:  # noqa: BLE001 - e.g. a PyTorch folder has no GGUF: the row says so
                raise PeerFailure(FAILED, f"no GGUF file for the {which} model: {e}") from None
            setattr(self, attr, value)
        if value is None:
            raise PeerFailure(FAILED, f"no GGUF file for the {which} model")
        return Path(value)


def first_difference(a, b) -> int | None:
    """Index of the first position where sequences ``a`` and ``b`` differ (a missing element counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def gguf_weights(path: Path) -> str:
    """``"GGUF Q4_K_M"``-style label of a GGUF file's weights (its ``general.file_type``), ``"GGUF"`` if unknown."""
    try:
        from gguf import GGUFReader, LlamaFileType

        field_ = GGUFReader(str(path)).fields.get("general.file_type")
        if field_ is not None:
            name = LlamaFileType(int(field_.parts[field_.data[0]][0])).name
            return "GGUF " + name.removeprefix("MOSTLY_")
    except Exception:  # noqa: BLE001 - a label only
        pass
    return "GGUF"


def peer_row(*, token_ids: list[int] | None, text: str | None, finish_reason: str, prompt_tokens: int,
             total_ms: float, decode_ms: float | None, decode_tokens: int | None, timing_source: str, weights: str,
             draft_tokens: int | None = None, accepted_tokens: int | None = None, prefill_ms: float | None = None,
             note: str = "") -> dict:
    """The result fields of a compare row for a peer that answered (the same keys as adaspec's rows; what a peer
    does not report is None)."""
    new = len(token_ids) if token_ids is not None else 0
    return {"finish_reason": finish_reason, "token_ids": token_ids, "text": text, "prompt_tokens": prompt_tokens,
            "new_tokens": new, "total_ms": round(total_ms, 2),
            "decode_ms": round(decode_ms, 2) if decode_ms is not None else None, "decode_tokens": decode_tokens,
            "tokens_per_s": round(new / (total_ms / 1e3), 3) if total_ms > 0 else 0.0,
            "steps": None, "speculation_steps": None, "draft_tokens": draft_tokens,
            "accepted_tokens": accepted_tokens,
            "acceptance_rate": (accepted_tokens / draft_tokens if draft_tokens else None)
            if accepted_tokens is not None else None,
            "mean_accepted_tokens": None, "prefill_ms": prefill_ms, "draft_ms": None, "verify_ms": None,
            "other_ms": None, "peer": True, "peer_status": "ok", "peer_note": note, "peer_k_after": None,
            "weights": weights, "timing_source": timing_source}


def complete_row(row: dict, ctx: PeerContext) -> dict:
    """Fill a peer row's missing ``text`` or ``token_ids`` with the comparison's tokenizer (a note says so)."""
    if row.get("token_ids") is None and row.get("text") is not None and ctx.tokenize is not None:
        row["token_ids"] = list(ctx.tokenize(row["text"]))
        row["new_tokens"] = len(row["token_ids"])
        row["peer_note"] = "; ".join(x for x in (row.get("peer_note"), "token ids re-tokenised from the text") if x)
    if row.get("text") is None and row.get("token_ids") is not None and ctx.detokenize is not None:
        row["text"] = ctx.detokenize(row["token_ids"])
    return row


def failure_row(failure: PeerFailure, log_tail: str, weights: str = "") -> dict:
    """The result fields of a compare row for a peer that did not answer: ``error``, ``peer_status``, ``log_tail``;
    compare's summary leaves these rows out of every number and lists them apart."""
    return {"finish_reason": "error", "token_ids": None, "text": None, "new_tokens": 0, "total_ms": None,
            "decode_ms": None, "decode_tokens": None, "peer": True, "peer_status": failure.status,
            "error": str(failure), "log_tail": log_tail, "weights": weights}


def exit_text(code: int | None) -> str:
    """``exited with code 3`` / ``killed by SIGILL`` (an illegal instruction: a binary built for another CPU)."""
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exited with code {code}"


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to send SIGTERM when the comparison's process dies, so a killed
    comparison (SIGKILL, which skips every ``finally``) leaves no server behind. A no-op elsewhere."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class ProcessPeer:
    """A peer run in its own process. Subclasses give :meth:`command` (raising ``PeerFailure(NOT_INSTALLED, how)``
    when the engine is not found), :meth:`wait_ready` and :meth:`ask`."""

    def __init__(self, spec: PeerSpec, ctx: PeerContext) -> None:
        self.spec = spec
        self.ctx = ctx
        self.proc: subprocess.Popen | None = None
        self.log_path = ctx.log_dir / (spec.label.replace("/", "_").replace(":", "_").replace("+", "_") + ".log")
        self.weights = ""
        self._log = None

    # --- to override --------------------------------------------------------------------------------------------
    def command(self) -> tuple[list[str], dict]:
        """``(argv, extra environment)`` of the peer's process."""
        raise NotImplementedError

    def wait_ready(self, deadline: float) -> None:
        """Block until the started process serves requests; raise PeerFailure on a crash or at ``deadline``
        (``time.monotonic()``)."""
        raise NotImplementedError

    def ask(self, ids: list[int], max_new_tokens: int, temperature: float, seed: int) -> dict:
        """One generation on the running process: the fields of :func:`peer_row`."""
        raise NotImplementedError

    # --- lifecycle ----------------------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exits_within(self, seconds: float) -> bool:
        """True when the process has ended or ends within ``seconds`` (a connection that broke mid-answer usually
        means the process is dying, but it may not be reaped yet when the client sees the broken connection)."""
        if self.proc is None:
            return True
        try:
            self.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            return False
        return True

    def start(self) -> None:
        """Start the process (a no-op when it runs) and wait until it is ready. Raises PeerFailure."""
        if self.running:
            return
        self.stop()
        argv, env = self.command()
        self.ctx.log_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self._log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} start: {' '.join(argv)}\n".encode())
        self._log.flush()
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=self._stdout(), stderr=self._log,
                                         env={**os.environ, **env}, start_new_session=True,
                                         preexec_fn=_die_with_parent)
        except OSError as e:
            raise PeerFailure(NOT_INSTALLED, f"cannot run {argv[0]}: {e}") from None
        self.wait_ready(time.monotonic() + self.ctx.start_timeout_s)

    def _stdout(self):
        return self._log

    def stop(self) -> None:
        """Stop the process and its children (SIGTERM to the group, SIGKILL after 5 s). Idempotent."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if proc is not None:
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass
            try:
                proc.wait(1.0)
            except subprocess.TimeoutExpired:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None

    close = stop

    def exited(self) -> PeerFailure:
        """The failure to report for a process found dead."""
        return PeerFailure(CRASHED, f"{self.spec.library} {exit_text(self.proc.poll() if self.proc else None)}")

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])

    # --- what compare calls -------------------------------------------------------------------------------------
    def generate(self, prompt_ids: list[int], *, max_new_tokens: int, temperature: float = 0.0,
                 seed: int = 0) -> dict:
        """One generation: a :func:`peer_row`, or a :func:`failure_row` (the process is stopped, and started again
        on the next call)."""
        try:
            self.start()
            return complete_row(self.ask(list(prompt_ids), max_new_tokens, temperature, seed), self.ctx)
        except PeerFailure as failure:
            if failure.status not in (NOT_INSTALLED, CRASHED) and self.proc is not None \
                    and self.proc.poll() is not None:
                failure = PeerFailure(CRASHED, f"{failure.message} ({exit_text(self.proc.poll())})")
            started = self.proc is not None  # else nothing ran: an older log is not this failure's
            self.stop()
            return failure_row(failure, self.log_tail() if started else "", self.weights)

    def warmup(self) -> None:
        """Start the process and generate a few tokens, untimed; a failure shows up in the first real row."""
        row = self.generate([1, 2, 3, 4, 5, 6, 7, 8], max_new_tokens=3)
        if row.get("error"):
            self.stop()
