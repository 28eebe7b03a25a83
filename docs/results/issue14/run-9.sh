#!/bin/bash
# Issue 14, 2026-12-02 (evening, Intel Xeon, AVX-512/AMX, 2 threads, alone on the cores): draft-model trees grown
# level by level (EAGLE-2: the 4 best nodes of each level expanded by one draft forward, `expand=4`, the default on
# PyTorch drafts) against one-level trees (the draft's chain plus sibling leaves, `expand=0`) and the chain.
# PyTorch bf16, Qwen2.5-Coder-1.5B target, 0.5B draft. Step 1 greedy, step 2 sampled (T = 0.7: grown trees draw their
# children from the draft and are verified with the q-aware multi-draft rule; one-level trees are deterministic and
# verified with one-hot q). Usage: run-9.sh [SUFFIX] (reruns resume).
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
A=".venv/bin/adaspec"; OUT=docs/results/issue14/xeon-avx512; S="${1:-}"
mkdir -p $OUT
for W in "code-edit 1" "humaneval 4"; do
  set -- $W
  $A compare --target qwen2.5-coder-1.5b-instruct@torch --draft qwen2.5-coder-0.5b-instruct@torch --dtype bfloat16 \
    --threads 2 --workloads $1 --limit $2 --max-new-tokens 96 --temperatures 0 --time-limit 12 \
    --methods plain,fixed:4,fixed:4+tree:8:always:expand=0,fixed:4+tree:8:always,fixed:6+tree:16:always,goodput,goodput+tree:12 \
    --out $OUT/draft-tree-grown$S.jsonl > $OUT/draft-tree-grown$S-log.txt 2>&1
done
$A compare --target qwen2.5-coder-1.5b-instruct@torch --draft qwen2.5-coder-0.5b-instruct@torch --dtype bfloat16 \
  --threads 2 --workloads code-edit --limit 1 --max-new-tokens 96 --temperatures 0.7 --time-limit 10 \
  --methods plain,fixed:4,fixed:4+tree:8:always:expand=0,fixed:4+tree:8:always \
  --out $OUT/draft-tree-grown-sampled$S.jsonl >> $OUT/draft-tree-grown$S-log.txt 2>&1
for F in draft-tree-grown$S draft-tree-grown-sampled$S; do
  .venv/bin/python docs/results/issue14/tree_table.py $OUT/$F.jsonl > $OUT/$F-table.md
done
