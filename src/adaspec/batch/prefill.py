"""Chunked prefill of a batch's joining rows: the step's prompt-token budget, the slice each row feeds, prompt
prefixes shared between rows, prompt scoring by chunks, and draft-model catch-up by chunks."""

from __future__ import annotations

import time

import torch

from adaspec.backends.base import BatchRow
from adaspec.batch.rows import _Row
from adaspec.chunking import MIN_PREFILL_CHUNK, common_prefix
from adaspec.drafters.multi import model_drafters
from adaspec.logprobs import token_logprobs
from adaspec.request import StreamChunk


class _ChunkedPrefill:
    """The chunked-prefill part of :class:`~adaspec.batch.engine.BatchEngine` (a mixin)."""

    def _prefill_budget(self, alone: bool, decode_tokens: int, step_start: float) -> int | None:
        """Prompt tokens this step may prefill over all rows: None (whole prompts) without ``prefill_chunk``;
        four chunks when no row decodes; else one chunk, or with ``prefill_step_ms`` what fits in the rest of the
        step's budget beside the decoding rows' ``decode_tokens`` (at least ``MIN_PREFILL_CHUNK``)."""
        if self.prefill_chunk is None:
            return None
        if alone:
            return self.prefill_chunk * 4
        if self.prefill_step_ms is None:
            return self.prefill_chunk
        spent = (time.perf_counter() - step_start) * 1e3
        fits = self._step_costs.tokens_within(self.prefill_step_ms - spent, decode_tokens)
        return self._bounded(fits)

    def _bounded(self, tokens: int | None) -> int:
        """``tokens`` within [``MIN_PREFILL_CHUNK``, ``prefill_chunk``] (``prefill_chunk`` when unknown)."""
        cap = self.prefill_chunk
        return cap if tokens is None else max(min(MIN_PREFILL_CHUNK, cap), min(cap, tokens))

    def _plan_prefill(self, budget: int | None, out: dict[int, StreamChunk]) -> dict[int, tuple[int, int]]:
        """``{rid: (start, end)}``: the prompt slice each prefilling row feeds this step, in admission order, within
        ``budget`` tokens (None: no limit) and ``max_scored_rows``. A row first takes what an earlier row has
        cached of the same prompt prefix (:meth:`_share`); a row whose prefix an earlier row is still prefilling
        waits for it rather than computing it twice."""
        scored_left = self.max_scored_rows
        plan: dict[int, tuple[int, int]] = {}
        self.last_shared_tokens = 0
        for row in list(self._running.values()):
            if row.prefilled:
                continue
            scored = row.cfg.prompt_logprobs is not None
            if not scored and self._share(row, out):
                continue  # waits for the row that prefills its prefix
            if row.rid not in self._running:
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

    def _share(self, row: _Row, out: dict[int, StreamChunk]) -> bool:
        """Give ``row`` the longest prompt prefix that an earlier row holds in its cache (all but the row's last
        prompt token, whose logits it needs), through :meth:`Backend.share_prefix`. Returns True when the row
        should wait this step: an earlier row is still prefilling more of the same prefix. Strict batches and
        runtimes without shared prefixes never share (each row prefills its own prompt)."""
        if not self.target.shares_prefix or self.target.batch_invariant:
            return False
        limit = len(row.prompt) - 1
        best, donor, wait = row.prefill_pos, None, False
        for other in self._running.values():
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
                self._fail(row, e, out)
                return False
            self.last_shared_tokens += best - row.prefill_pos
            row.prefill_pos = best
        return wait and row.prefill_pos < limit

    def _prefill_row(self, row: _Row, start: int, end: int) -> BatchRow:
        return BatchRow(row.seq, row.prompt[start:end], end - start if row.cfg.prompt_logprobs is not None else 1)

    def _prefilled(self, row: _Row, end: int, logits: torch.Tensor) -> StreamChunk | None:
        """After a prefill chunk ending at prompt position ``end``: score its positions (with ``prompt_logprobs``);
        after the last chunk, the first token (:meth:`_first`)."""
        start, row.prefill_pos = row.prefill_pos, end
        if row.req.prompt_logprobs is not None:  # position i predicts prompt token i + 1
            row.req.prompt_logprobs += token_logprobs(logits, row.prompt[start + 1:end + 1],
                                                  row.cfg.prompt_logprobs) or []
        if end < len(row.prompt):
            return None
        return self._first(row, logits[-1:])

    def _catch_up(self, decoding: list[_Row], ks: dict[int, int], out: dict[int, StreamChunk],
                  step_start: float | None) -> None:
        """Feed each draft model that is more than a chunk behind its row's sequence one chunk (the row drafts
        nothing this step), so a long prompt's draft prefill is spread over steps too. The chunk is
        ``prefill_chunk`` tokens, or with ``prefill_step_ms`` and ``step_start`` (another row waits on this step)
        what the rest of the step's budget affords at the draft's measured ms per token fed."""
        if self.prefill_chunk is None:
            return
        for row in decoding:
            if row.drafter is None or not ks.get(row.rid):
                continue
            try:
                for name, d in model_drafters(row.drafter).items():
                    if not hasattr(d, "feed"):
                        continue
                    chunk = self.prefill_chunk
                    if self.prefill_step_ms is not None and step_start is not None:
                        left = self.prefill_step_ms - (time.perf_counter() - step_start) * 1e3
                        prior = self.draft_costs.get(name, (0.0, None))[1]
                        chunk = self._bounded(self._step_costs.feed_tokens_within(name, left, prior))
                    have = d.cached_prefix(row.ids)
                    if len(row.ids) - have > chunk:
                        t = time.perf_counter()
                        d.feed(row.ids[:have + chunk + 1])
                        self._step_costs.fed(name, chunk + 1, (time.perf_counter() - t) * 1e3)
                        ks[row.rid] = 0
            except Exception as e:
                self._fail(row, e, out)
