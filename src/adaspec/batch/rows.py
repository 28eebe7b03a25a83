"""A batch row (one request in its sequence slot) and the batched forward that isolates a failing row."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from adaspec.backends.base import Backend, BatchRow, SequenceView
from adaspec.controllers.base import Controller
from adaspec.drafters.base import Drafter, DraftStop
from adaspec.request import GenerationConfig
from adaspec.request_state import RequestState

@dataclass
class Row:
    """One request in the batch: its :class:`RequestState` and the slot it runs in."""

    rid: int
    req: RequestState
    arrival: float
    drafter_for: Callable[[int], Drafter | None] | None
    controller_factory: Callable[[], Controller]
    seq: int = -1
    drafter: Drafter | None = None  # the slot's drafter (the one its controller routes and prices)
    proposer: Drafter | None = None  # what drafts: the drafter, behind the grammar's forced tokens where it has one
    controller: Controller | None = None
    stop_rule: DraftStop | None = None  # the controller's early-stop rule for drafts, fixed per request
    prefilled: bool = False
    prefill_pos: int = 0  # prompt tokens in the target's cache while prefilling (chunked prefill)
    alpha: float = 0.6  # acceptance estimate for the batch pricer (EMA)
    draft_ms: float | None = None  # ms per drafted token (EMA)
    forced: list[int] = field(default_factory=list)  # the grammar's forced tokens this step drafts ahead of K

    @property
    def prompt(self) -> list[int]:
        return self.req.prompt

    @property
    def cfg(self) -> GenerationConfig:
        return self.req.cfg

    @property
    def ids(self) -> list[int]:
        return self.req.ids


def sequence_of(backend: Backend) -> tuple[Backend, int]:
    """(the multi-sequence backend, sequence id) a single-sequence view runs on; a backend itself is sequence 0."""
    if isinstance(backend, SequenceView):
        return backend.parent, backend.seq
    return backend, 0


def forward_isolated(backend: Backend, rows: list[BatchRow]) -> list[torch.Tensor | BaseException]:
    """``backend.forward_batch(rows)``; when it fails, every row's sequence is rolled back to its length before and
    each row runs alone, so one row's failure (reported as its exception) does not fail the others."""
    before = [backend.seq_len_of(r.seq) for r in rows]
    try:
        logits = list(backend.forward_batch(rows))
        backend.synchronize()
        return logits
    except Exception as e:
        if len(rows) == 1:
            backend.truncate_seq(rows[0].seq, before[0])
            return [e]
    result: list[torch.Tensor | BaseException] = []
    for r, n in zip(rows, before):
        backend.truncate_seq(r.seq, n)
        try:
            result.append(backend.forward_batch([r])[0])
        except Exception as e:
            backend.truncate_seq(r.seq, n)
            result.append(e)
    backend.synchronize()
    return result

