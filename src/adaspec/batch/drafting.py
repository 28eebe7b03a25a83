"""Batched drafting: every decoding row's proposal, with the draft forwards of many rows in one batch."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from adaspec.backends.base import Backend, BatchRow
from adaspec.batch.rows import Row, forward_isolated, sequence_of
from adaspec.drafters.base import Draft, empty_draft
from adaspec.drafters.forced import ForcedDrafter


def draft_rows(decoding: list[Row], ks: dict[int, int], fail: Callable[[Row, BaseException], None]
               ) -> tuple[dict[int, Draft], dict[int, float], dict[int, int], dict[int, int]]:
    """Every decoding row's proposal (:meth:`Drafter.proposal`), with batched drafting: in each round, the rows
    whose draft model needs a forward of the same multi-sequence draft backend go into one ``forward_batch``
    (row ``i``'s draft model runs on sequence ``seq_i``), so K draft steps of B rows cost K batched forwards, not
    B·K. A row with a grammar proposes its forced tokens on top of its K
    (:meth:`ForcedDrafter.free_proposal`), and its draft is cut where the grammar rejects it. Returns the
    drafts, each row's draft time in ms (its own work plus an equal share of every forward it was in), the
    tokens each row's first forward fed (> 2: a catch-up, not the per-token cost) and each row's forced
    tokens. A row whose drafter fails goes to ``fail`` and has no draft."""
    drafts: dict[int, Draft] = {}
    forced: dict[int, int] = {}
    draft_ms: dict[int, float] = {r.rid: 0.0 for r in decoding}
    behind: dict[int, int] = {}
    rows = {r.rid: r for r in decoding}
    proposals = {}
    feeds: dict[int, tuple[Backend, int, list[int]]] = {}  # rid -> (parent backend, sequence, tokens)

    def advance(rid: int, logits: torch.Tensor | None = None, error: BaseException | None = None) -> None:
        t = time.perf_counter()
        gen = proposals[rid]
        feeds.pop(rid, None)
        try:
            backend, tokens = (gen.throw(error) if error is not None else
                               next(gen) if logits is None else gen.send(logits))
            feeds[rid] = (*sequence_of(backend), list(tokens))
            behind.setdefault(rid, len(tokens))
        except StopIteration as done:
            row = rows[rid]
            draft = done.value
            if isinstance(row.proposer, ForcedDrafter):
                draft, forced[rid] = draft
            drafts[rid] = draft if row.req.grammar is None else row.req.grammar.cut(draft)
        except Exception as e:
            fail(rows[rid], e)
        draft_ms[rid] += (time.perf_counter() - t) * 1e3

    for row in decoding:
        k = ks[row.rid]
        if isinstance(row.proposer, ForcedDrafter):  # forced tokens on top of K, within the row's room
            proposals[row.rid] = row.proposer.free_proposal(row.ids, row.forced, k, row.req.room() - 1,
                                                            row.req.params, row.req.generator, row.stop_rule)
            advance(row.rid)
        elif k > 0 and row.proposer is not None:
            proposals[row.rid] = row.proposer.proposal(row.ids, k, row.req.params, row.req.generator,
                                                       row.stop_rule)
            advance(row.rid)
        else:
            drafts[row.rid] = empty_draft()
    while feeds:
        groups: dict[int, list[int]] = {}
        for rid, (parent, _, _) in feeds.items():
            groups.setdefault(id(parent), []).append(rid)
        for rids in groups.values():
            parent = feeds[rids[0]][0]
            t = time.perf_counter()
            results = forward_isolated(parent, [BatchRow(feeds[r][1], feeds[r][2], 1) for r in rids])
            share = (time.perf_counter() - t) * 1e3 / len(rids)
            for rid, res in zip(rids, results):
                draft_ms[rid] += share
                if isinstance(res, BaseException):
                    advance(rid, error=res)
                else:
                    advance(rid, logits=res[-1])
    return drafts, draft_ms, {rid: behind.get(rid, 0) for rid in draft_ms}, forced
