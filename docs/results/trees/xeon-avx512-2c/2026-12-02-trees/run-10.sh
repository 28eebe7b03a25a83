#!/bin/bash
# Issue 14, 2026-12-02 (evening, Intel Xeon, 2 threads, alone on the cores): run-8.sh's prompt-lookup trees on the
# default runtime again, after the chain/tree chooser became one per engine (kept across requests) instead of one per
# request. Same settings as run-8.sh (code edits, 8 prompts, 128 tokens), the methods that show the chooser.
# Usage: run-10.sh [SUFFIX].
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
A=".venv/bin/adaspec"; OUT=docs/results/issue14/xeon-avx512; S="${1:-}"
$A compare --target qwen2.5-coder-1.5b-instruct@ik --threads 2 \
  --methods plain,ngram-tree/goodput,ngram-tree/goodput+tree:12,ngram-tree/fixed:4,ngram-tree/fixed:4+tree:8 \
  --workloads code-edit --limit 2 --max-new-tokens 128 --temperatures 0 --time-limit 20 \
  --out $OUT/ngram-tree-ik-kept$S.jsonl > $OUT/ngram-tree-ik-kept$S-log.txt 2>&1
.venv/bin/python docs/results/issue14/tree_table.py $OUT/ngram-tree-ik-kept$S.jsonl > $OUT/ngram-tree-ik-kept$S-table.md
.venv/bin/python docs/results/issue14/per_category.py $OUT/ngram-tree-ik-kept$S.jsonl \
  > $OUT/ngram-tree-ik-kept$S-categories.md
