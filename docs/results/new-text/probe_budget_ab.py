"""The goodput controller's cap on a probe's catch-up (``GoodputConfig.probe_budget``: a probe may feed its draft
model the tokens it lacks for at most probe_budget plain steps' time, and at most ``probe_share`` of the request's time
so far) at 8 and 32 plain steps, alternated per prompt with plain decoding in one process: make demo's prompt, the
last 3 Spec-Bench coding and writing prompts, 3 GSM8K, 2 HumanEval and 2 code-edit prompts, 128 tokens, greedy, the
default drafter, two passes (the arms' order rotates per prompt and pass). Each request reads and writes its own
suffix-cache partition, so no arm drafts from another's answers, and every draft model forgets its cache before each
request, so no arm finds the prompt already fed by another.

    PYTHONPATH=src python docs/results/new-text/probe_budget_ab.py rows.jsonl     # from the repository root, quiet
    python docs/results/new-text/probe_budget_ab.py --summary rows.jsonl
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from min_gain_ab import run, summary  # noqa: E402  (the same A/B with other arms)

ARMS = {"pb8": {"probe_budget": 8.0}, "pb32": {"probe_budget": 32.0}}
WORKLOADS = (("specbench:coding", -3), ("specbench:writing", -3), ("gsm8k", 3), ("humaneval", 2), ("code-edit", 2))

if __name__ == "__main__":
    if sys.argv[1] == "--summary":
        summary(sys.argv[2])
    else:
        run(sys.argv[1], ARMS, WORKLOADS, forget=True)
