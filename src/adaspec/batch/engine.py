"""The batch engine: requests join, step and leave (see :mod:`adaspec.batch`)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence

import torch

from adaspec.backends.base import Backend, BatchRow
from adaspec.batch.drafting import draft_rows
from adaspec.batch.prefill import ChunkedPrefill, Fail
from adaspec.batch.rows import Row, forward_isolated
from adaspec.controllers.base import Controller
from adaspec.controllers.batch import BatchPricer, RowEstimate
from adaspec.constrained import RequestGrammar
from adaspec.controllers.fixed import FixedController
from adaspec.drafters.base import Draft, Drafter
from adaspec.drafters.forced import forced_first, request_drafter, unwrapped, without_forced
from adaspec.drafters.multi import cached_prefixes, catch_up_limits, measure_drafters, model_drafters
from adaspec.logprobs import score_rows
from adaspec.request_state import RequestState
from adaspec.request import GenerationConfig, GenerationResult, StreamChunk, TokenLogprob, default_eos_ids
from adaspec.errors import ConfigError
from adaspec.stats import StepRecord
from adaspec.structured.constraint import Constraint
from adaspec.structured.vocab import GrammarVocab
from adaspec.verify import in_vocab

class BatchEngine:
    """Continuous batching over one target backend with ``max_sequences`` >= ``max_batch``.

    Args:
        target: the target's backend, built with ``max_sequences`` >= ``max_batch`` (a GGUF runtime batches the rows
            in one ``llama_decode``; PyTorch in one padded forward over their own caches).
        drafter_for: ``seq -> Drafter | None``, called once per sequence slot (a model drafter wraps
            ``draft_backend.sequence(seq)``); None = plain batched decoding.
        controller_factory: a fresh controller per request (default: fixed K = 0 without a drafter).
        tokenizer, eos_token_ids: as for :class:`~adaspec.engine.SpeculativeEngine`.
        max_batch: rows decoding at once (default: ``target.max_sequences``); more requests wait in FIFO order.
        pricer: the batch's K cap (default: an uncalibrated one, which keeps the rows' own K until
            :meth:`calibrate`).
        probe_every: when the pricer's cap is 0 but rows want to draft, every this many steps one step drafts at
            the best positive cap anyway, so the rows' acceptance keeps being measured (without it a pessimistic
            acceptance prior keeps speculation off for good; 0 = never probe).
        prefill_chunk: prompt tokens prefilled per step over all joining rows while other rows decode (four times
            as many when no row decodes), and draft-model catch-up tokens fed per row and step; None = whole
            prompts in one forward. A batch in strict mode prefills unscored prompts whole (strict output equals
            plain decoding, whose prefill is one forward).
        prefill_step_ms: with ``prefill_chunk``, a wall-time budget in ms for a step that carries prefill or
            draft catch-up while another row waits on it: the step's prefill and catch-up tokens are sized from the
            measured ms per token of the forwards (at least ``MIN_PREFILL_CHUNK``, at most ``prefill_chunk``
            each), so a long prompt delays the other rows by about this much per step. None = fixed chunks.
        max_scored_rows: positions whose logits one step keeps for prompt scoring, over all rows (default:
            :func:`~adaspec.engine.score_rows`, 256 MiB of float32 logits).

    Raises:
        ConfigError: ``max_batch`` above what the target holds, K > 0 without a drafter, ``prefill_chunk`` < 1 or
            ``prefill_step_ms`` <= 0.
    """

    def __init__(self, target: Backend, drafter_for: Callable[[int], Drafter | None] | None = None,
                 controller_factory: Callable[[], Controller] | None = None, *, tokenizer=None,
                 eos_token_ids: Sequence[int] | None = None, max_batch: int | None = None,
                 pricer: BatchPricer | None = None, probe_every: int = 16, prefill_chunk: int | None = None,
                 prefill_step_ms: float | None = None, max_scored_rows: int | None = None) -> None:
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ConfigError(f"prefill_chunk must be >= 1 (or None: whole prompts), got {prefill_chunk}")
        if prefill_step_ms is not None and not prefill_step_ms > 0:
            raise ConfigError(f"prefill_step_ms must be > 0 (or None: fixed chunks), got {prefill_step_ms}")
        if max_scored_rows is not None and max_scored_rows < 1:
            raise ConfigError(f"max_scored_rows must be >= 1, got {max_scored_rows}")
        self.target = target
        self.prefill = ChunkedPrefill(target, prefill_chunk, prefill_step_ms,
                                      max_scored_rows or score_rows(target.vocab_size))
        self.probe_every = probe_every
        self._priced_steps = 0
        self.max_batch = max_batch or target.max_sequences
        if not 1 <= self.max_batch <= target.max_sequences:
            raise ConfigError(f"max_batch must be in [1, {target.max_sequences}] for {target.name} (built for "
                              f"{target.max_sequences} sequences), got {self.max_batch}")
        self._drafter_for = drafter_for
        self._controller_factory = controller_factory or (lambda: FixedController(0))
        if drafter_for is None and self._controller_factory().next_k() != 0:
            raise ConfigError("a draft length K > 0 needs a drafter")
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(eos_token_ids) if eos_token_ids is not None else default_eos_ids(tokenizer)
        self.pricer = pricer or BatchPricer()
        self.draft_costs: dict[str, tuple[float, float]] = {}  # per drafter name: (draft, feed) ms per token, from
        # calibrate() and from the rows that finished; seeds each new row's controller (they belong to the machine)
        self._drafters: dict[tuple[Callable, int], Drafter | None] = {}
        # drafter_for functions whose per-slot draft caches outlive a request (a later request on the slot reuses
        # the shared prefix); every other row's draft caches are emptied when it leaves
        self.keep_draft_caches: set[Callable] = {drafter_for} if drafter_for is not None else set()
        self._free = list(range(self.max_batch))
        self._waiting: deque[Row] = deque()
        self._running: dict[int, Row] = {}
        self._next_id = 0
        self.last_cap: int | None = None  # the K cap of the last step (None: no row decoded)
        self.last_rows = 0  # rows in the last step's forward
        self.last_tokens = 0  # tokens in the last step's forward
        self.last_forward_ms = 0.0
        self.last_step_ms = 0.0  # wall time of the last step (catch-up, drafting, forward, verification)
        self.last_prefill_tokens = 0  # prompt tokens the last step prefilled (chunks), over all rows
        self.grammar_vocab: GrammarVocab | None = None  # built from the tokenizer on the first constrained request

    # Requests ------------------------------------------------------------------------------------------------
    def add(self, prompt_ids: Sequence[int], config: GenerationConfig | None = None, *,
            drafter_for: Callable[[int], Drafter | None] | None = None,
            controller_factory: Callable[[], Controller] | None = None) -> int:
        """Queue a request; it joins the batch at the next step with a free row. Returns its request id.

        ``drafter_for`` and ``controller_factory`` replace the engine's own for this request (same contracts as in
        the constructor; the drafters ``drafter_for`` builds are kept per sequence slot, keyed by the function).

        Raises:
            ContextLengthError: the prompt leaves no room for a new token in the context window (nothing queued).
            ConfigError: invalid settings (nothing queued).
        """
        cfg = config or GenerationConfig()
        req = RequestState.open(prompt_ids, cfg, self.target, self.eos_token_ids, self.tokenizer)
        if cfg.strict and self.max_batch > 1 and not self.target.rows_independent:
            raise ConfigError(f"strict mode in a batch needs a runtime whose rows do not mix; {self.target.name} "
                              f"({type(self.target).__name__}) changes a row's logits with the other rows: use "
                              "PyTorch, or max_batch 1")
        if cfg.strict is not None and cfg.strict != self.target.batch_invariant:
            raise ConfigError(f"this batch runs strict={self.target.batch_invariant}; a request cannot change it "
                              f"(asked strict={cfg.strict})")
        constraint = cfg.constraint
        req.grammar = RequestGrammar(self.compile(constraint).start()) if constraint is not None else None
        drafter_for = drafter_for or self._drafter_for
        controller_factory = controller_factory or self._controller_factory
        if drafter_for is None and controller_factory is not self._controller_factory \
                and controller_factory().next_k() != 0:
            raise ConfigError("a draft length K > 0 needs a drafter")
        req.stats.tree_fallback = "chains: batched rows verify chains" if cfg.tree_budget else ""
        if cfg.prompt_logprobs is not None:
            req.prompt_logprobs = [None]
        row = Row(self._next_id, req, time.perf_counter(), drafter_for, controller_factory)
        self._next_id += 1
        self._waiting.append(row)
        return row.rid

    def compile(self, constraint: Constraint):
        """``constraint`` compiled against the target's vocabulary (cached), as
        :meth:`SpeculativeEngine.compile <adaspec.engine.SpeculativeEngine.compile>` does.

        Raises:
            ConfigError: no tokenizer, or an invalid schema/regex/grammar (the message names the problem).
        """
        self.grammar_vocab = GrammarVocab.ensure(self.grammar_vocab, self.tokenizer, self.target.vocab_size,
                                                 self.eos_token_ids, "BatchEngine")
        return self.grammar_vocab.compile(constraint)

    def cancel(self, rid: int) -> bool:
        """Drop a request (waiting or running) before the next step; the other rows are untouched. Returns False
        when it is unknown or already finished."""
        for row in self._waiting:
            if row.rid == rid:
                self._waiting.remove(row)
                return True
        row = self._running.pop(rid, None)
        if row is None:
            return False
        self._release(row)
        return True

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def __bool__(self) -> bool:
        return bool(self._running or self._waiting)

    @property
    def max_scored_rows(self) -> int:
        """Positions whose logits one step keeps for prompt scoring, over all rows."""
        return self.prefill.max_scored_rows

    @max_scored_rows.setter
    def max_scored_rows(self, rows: int) -> None:
        self.prefill.max_scored_rows = rows

    @property
    def last_shared_tokens(self) -> int:
        """Prompt tokens the last step took from other rows' caches (:meth:`Backend.share_prefix`)."""
        return self.prefill.shared_tokens

    # The step ---------------------------------------------------------------------------------------------------
    def step(self) -> dict[int, StreamChunk]:
        """Admit waiting requests, run one batched step, and return each row's :class:`StreamChunk` by request id
        (a finished row's chunk carries its result, a failed row's its error; either way the row has left the
        batch)."""
        out: dict[int, StreamChunk] = {}

        def fail(row: Row, error: BaseException) -> None:
            self._fail(row, error, out)

        self._admit(fail)
        if not self._running:
            self.last_rows = self.last_tokens = 0
            return out
        step_start = time.perf_counter()
        decoding = [r for r in self._running.values() if r.prefilled]
        alone = not decoding
        waiting_on = len(self._running) > 1  # another row waits on this step's prefill and catch-up work
        ks = self._choose_k(decoding, fail)
        decoding = [r for r in decoding if r.rid in self._running]
        self.prefill.catch_up(decoding, ks, self.draft_costs, fail, step_start if waiting_on else None)
        decoding = [r for r in decoding if r.rid in self._running]
        drafts, draft_ms, behind, forced = draft_rows(decoding, ks, fail)
        decode_tokens = sum(len(drafts[r.rid]) + 1 for r in decoding if r.rid in self._running)
        plan = self.prefill.plan(self._running, self.prefill.budget(alone, decode_tokens, step_start), fail)
        running = [r for r in self._running.values() if r.prefilled or r.rid in plan]
        self.last_prefill_tokens = sum(end - start for start, end in plan.values())
        if not running:
            self.last_rows = self.last_tokens = 0
            return out
        rows = [self.prefill.batch_row(r, *plan[r.rid]) if not r.prefilled
                else BatchRow(r.seq, [r.ids[-1]] + in_vocab(drafts[r.rid].tokens, self.target.vocab_size),
                              len(drafts[r.rid]) + 1)
                for r in running]
        forward_start = time.perf_counter()
        logits = self._forward(running, rows, fail)
        forward_ms = (time.perf_counter() - forward_start) * 1e3
        self.last_rows, self.last_tokens = len(rows), sum(len(r.input_ids) for r in rows)
        self.last_forward_ms = forward_ms
        self.prefill.costs.forward(self.last_tokens, forward_ms, self.pricer.curve)
        for row, lg in zip(running, logits):
            if lg is None:
                continue  # failed in the forward
            try:
                if not row.prefilled:
                    if self.prefill.prefilled(row, plan[row.rid][1], lg):
                        out[row.rid] = self._first(row, lg[-1:])
                else:
                    out[row.rid] = self._advance(row, ks[row.rid], drafts[row.rid], lg, draft_ms[row.rid],
                                                 forward_ms, step_start, len(rows), behind[row.rid],
                                                 forced.get(row.rid, 0))
            except Exception as e:
                fail(row, e)
        self.last_step_ms = (time.perf_counter() - step_start) * 1e3
        return out

    def _admit(self, fail: Fail) -> None:
        """Move waiting requests into free sequence slots: each gets its slot's drafter, a fresh controller seeded
        with the batch's measured costs, and an empty cache."""
        while self._waiting and self._free:
            row = self._waiting.popleft()
            row.seq = self._free.pop(0)
            self._running[row.rid] = row
            try:
                slot = self._drafter(row.drafter_for, row.seq)
                row.drafter = unwrapped(slot)
                row.proposer = request_drafter(slot, row.req.grammar, row.cfg.forced_drafts)
                row.controller = row.controller_factory()
                row.controller.reset()
                if self.pricer.curve:  # the batch's measured costs, so a goodput row does not start from priors
                    row.controller.seed_verify_costs(self.pricer.curve, self.pricer.context_len,
                                                     level_from_steps=False)
                seeds = self._seeds_for(row.drafter)
                if seeds:  # its draft model's first proposal (and the prompt it feeds) is priced, not tried blind
                    row.controller.seed_draft_costs(seeds)
                row.stop_rule = row.controller.draft_stop()
                row.req.start = time.perf_counter()
                self.target.truncate_seq(row.seq, 0)
            except Exception as e:
                fail(row, e)

    def _forward(self, running: list[Row], rows: list[BatchRow], fail: Fail) -> list[torch.Tensor | None]:
        """The batched target forward; the rows that fail (alone) leave the batch (their logits are None)."""
        result: list[torch.Tensor | None] = []
        for row, res in zip(running, forward_isolated(self.target, rows)):
            if isinstance(res, BaseException):
                fail(row, res)
                result.append(None)
            else:
                result.append(res)
        return result

    def _fail(self, row: Row, error: BaseException, out: dict[int, StreamChunk]) -> None:
        """Take a failed row out of the batch; its chunk carries the error."""
        self._running.pop(row.rid, None)
        self._release(row)
        out[row.rid] = StreamChunk([], "", error=error)

    def _choose_k(self, decoding: list[Row], fail: Fail) -> dict[int, int]:
        """Each decoding row's K: its controller's, within its room, capped by the batch pricer (a row whose drafter
        choice or controller fails goes to ``fail``)."""
        ks = {}
        for row in decoding:
            room = row.req.room()
            try:  # the grammar's forced tokens, then the per-step drafter choice, as the engine
                row.forced = forced_first(row.proposer, row.controller, row.ids, room - 1)
                own = row.controller.next_k() if row.drafter is not None else 0
            except Exception as e:
                fail(row, e)
                continue
            ks[row.rid] = max(0, min(own, room - 1))
        estimates = []
        for r in decoding:
            if r.rid in ks:  # the row's controller's plan: its drafter's cost per token and any catch-up first
                planned = r.controller.planned if ks[r.rid] else (0.0, 0.0)
                estimates.append(RowEstimate(ks[r.rid], r.alpha, r.draft_ms if r.draft_ms is not None else planned[0],
                                             planned[1]))
        # One decoding row is the single-request case: its own controller already prices its forward; the batch
        # pricer (whose acceptance prior would keep a lone row from ever drafting) caps only real batches.
        cap = self.pricer.cap(estimates) if len(estimates) > 1 else None
        if cap is not None:
            self._priced_steps += 1
            if cap == 0 and self.probe_every and self._priced_steps % self.probe_every == 0:
                cap = self.pricer.probe_cap(estimates)  # a probe: acceptance is only learned by drafting
        self.last_cap = cap
        return {rid: min(k, cap) for rid, k in ks.items()} if cap is not None else ks

    def forget_drafters(self, drafter_for: Callable[[int], Drafter | None]) -> None:
        """Drop the per-slot drafters built by ``drafter_for`` (a row running with one keeps it until it ends)."""
        for key in [k for k in self._drafters if k[0] == drafter_for]:
            del self._drafters[key]
        self.keep_draft_caches.discard(drafter_for)

    def _drafter(self, drafter_for: Callable[[int], Drafter | None] | None, seq: int) -> Drafter | None:
        if drafter_for is None:
            return None
        key = (drafter_for, seq)
        if key not in self._drafters:
            self._drafters[key] = drafter_for(seq)
        return self._drafters[key]

    def _first(self, row: Row, logits: torch.Tensor) -> StreamChunk:
        """The prefill's token from the last prompt position's ``[1, V]`` logits: TTFT, then the drafter's
        prefill."""
        new, finish, lp = row.req.first(logits)
        row.prefilled = True
        drafter = row.drafter
        if drafter is not None and finish is None:
            if row.cfg.cache_partition is not None:
                drafter.set_partition(row.cfg.cache_partition)
            drafter.prefill(row.prompt)
            drafter.set_controls(row.req.controls, len(row.prompt))
            # a draft cache kept from a request before
            row.controller.set_synced(cached_prefixes(drafter, row.ids), catch_up_limits(drafter))
        chunk = self._chunk(row, new, finish, lp)
        chunk.prompt_logprobs = row.req.prompt_logprobs
        return chunk

    def _advance(self, row: Row, k: int, draft: Draft, logits: torch.Tensor, draft_ms: float, forward_ms: float,
                 step_start: float, batch: int, behind: int = 0, n_forced: int = 0) -> StreamChunk:
        """Verify one row's drafts on its logits (masked by its grammar, if any), cut its cache back, record the
        step (its controller sees it without the grammar's forced drafts)."""
        t = time.perf_counter()
        n_accepted, token, logits = row.req.verify(logits, draft, in_vocab(draft.tokens, self.target.vocab_size))
        self.target.truncate_seq(row.seq, len(row.ids) + n_accepted)
        new, finish, lp = row.req.emit(draft.tokens[:n_accepted].tolist() + [token], logits)
        verify_ms = forward_ms + (time.perf_counter() - t) * 1e3
        step = StepRecord(k=k, drafted=len(draft), accepted=n_accepted, emitted=len(new),
                          context_len=len(row.ids) - len(new), draft_ms=draft_ms, verify_ms=verify_ms,
                          total_ms=(time.perf_counter() - step_start) * 1e3, drafter=draft.source or (
                              row.proposer.name if len(draft) else ""), batch=batch)
        row.req.stats.record(step)
        own = without_forced(step, n_forced)  # the wrapped drafter's step: what its controller and the pricer see
        row.controller.update(own)
        if own.drafted:
            row.alpha = 0.8 * row.alpha + 0.2 * (own.accepted / own.drafted)
        if own.drafted and behind <= 2:  # a draft model that sat out (or starts) first feeds what it missed
            per_token = draft_ms / own.drafted
            row.draft_ms = per_token if row.draft_ms is None else 0.8 * row.draft_ms + 0.2 * per_token
        return self._chunk(row, new, finish, lp)

    def _chunk(self, row: Row, new: list[int], finish: str | None,
               logprobs: list[TokenLogprob] | None = None) -> StreamChunk:
        if finish is None:  # cut() sets a finish reason at max_new_tokens and at the context window
            return row.req.chunk(new, logprobs)
        if row.drafter is not None and row.req.stats.steps:  # ended normally after the drafter's prefill
            row.drafter.finish(row.ids)
        chunk = row.req.finished(finish, new, logprobs)
        del self._running[row.rid]
        self._release(row)
        return chunk

    def _seeds_for(self, drafter: Drafter | None) -> dict[str, tuple[float, float]]:
        """The measured costs of ``drafter``'s own draft models (only those: a controller prices every drafter it
        is seeded with as a candidate for its steps)."""
        if drafter is None or not self.draft_costs:
            return {}
        return {name: self.draft_costs[name] for name in model_drafters(drafter) if name in self.draft_costs}

    def _learn(self, costs: dict[str, tuple[float, float]]) -> None:
        """Keep valid ``{name: (draft_ms, feed_ms)}`` per token (draft_ms > 0, feed_ms >= 0) as :attr:`draft_costs`."""
        self.draft_costs.update({name: (float(d), float(f)) for name, (d, f) in costs.items() if d > 0 and f >= 0})

    def _release(self, row: Row) -> None:
        if row.drafter is not None and row.controller is not None:  # its draft models' measured costs price the
            try:  # next rows' first proposals
                own = model_drafters(row.drafter)
                self._learn({name: c for name, c in row.controller.draft_costs().items() if name in own})
            except Exception:  # bookkeeping only: never fail a release
                pass
        try:
            self.target.truncate_seq(row.seq, 0)  # free its cache now (a shared cache serves the other rows)
        except Exception:  # a broken runtime: the next request on this row truncates again
            pass
        if row.drafter is not None and row.drafter_for not in self.keep_draft_caches:
            for d in model_drafters(row.drafter).values():  # its draft KV goes with it
                try:
                    d.forget()
                except Exception:  # a broken draft runtime: its next _sync starts from an empty cache anyway
                    pass
        self._free.append(row.seq)
        self._free.sort()

    # Convenience --------------------------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]],
                 config: GenerationConfig | Sequence[GenerationConfig] | None = None) -> list[GenerationResult]:
        """Run ``prompts`` to completion through the batch (at most ``max_batch`` at once, the rest joining as rows
        free up); results in the prompts' order."""
        configs = list(config) if isinstance(config, Sequence) else [config] * len(prompts)
        if len(configs) != len(prompts):
            raise ConfigError(f"{len(prompts)} prompts but {len(configs)} configs")
        rids = [self.add(p, c) for p, c in zip(prompts, configs)]
        results: dict[int, GenerationResult] = {}
        while len(results) < len(rids):
            for rid, chunk in self.step().items():
                if chunk.error is not None:
                    for other in rids:
                        self.cancel(other)
                    raise chunk.error
                if chunk.result is not None:
                    results[rid] = chunk.result
        return [results[r] for r in rids]

    def calibrate(self, drafter_for: Callable[[int], Drafter | None] | None = None, **kwargs) -> dict[int, float]:
        """Measure the target's cost curve for the batch pricer (:meth:`BatchPricer.calibrate`) on sequence 0,
        which must be idle, and the draft and catch-up cost per token of every draft model of sequence 0's drafter
        (``drafter_for``, default the engine's own; :func:`~adaspec.drafters.multi.measure_drafters`), with which
        each new row's controller is seeded (:attr:`draft_costs`). Returns the target's curve ({n: ms})."""
        if self._running:
            raise RuntimeError("calibrate with no request running")
        curve = self.pricer.calibrate(self.target, self.max_batch, **kwargs)
        drafter_for = drafter_for or self._drafter_for
        drafter = self._drafter(drafter_for, 0) if drafter_for is not None else None
        if drafter is not None:
            self._learn(measure_drafters(drafter))
        return curve
