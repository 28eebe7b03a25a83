#!/bin/bash
# Issue 14, 2026-12-01 (late): run-2.sh step 1 (prompt-lookup trees on PyTorch fp32, Qwen2.5-Coder-0.5B target, one
# code-edit prompt per category, 128 tokens) repeated with the paired chain/tree chooser.
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
A=".venv/bin/adaspec"; OUT=docs/results/issue14
$A compare --target qwen2.5-coder-0.5b-instruct@torch --dtype float32 --threads 2 \
  --methods plain,ngram/fixed:4,ngram-tree/fixed:4+tree:8,ngram/goodput,ngram-tree/goodput+tree:12 \
  --workloads code-edit --limit 1 --max-new-tokens 128 --temperatures 0 --time-limit 9 \
  --out $OUT/ngram-tree-torch-paired.jsonl --report $OUT/ngram-tree-torch-paired.md \
  > $OUT/ngram-tree-torch-paired-log.txt 2>&1
.venv/bin/python $OUT/tree_table.py $OUT/ngram-tree-torch-paired.jsonl > $OUT/ngram-tree-torch-paired-table.md
