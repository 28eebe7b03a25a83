#!/bin/bash
# Issue 14, 2026-12-01 (evening): trees re-measured after the fix that lets compare's prompt cache pass trees
# through (PrefixCacheBackend hid the target's tree support, so every "+tree" method of compare before this date
# verified chains: tree-choice.jsonl and code-edit-torch-fp32.jsonl have no tree step). PyTorch fp32, greedy,
# 2 threads, nothing else running, methods interleaved per prompt.
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
A=".venv/bin/adaspec"; OUT=docs/results/issue14
# 1. Prompt-lookup trees (several matches with different continuations as branches) vs the n-gram chain, code
#    edits, Qwen2.5-Coder-0.5B target, one prompt per category, 128 tokens.
$A compare --target qwen2.5-coder-0.5b-instruct@torch --dtype float32 --threads 2 \
  --methods plain,ngram/fixed:4,ngram-tree/fixed:4+tree:8:always,ngram-tree/fixed:4+tree:8,ngram/goodput,ngram-tree/goodput+tree:12 \
  --workloads code-edit --limit 1 --max-new-tokens 128 --temperatures 0 --time-limit 9 \
  --out $OUT/ngram-tree-2.jsonl --report $OUT/ngram-tree-2.md > $OUT/ngram-tree-2-log.txt 2>&1
# 2. Trees from the draft model (its chain plus the tokens it ranks next as sibling leaves) vs its chain: 1.5B
#    target, 0.5B draft, fixed K = 4, budget 6 always verified as a tree; 64 tokens (about 40 s per generation at
#    this size in fp32 on 2 cores), at most 8 minutes.
$A compare --target qwen2.5-coder-1.5b-instruct@torch --draft qwen2.5-coder-0.5b-instruct@torch --dtype float32 \
  --threads 2 --methods plain,fixed:4,fixed:4+tree:6:always \
  --workloads humaneval,code-edit --limit 1 --max-new-tokens 64 --temperatures 0 --time-limit 8 \
  --out $OUT/draft-tree-torch-fp32.jsonl --report $OUT/draft-tree-torch-fp32.md > $OUT/draft-tree-log.txt 2>&1
