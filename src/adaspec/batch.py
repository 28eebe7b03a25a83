"""Batched speculative decoding with continuous batching: B sequences advance per step over ONE target forward.

Each step (as in vLLM's scheduler and llama.cpp's server slots):

1. rows that joined are prefilled in the same forward as the others' decoding, by chunks of at most
   ``prefill_chunk`` prompt tokens per step over all joining rows (chunked prefill, as vLLM and llama.cpp's server
   do), so a long prompt delays the decoding rows by one chunk's forward per step, not by its whole prefill, and a
   cancellation or deadline takes effect between chunks; a draft model that must catch up with a long sequence
   is fed by chunks of the same size between steps (the row drafts nothing until it has caught up). With
   ``prefill_step_ms`` the chunks are sized by time instead: from the measured cost per token of the step's
   forward, a step that carries prefill or catch-up while other rows decode aims at that wall time. A row whose
   prompt begins like an earlier row's takes that row's cached prefix (:meth:`Backend.share_prefix`, e.g. the
   ``n`` choices of one request) instead of prefilling it again. A scored
   prompt (``prompt_logprobs``) is prefilled in chunks of at most ``max_scored_rows`` positions per step, each
   scored before the next, so its ``[len(prompt), V]`` logits are never held at once;
2. every decoding row asks its own controller for K, the :class:`~adaspec.controllers.batch.BatchPricer` caps K for
   the batch from the measured cost of the batch's total tokens, and the row's own drafter proposes; draft models
   draft for all rows at once (batched drafting: each draft step is one forward of the multi-sequence draft backend
   over every row still drafting, through :meth:`Drafter.proposal`);
3. the target runs once over every row's ``[pending] + drafts`` (:meth:`Backend.forward_batch`, one sequence id per
   row), each row is verified on its own logits (greedy or speculative sampling, exactly as
   :class:`~adaspec.engine.SpeculativeEngine` does), and each row's cache is cut back to its own length;
4. finished and cancelled rows leave, freeing their sequence for the next request.

Each row keeps its own drafter (a model drafter runs on its own sequence of the draft backend), controller, sampler,
stop conditions and statistics, so a row's output does not depend on the other rows except through the kernels:
in strict mode it is the output of the request alone (PyTorch's strict mode runs the rows one after another; the
GGUF runtimes refuse strict rows in a batch where their kernels mix rows).
A request may bring its own drafter and controller (the server's per-request ``speculation``).

A row with a grammar (structured output) is constrained as a request alone is (:class:`~adaspec.constrained.
RequestGrammar`): its drafts are cut where the grammar rejects them before the batched forward, each of its
verified positions is masked by the grammar after the accepted prefix, its grammar state rolls back with its cache,
and the grammar's forced tokens are drafted for it (:class:`~adaspec.drafters.forced.ForcedDrafter`).

A row that fails (its drafter raises, or the runtime rejects its tokens) leaves the batch with the error in its chunk;
the other rows go on: when the batched forward fails, the rows are rolled back and run one by one to find the one at
fault.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from adaspec.backends.base import Backend, BatchRow, SequenceView
from adaspec.controllers.base import Controller
from adaspec.controllers.batch import BatchPricer, RowEstimate
from adaspec.chunking import MIN_PREFILL_CHUNK, StepCosts, common_prefix
from adaspec.constrained import RequestGrammar
from adaspec.controllers.fixed import FixedController
from adaspec.drafters.base import Draft, Drafter, DraftStop, empty_draft
from adaspec.drafters.forced import ForcedDrafter, request_drafter, unwrapped, without_forced
from adaspec.drafters.multi import cached_prefixes, measure_drafters, model_drafters, route
from adaspec.logprobs import score_rows, token_logprobs
from adaspec.request_state import RequestState
from adaspec.request import GenerationConfig, GenerationResult, StreamChunk, TokenLogprob, default_eos_ids
from adaspec.errors import ConfigError
from adaspec.stats import StepRecord
from adaspec.structured import Constraint, GrammarVocab
from adaspec.verify import in_vocab

@dataclass
class _Row:
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

    @property
    def prompt(self) -> list[int]:
        return self.req.prompt

    @property
    def cfg(self) -> GenerationConfig:
        return self.req.cfg

    @property
    def ids(self) -> list[int]:
        return self.req.ids


def _sequence_of(backend: Backend) -> tuple[Backend, int]:
    """(the multi-sequence backend, sequence id) a single-sequence view runs on; a backend itself is sequence 0."""
    if isinstance(backend, SequenceView):
        return backend.parent, backend.seq
    return backend, 0


def _forward_isolated(backend: Backend, rows: list[BatchRow]) -> list[torch.Tensor | BaseException]:
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
        self.prefill_chunk = prefill_chunk
        self.prefill_step_ms = prefill_step_ms
        self._step_costs = StepCosts()
        self.max_scored_rows = max_scored_rows or score_rows(target.vocab_size)
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
        self._waiting: deque[_Row] = deque()
        self._running: dict[int, _Row] = {}
        self._next_id = 0
        self.last_cap: int | None = None  # the K cap of the last step (None: no row decoded)
        self.last_rows = 0  # rows in the last step's forward
        self.last_tokens = 0  # tokens in the last step's forward
        self.last_forward_ms = 0.0
        self.last_step_ms = 0.0  # wall time of the last step (catch-up, drafting, forward, verification)
        self.last_prefill_tokens = 0  # prompt tokens the last step prefilled (chunks), over all rows
        self.last_shared_tokens = 0  # prompt tokens the last step took from other rows' caches (share_prefix)
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
        row = _Row(self._next_id, req, time.perf_counter(), drafter_for, controller_factory)
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

    # The step ---------------------------------------------------------------------------------------------------
    def step(self) -> dict[int, StreamChunk]:
        """Admit waiting requests, run one batched step, and return each row's :class:`StreamChunk` by request id
        (a finished row's chunk carries its result, a failed row's its error; either way the row has left the
        batch)."""
        out: dict[int, StreamChunk] = {}
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
                self._fail(row, e, out)
        if not self._running:
            self.last_rows = self.last_tokens = 0
            return out
        step_start = time.perf_counter()
        decoding = [r for r in self._running.values() if r.prefilled]
        alone = not decoding
        waiting_on = len(self._running) > 1  # another row waits on this step's prefill and catch-up work
        ks = self._choose_k(decoding, out)
        decoding = [r for r in decoding if r.rid in self._running]
        self._catch_up(decoding, ks, out, step_start if waiting_on else None)
        decoding = [r for r in decoding if r.rid in self._running]
        drafts, draft_ms, behind, forced = self._draft(decoding, ks, out)
        decode_tokens = sum(len(drafts[r.rid]) + 1 for r in decoding if r.rid in self._running)
        plan = self._plan_prefill(self._prefill_budget(alone, decode_tokens, step_start), out)
        running = [r for r in self._running.values() if r.prefilled or r.rid in plan]
        self.last_prefill_tokens = sum(end - start for start, end in plan.values())
        if not running:
            self.last_rows = self.last_tokens = 0
            return out
        rows = [self._prefill_row(r, *plan[r.rid]) if not r.prefilled
                else BatchRow(r.seq, [r.ids[-1]] + in_vocab(drafts[r.rid].tokens, self.target.vocab_size),
                              len(drafts[r.rid]) + 1)
                for r in running]
        forward_start = time.perf_counter()
        logits = self._forward(running, rows, out)
        forward_ms = (time.perf_counter() - forward_start) * 1e3
        self.last_rows, self.last_tokens = len(rows), sum(len(r.input_ids) for r in rows)
        self.last_forward_ms = forward_ms
        self._step_costs.forward(self.last_tokens, forward_ms, self.pricer.curve)
        for row, lg in zip(running, logits):
            if lg is None:
                continue  # failed in the forward
            try:
                if not row.prefilled:
                    chunk = self._prefilled(row, plan[row.rid][1], lg)
                    if chunk is not None:
                        out[row.rid] = chunk
                else:
                    out[row.rid] = self._advance(row, ks[row.rid], drafts[row.rid], lg, draft_ms[row.rid],
                                                 forward_ms, step_start, len(rows), behind[row.rid],
                                                 forced.get(row.rid, 0))
            except Exception as e:
                self._fail(row, e, out)
        self.last_step_ms = (time.perf_counter() - step_start) * 1e3
        return out

    # Chunked prefill ------------------------------------------------------------------------------------------------
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

    def _draft(self, decoding: list[_Row], ks: dict[int, int], out: dict[int, StreamChunk]
               ) -> tuple[dict[int, Draft], dict[int, float], dict[int, int], dict[int, int]]:
        """Every decoding row's proposal (:meth:`Drafter.proposal`), with batched drafting: in each round, the rows
        whose draft model needs a forward of the same multi-sequence draft backend go into one ``forward_batch``
        (row ``i``'s draft model runs on sequence ``seq_i``), so K draft steps of B rows cost K batched forwards, not
        B·K. A row with a grammar proposes its forced tokens on top of its K
        (:meth:`ForcedDrafter.free_proposal`), and its draft is cut where the grammar rejects it. Returns the
        drafts, each row's draft time in ms (its own work plus an equal share of every forward it was in), the
        tokens each row's first forward fed (> 2: a catch-up, not the per-token cost) and each row's forced
        tokens."""
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
                feeds[rid] = (*_sequence_of(backend), list(tokens))
                behind.setdefault(rid, len(tokens))
            except StopIteration as done:
                row = rows[rid]
                draft = done.value
                if isinstance(row.proposer, ForcedDrafter):
                    draft, forced[rid] = draft
                drafts[rid] = draft if row.req.grammar is None else row.req.grammar.cut(draft)
            except Exception as e:
                self._fail(rows[rid], e, out)
            draft_ms[rid] += (time.perf_counter() - t) * 1e3

        for row in decoding:
            k = ks[row.rid]
            if isinstance(row.proposer, ForcedDrafter):  # forced tokens on top of K, within the row's room
                proposals[row.rid] = row.proposer.free_proposal(row.ids, k, row.req.room() - 1, row.req.params,
                                                                row.req.generator, row.stop_rule)
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
                results = _forward_isolated(parent, [BatchRow(feeds[r][1], feeds[r][2], 1) for r in rids])
                share = (time.perf_counter() - t) * 1e3 / len(rids)
                for rid, res in zip(rids, results):
                    draft_ms[rid] += share
                    if isinstance(res, BaseException):
                        advance(rid, error=res)
                    else:
                        advance(rid, logits=res[-1])
        return drafts, draft_ms, {rid: behind.get(rid, 0) for rid in draft_ms}, forced

    def _forward(self, running: list[_Row], rows: list[BatchRow],
                 out: dict[int, StreamChunk]) -> list[torch.Tensor | None]:
        """The batched target forward; the rows that fail (alone) leave the batch (their logits are None)."""
        result: list[torch.Tensor | None] = []
        for row, res in zip(running, _forward_isolated(self.target, rows)):
            if isinstance(res, BaseException):
                self._fail(row, res, out)
                result.append(None)
            else:
                result.append(res)
        return result

    def _fail(self, row: _Row, error: BaseException, out: dict[int, StreamChunk]) -> None:
        """Take a failed row out of the batch; its chunk carries the error."""
        self._running.pop(row.rid, None)
        self._release(row)
        out[row.rid] = StreamChunk([], "", error=error)

    def _choose_k(self, decoding: list[_Row], out: dict[int, StreamChunk]) -> dict[int, int]:
        ks = {}
        for row in decoding:
            room = row.req.room()
            try:
                route(row.drafter, row.controller, row.ids)  # per-step drafter choice (MultiDrafter), as the engine
                own = row.controller.next_k() if row.drafter is not None else 0
            except Exception as e:
                self._fail(row, e, out)
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

    def _first(self, row: _Row, logits: torch.Tensor) -> StreamChunk:
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
            row.controller.set_synced(cached_prefixes(drafter, row.ids))  # a draft cache kept from a request before
        chunk = self._chunk(row, new, finish, lp)
        chunk.prompt_logprobs = row.req.prompt_logprobs
        return chunk

    def _advance(self, row: _Row, k: int, draft: Draft, logits: torch.Tensor, draft_ms: float, forward_ms: float,
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

    def _chunk(self, row: _Row, new: list[int], finish: str | None,
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

    def _release(self, row: _Row) -> None:
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
