#!/usr/bin/env bash
# Issue 38 measurements (docs/structured.md), greedy, ik_llama.cpp, 2 threads, qwen2.5-coder-1.5b-instruct target,
# default drafter (prompt lookup + qwen2.5-coder-0.5b-instruct). Both parts append to their JSONL, resume where they
# stopped and write their markdown table. PART=single or PART=batch runs one part only (default: both).
#
# 1. bench.py (about 5-8 minutes on a quiet machine): the structured workload (9 tasks: 3 signature extractions,
#    3 GSM8K JSON answers, 3 forced tool calls), four methods: constrained plain, speculative (default, with
#    grammar-forced drafts), speculative without forced drafts, forced drafts alone -> results.jsonl, results.md.
# 2. batch.py (an estimated 4-5 minutes, not yet timed): 6 tasks through the batch engine at batch sizes 1, 2 and 4, constrained
#    plain and speculative -> batch.jsonl, batch.md.
set -euo pipefail
cd "$(dirname "$0")/../../.."
PART="${PART:-all}"
if [[ "$PART" == all || "$PART" == single ]]; then
    ${PYTHON:-.venv/bin/python} docs/results/structured/bench.py --backend ik --threads 2 --limit "${LIMIT:-9}" \
        --max-new-tokens "${MAX_NEW_TOKENS:-160}" \
        --out docs/results/structured/results.jsonl --report docs/results/structured/results.md "$@"
fi
if [[ "$PART" == all || "$PART" == batch ]]; then
    ${PYTHON:-.venv/bin/python} docs/results/structured/batch.py --backend ik --threads 2 \
        --limit "${BATCH_LIMIT:-6}" --max-new-tokens "${BATCH_MAX_NEW_TOKENS:-64}" --batches "${BATCHES:-1,2,4}" \
        --out docs/results/structured/batch.jsonl --report docs/results/structured/batch.md
fi
