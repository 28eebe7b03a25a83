#!/bin/bash
# Issue 14, 2026-12-02 (evening, Intel Xeon, AVX-512/AMX, 2 threads, alone on the cores): draft-model trees grown
# level by level (EAGLE-2: the 4 best nodes of each level expanded by one draft forward, `expand=4`, the default
# where the draft backend grows trees) against one-level trees (the draft's chain plus sibling leaves, `expand=0`)
# and the chain, with the 0.5B draft for the 1.5B target:
#   1. PyTorch bf16, greedy, code edits (4 prompts) and GSM8K (4 prompts), 96 tokens;
#   2. PyTorch bf16, sampled (T = 0.7), GSM8K: grown trees draw their children from the draft and are verified with
#      the q-aware multi-draft rule; one-level trees are deterministic (one-hot q);
#   3. ik_llama.cpp (the default runtime, Q4_K_M), greedy, the same prompts as 1, 128 tokens.
# Usage: run-9.sh [SUFFIX] (reruns resume). Run 1 (files draft-tree-grown-run1*) used an earlier version of this
# script, before the warm-up fix of the same evening: its goodput rows ran plain decoding (see docs/trees.md).
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
A=".venv/bin/adaspec"; OUT=docs/results/issue14/xeon-avx512; S="${1:-}"
TORCH="--target qwen2.5-coder-1.5b-instruct@torch --draft qwen2.5-coder-0.5b-instruct@torch --dtype bfloat16"
IK="--target qwen2.5-coder-1.5b-instruct@ik --draft qwen2.5-coder-0.5b-instruct@ik"
M="plain,fixed:4,fixed:4+tree:8:always:expand=0,fixed:4+tree:8:always,goodput,goodput+tree:12"
mkdir -p $OUT
for W in code-edit gsm8k; do
  L=1; [ $W = gsm8k ] && L=4
  $A compare $TORCH --threads 2 --workloads $W --limit $L --max-new-tokens 96 --temperatures 0 --time-limit 12 \
    --methods $M --out $OUT/draft-tree-grown-torch$S.jsonl >> $OUT/draft-tree-grown$S-log.txt 2>&1
done
$A compare $TORCH --threads 2 --workloads gsm8k --limit 4 --max-new-tokens 96 --temperatures 0.7 --time-limit 10 \
  --methods plain,fixed:4,fixed:4+tree:8:always:expand=0,fixed:4+tree:8:always \
  --out $OUT/draft-tree-grown-torch-sampled$S.jsonl >> $OUT/draft-tree-grown$S-log.txt 2>&1
for W in code-edit gsm8k; do
  L=1; [ $W = gsm8k ] && L=4
  $A compare $IK --threads 2 --workloads $W --limit $L --max-new-tokens 128 --temperatures 0 --time-limit 12 \
    --methods $M --out $OUT/draft-tree-grown-ik$S.jsonl >> $OUT/draft-tree-grown$S-log.txt 2>&1
done
for F in draft-tree-grown-torch$S draft-tree-grown-torch-sampled$S draft-tree-grown-ik$S; do
  .venv/bin/python docs/results/issue14/tree_table.py $OUT/$F.jsonl > $OUT/$F-table.md
  .venv/bin/python docs/results/issue14/per_category.py $OUT/$F.jsonl > $OUT/$F-categories.md
done
