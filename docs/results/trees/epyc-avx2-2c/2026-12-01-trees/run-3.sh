#!/bin/bash
# Issue 14, 2026-12-01 (late): prompt-lookup trees on the default runtime (ik_llama.cpp, the 1.5B Q4_K_M target),
# which verifies trees since this date (branches as sequences sharing the prefix's cells). Code edits, two prompts
# per category (8), 128 greedy tokens, 2 threads, methods interleaved per prompt, nothing else running.
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
A=".venv/bin/adaspec"; OUT=docs/results/issue14
$A compare --target qwen2.5-coder-1.5b-instruct@ik --threads 2 \
  --methods plain,ngram/fixed:4,ngram-tree/fixed:4+tree:8:always,ngram-tree/fixed:4+tree:8,ngram/goodput,ngram-tree/goodput+tree:12 \
  --workloads code-edit --limit 2 --max-new-tokens 128 --temperatures 0 --time-limit 20 \
  --out $OUT/ngram-tree-ik.jsonl --report $OUT/ngram-tree-ik.md > $OUT/ngram-tree-ik-log.txt 2>&1
.venv/bin/python $OUT/tree_table.py $OUT/ngram-tree-ik.jsonl > $OUT/ngram-tree-ik-table.md
