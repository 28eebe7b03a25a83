#!/bin/bash
# Issue 14, 2026-12-02 (the Intel Xeon session): run-7.sh's settings, with the chains of the tree drafter itself.
# `ngram-tree` chains look up 4-token suffixes (`ngram`: 3), so `ngram/...` is not the chain a tree method contains;
# `ngram-tree/goodput` and `ngram-tree/fixed:4` are. Trees against the chains of the same drafter and controller.
# Run three times (suffixes "", -2, -3): the first before the review fixes of the same day, -2 and -3 with them.
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
A=".venv/bin/adaspec"; OUT=docs/results/issue14/xeon-avx512; S="${1:-}"
mkdir -p $OUT
$A compare --target qwen2.5-coder-1.5b-instruct@ik --threads 2 \
  --methods plain,ngram/goodput,ngram-tree/goodput,ngram-tree/goodput+tree:12,ngram-tree/fixed:4,ngram-tree/fixed:4+tree:8 \
  --workloads code-edit --limit 2 --max-new-tokens 128 --temperatures 0 --time-limit 20 \
  --out $OUT/ngram-tree-ik-samechain$S.jsonl --report $OUT/ngram-tree-ik-samechain$S.md \
  > $OUT/ngram-tree-ik-samechain$S-log.txt 2>&1
.venv/bin/python docs/results/issue14/tree_table.py $OUT/ngram-tree-ik-samechain$S.jsonl \
  > $OUT/ngram-tree-ik-samechain$S-table.md
.venv/bin/python docs/results/issue14/per_category.py $OUT/ngram-tree-ik-samechain$S.jsonl \
  > $OUT/ngram-tree-ik-samechain$S-categories.md
