"""Chunked prefill of a batch's joining rows: the step's prompt-token budget, the slice each row feeds, prompt
prefixes shared between rows, prompt scoring by chunks, and draft-model catch-up by chunks."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from adaspec.backends.base import Backend, BatchRow
from adaspec.batch.rows import Row
from adaspec.chunking import MIN_PREFILL_CHUNK, StepCosts, common_prefix
from adaspec.drafters.multi import model_drafters
from adaspec.logprobs import token_logprobs

Fail = Callable[[Row, BaseException], None]  # takes a failed row out of the batch


class ChunkedPrefill:
    """How much of which prompt a batch step prefills.

    Args:
        target: the batch's target backend.
        chunk: prompt tokens prefilled per step over all joining rows while other rows decode (four times as many
            when none does), and draft-model catch-up tokens fed per row and step; None = whole prompts.
        step_ms: with ``chunk``, a wall-time budget in ms for a step that carries prefill or catch-up while another
            row waits on it (chunks sized from :attr:`costs`); None = fixed chunks.
        max_scored_rows: positions whose logits one step keeps for prompt scoring, over all rows.
    """

    def __init__(self, target: Backend, chunk: int | None, step_ms: float | None, max_scored_rows: int) -> None:
        self.target = target
        self.chunk = chunk
        self.step_ms = step_ms
        self.max_scored_rows = max_scored_rows
        self.costs = StepCosts()  # measured ms per token of the target's forwards and the draft models' feeds
        self.shared_tokens = 0  # prompt tokens the last plan took from other rows' caches (share_prefix)

    def budget(self, alone: bool, decode_tokens: int, step_start: float) -> int | None:
        """Prompt tokens this step may prefill over all rows: None (whole prompts) without ``chunk``; four chunks
        when no row decodes; else one chunk, or with ``step_ms`` what fits in the rest of the step's budget beside
        the decoding rows' ``decode_tokens`` (at least ``MIN_PREFILL_CHUNK``)."""
        if self.chunk is None:
            return None
        if alone:
            return self.chunk * 4
        if self.step_ms is None:
            return self.chunk
        spent = (time.perf_counter() - step_start) * 1e3
        return self.bounded(self.costs.tokens_within(self.step_ms - spent, decode_tokens))

    def bounded(self, tokens: int | None) -> int:
        """``tokens`` within [``MIN_PREFILL_CHUNK``, ``chunk``] (``chunk`` when unknown)."""
        cap = self.chunk
        return cap if tokens is None else max(min(MIN_PREFILL_CHUNK, cap), min(cap, tokens))

    def plan(self, running: dict[int, Row], budget: int | None, fail: Fail) -> dict[int, tuple[int, int]]:
        """``{rid: (start, end)}``: the prompt slice each prefilling row of ``running`` (in admission order) feeds
        this step, within ``budget`` tokens (None: no limit) and ``max_scored_rows``. A row first takes what an
        earlier row has cached of the same prompt prefix (:meth:`_share`); a row whose prefix an earlier row is
        still prefilling waits for it rather than computing it twice."""
        scored_left = self.max_scored_rows
        plan: dict[int, tuple[int, int]] = {}
        self.shared_tokens = 0
        for row in list(running.values()):
            if row.prefilled:
                continue
            scored = row.cfg.prompt_logprobs is not None
            if not scored and self._share(row, running, fail):
                continue  # waits for the row that prefills its prefix
            if row.rid not in running:
                continue  # failed while sharing
            start = row.prefill_pos
            n = len(row.prompt) - start
            if budget is not None and not (self.target.batch_invariant and not scored):
                if budget <= 0:
                    continue
                n = min(n, budget)
            if scored:
                if scored_left <= 0:
                    continue
                n = min(n, scored_left, row.cfg.prompt_logprobs_chunk or scored_left)
                scored_left -= n
            if budget is not None:
                budget -= n
            plan[row.rid] = (start, start + n)
        return plan

    def _share(self, row: Row, running: dict[int, Row], fail: Fail) -> bool:
        """Give ``row`` the longest prompt prefix that an earlier row holds in its cache (all but the row's last
        prompt token, whose logits it needs), through :meth:`Backend.share_prefix`. Returns True when the row
        should wait this step: an earlier row is still prefilling more of the same prefix. Strict batches and
        runtimes without shared prefixes never share (each row prefills its own prompt)."""
        if not self.target.shares_prefix or self.target.batch_invariant:
            return False
        limit = len(row.prompt) - 1
        best, donor, wait = row.prefill_pos, None, False
        for other in running.values():
            if other is row:
                break  # only rows admitted before this one
            if other.cfg.prompt_logprobs is not None and not other.prefilled:
                continue
            cached = len(other.prompt) if other.prefilled else other.prefill_pos
            common = common_prefix(row.prompt, other.prompt, limit)
            if not other.prefilled and common > cached:
                wait = wait or cached >= row.prefill_pos  # it will get there first
            if min(common, cached) > best:
                best, donor = min(common, cached), other
        if donor is not None:
            try:
                self.target.share_prefix(donor.seq, row.seq, row.prefill_pos, best)
            except Exception as e:
                fail(row, e)
                return False
            self.shared_tokens += best - row.prefill_pos
            row.req.stats.cached_tokens += best - row.prefill_pos
            row.prefill_pos = best
        return wait and row.prefill_pos < limit

    @staticmethod
    def batch_row(row: Row, start: int, end: int) -> BatchRow:
        """The forward input for ``row``'s prompt slice ``[start, end)`` (every position's logits when scored)."""
        return BatchRow(row.seq, row.prompt[start:end], end - start if row.cfg.prompt_logprobs is not None else 1)

    @staticmethod
    def prefilled(row: Row, end: int, logits: torch.Tensor) -> bool:
        """After a prefill chunk ending at prompt position ``end``, with the chunk's logits: score its positions
        (with ``prompt_logprobs``). Returns True when the whole prompt is in the cache."""
        start, row.prefill_pos = row.prefill_pos, end
        if row.req.prompt_logprobs is not None:  # position i predicts prompt token i + 1
            row.req.prompt_logprobs += token_logprobs(logits, row.prompt[start + 1:end + 1],
                                                      row.cfg.prompt_logprobs) or []
        return end >= len(row.prompt)

    def catch_up(self, decoding: list[Row], ks: dict[int, int], draft_costs: dict[str, tuple[float, float]],
                 fail: Fail, step_start: float | None) -> None:
        """Feed each draft model that is more than a chunk behind its row's sequence one chunk (the row drafts
        nothing this step: its ``ks`` entry becomes 0), so a long prompt's draft prefill is spread over steps too.
        The chunk is ``chunk`` tokens, or with ``step_ms`` and ``step_start`` (another row waits on this step) what
        the rest of the step's budget affords at the draft's measured ms per token fed (``draft_costs``, {name:
        (draft, feed) ms per token}, before any measurement)."""
        if self.chunk is None:
            return
        for row in decoding:
            if row.drafter is None or not ks.get(row.rid):
                continue
            try:
                for name, d in model_drafters(row.drafter).items():
                    if not hasattr(d, "lag"):
                        continue
                    chunk = self.chunk
                    if self.step_ms is not None and step_start is not None:
                        left = self.step_ms - (time.perf_counter() - step_start) * 1e3
                        prior = draft_costs.get(name, (0.0, None))[1]
                        chunk = self.bounded(self.costs.feed_tokens_within(name, left, prior))
                    if d.lag(row.ids) > chunk:  # a bounded catch-up lags at most its bound
                        t = time.perf_counter()
                        fed = d.feed(row.ids, chunk)
                        if fed:
                            self.costs.fed(name, fed, (time.perf_counter() - t) * 1e3)
                        ks[row.rid] = 0
            except Exception as e:
                fail(row, e)
