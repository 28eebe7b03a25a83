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

from adaspec.batch.engine import BatchEngine

__all__ = ["BatchEngine"]
