#!/bin/bash
# Issue 14, 2026-12-02: the tree axis of adaspec bench on the default runtime (ik_llama.cpp, Qwen2.5-Coder-1.5B
# Q4_K_M target), code-edit prompts: prompt-lookup trees (chain / tree of 8 / goodput chooser with 8) and draft-model
# trees (0.5B draft: chain / tree of 8), K = 4, 96 tokens, 4 prompts. 2 threads, nothing else running. Resumes.
# Usage: bench-trees.sh [DIR]; with DIR (another machine), results, log and report go to issue14/DIR/.
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
A=".venv/bin/adaspec"; OUT=docs/results/issue14${1:+/$1}
mkdir -p $OUT
$A bench --config configs/trees-cpu.toml --out $OUT/bench-trees.jsonl > $OUT/bench-trees-log.txt 2>&1
$A map $OUT/bench-trees.jsonl --report $OUT/bench-trees.md >> $OUT/bench-trees-log.txt 2>&1
