"""Server settings: the batch's prefill defaults and :class:`ServerConfig` (the ``adaspec serve`` flags the HTTP
layer reads). Engines are keyed by :class:`~adaspec.spec_setting.SpecSetting` (``PLAIN``: plain decoding)."""

from __future__ import annotations

from dataclasses import dataclass

from adaspec.server.limits import DEFAULT_MAX_SCORED_LOGITS_MB, DEFAULT_MAX_SCORED_TOKENS
from adaspec.spec_setting import PLAIN, SpecSetting

__all__ = ["DEFAULT_PREFILL_CHUNK", "DEFAULT_PREFILL_STEP_MS", "PLAIN", "ServerConfig", "SpecSetting", "SpecSettings"]

DEFAULT_PREFILL_CHUNK = 64  # prompt tokens per batch step while other rows decode (--prefill-chunk)
DEFAULT_PREFILL_STEP_MS = 750.0  # wall-time budget of a batch step carrying prefill (--prefill-step-ms)
DEFAULT_PREFIX_CACHE_MIB = 1024  # host memory for copies of earlier sequences' caches (--prefix-cache-mib)
DEFAULT_PREFIX_CACHE_BYTES = DEFAULT_PREFIX_CACHE_MIB << 20


SpecSettings = SpecSetting  # the server's older name for the one setting type (:mod:`adaspec.spec_setting`)


@dataclass
class ServerConfig:
    """Server settings (``adaspec serve`` flags).

    Attributes:
        served_model_name: the name clients pass as ``model`` (default: the target's name).
        api_key: when set (one key or several), every route but ``/health`` needs ``Authorization: Bearer <key>``
            with one of them (:mod:`adaspec.server.auth`).
        suffix_share: every key's requests read and write one suffix-cache partition; off (the default), each
            key has its own and a request never drafts from text another key's requests wrote
            (:mod:`adaspec.server.suffix_partitions`).
        max_queue: requests that may wait for the model besides the running one; more get 503.
        request_timeout: seconds from arrival (queue wait included) after which a request is stopped (504).
        max_body_bytes: larger request bodies get 413.
        default_max_tokens: ``max_tokens`` when a request gives none (capped by the context window).
        max_tokens_limit: the largest ``max_tokens`` accepted (default: the context window).
        metrics_namespace: prefix of the metric names.
        strict: every request runs in strict mode (batch-invariant target: greedy output equals plain decoding and
            a repeated request gives the same text) unless it sends ``"strict": false``.
        model_aliases: more names accepted as ``model`` (the target's runtime-qualified name always is).
        allowed_hosts: host names accepted in ``Host``/``Origin`` headers (:mod:`adaspec.server.hostcheck`);
            None: no check.
        max_slots_per_request: running slots one request's ``n`` choices hold at once (default: half the slots).
        max_queue_per_client: queue places one client address may hold (default: the whole queue); freed slots
            always go first to the waiting client that holds the fewest (:mod:`adaspec.server.admission`).
        max_scored_tokens: prompt tokens ``echo`` + ``logprobs`` may score per request (413 beyond).
        max_scored_logits_mb: MiB of float32 logits a scored prefill holds at once, per request and per batch step.
    """

    served_model_name: str | None = None
    api_key: str | tuple[str, ...] | None = None
    suffix_share: bool = False
    max_queue: int = 32
    request_timeout: float = 600.0
    max_body_bytes: int = 1 << 20
    default_max_tokens: int = 256
    max_tokens_limit: int | None = None
    metrics_namespace: str = "adaspec"
    strict: bool = False
    model_aliases: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] | None = None
    max_slots_per_request: int | None = None
    max_queue_per_client: int | None = None
    max_scored_tokens: int = DEFAULT_MAX_SCORED_TOKENS
    max_scored_logits_mb: int = DEFAULT_MAX_SCORED_LOGITS_MB
