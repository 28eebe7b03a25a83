#!/usr/bin/env bash
# Issue 38 measurements (docs/structured.md): the structured workload (9 tasks: 3 signature extractions, 3 GSM8K
# JSON answers, 3 forced tool calls), greedy, ik_llama.cpp, 2 threads, qwen2.5-coder-1.5b-instruct target, default
# drafter (prompt lookup + qwen2.5-coder-0.5b-instruct). Four methods: constrained plain, speculative (default, with
# grammar-forced drafts), speculative without forced drafts, forced drafts alone. About 5-8 minutes on a quiet
# machine. Appends to results.jsonl and resumes where it stopped; writes results.md.
set -euo pipefail
cd "$(dirname "$0")/../../.."
${PYTHON:-.venv/bin/python} docs/results/structured/bench.py --backend ik --threads 2 --limit "${LIMIT:-9}" \
    --max-new-tokens "${MAX_NEW_TOKENS:-160}" \
    --out docs/results/structured/results.jsonl --report docs/results/structured/results.md "$@"
