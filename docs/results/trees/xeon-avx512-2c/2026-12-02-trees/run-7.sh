#!/bin/bash
# Issue 14, 2026-12-02 (the Intel Xeon session): run-6.sh's settings (default target on ik_llama.cpp, code edits,
# 2 prompts per category, 128 greedy tokens, methods interleaved, 2 threads, nothing else running) with the chooser
# that prices, on every chain step, the prompt-lookup tree it could have verified (TreeChoice what_if): chains run
# first and trees are tried only while one could pay. Results in xeon-avx512/. Run twice, before the review fixes
# of the same day: suffix -upper (deeper branch nodes counted as all accepted) and no suffix (counted at the chains'
# acceptance rate). Their ngram/... chains look up 3-token suffixes, ngram-tree's 4: run-8.sh compares like with like.
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
A=".venv/bin/adaspec"; OUT=docs/results/issue14/xeon-avx512; S="${1:-}"
mkdir -p $OUT
$A compare --target qwen2.5-coder-1.5b-instruct@ik --threads 2 \
  --methods plain,ngram/fixed:4,ngram-tree/fixed:4+tree:8,ngram/goodput,ngram-tree/goodput+tree:12 \
  --workloads code-edit --limit 2 --max-new-tokens 128 --temperatures 0 --time-limit 20 \
  --out $OUT/ngram-tree-ik-whatif$S.jsonl --report $OUT/ngram-tree-ik-whatif$S.md \
  > $OUT/ngram-tree-ik-whatif$S-log.txt 2>&1
.venv/bin/python docs/results/issue14/tree_table.py $OUT/ngram-tree-ik-whatif$S.jsonl \
  > $OUT/ngram-tree-ik-whatif$S-table.md
