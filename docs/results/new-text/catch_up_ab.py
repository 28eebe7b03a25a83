"""The draft model's bounded catch-up (``ModelDrafter.catch_up``: a draft model that lags the sequence by more than N
tokens restarts its cache from the sequence's last N, so a long prompt costs it N tokens to feed, not the whole
prompt) at none (the whole sequence), 32 and 128 tokens, alternated per prompt with plain decoding in one process:
make demo's prompt, the last 3 Spec-Bench coding and writing prompts, 3 GSM8K, 2 HumanEval and 2 code-edit prompts
(``--held-out``: arms none, 64 and 128 on the first 3 Spec-Bench coding and writing prompts, GSM8K 3-6, HumanEval
2-4 and code edits 2-4, no demo prompt), 128 tokens, greedy, the default drafter and controller, two passes (the arms' order rotates per prompt and pass).
Each request reads and writes its own suffix-cache partition, and every draft model forgets its cache before each
request, so no arm finds the prompt already fed by another.

    PYTHONPATH=src python docs/results/new-text/catch_up_ab.py rows.jsonl     # from the repository root, quiet
    PYTHONPATH=src python docs/results/new-text/catch_up_ab.py --held-out rows.jsonl
    python docs/results/new-text/catch_up_ab.py --summary rows.jsonl
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from min_gain_ab import run, summary  # noqa: E402  (the same A/B with other arms)

ARMS = {"full": {}, "cu32": {"catch_up": 32}, "cu128": {"catch_up": 128}}
WORKLOADS = (("specbench:coding", -3), ("specbench:writing", -3), ("gsm8k", 3), ("humaneval", 2), ("code-edit", 2))
HELD_OUT_ARMS = {"full": {}, "cu64": {"catch_up": 64}, "cu128": {"catch_up": 128}}
HELD_OUT = (("specbench:coding", 3), ("specbench:writing", 3), ("gsm8k", (3, 6)), ("humaneval", (2, 4)),
            ("code-edit", (2, 4)))

if __name__ == "__main__":
    if sys.argv[1] == "--summary":
        summary(sys.argv[2])
    elif sys.argv[1] == "--held-out":
        run(sys.argv[2], HELD_OUT_ARMS, HELD_OUT, forget=True, demo=False)
    else:
        run(sys.argv[1], ARMS, WORKLOADS, forget=True)
