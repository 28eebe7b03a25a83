#!/bin/bash
# Issue 14, 2026-12-01 (late): the chain/tree chooser made paired (trees against the chains they contain, on the
# same steps; probes backed off) and re-measured on ik_llama.cpp, where run-3.sh showed the old chooser losing
# 6-9 % against the best chain. Same settings as run-3.sh, without the always-tree method.
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
A=".venv/bin/adaspec"; OUT=docs/results/issue14
$A compare --target qwen2.5-coder-1.5b-instruct@ik --threads 2 \
  --methods plain,ngram/fixed:4,ngram-tree/fixed:4+tree:8,ngram/goodput,ngram-tree/goodput+tree:12 \
  --workloads code-edit --limit 2 --max-new-tokens 128 --temperatures 0 --time-limit 20 \
  --out $OUT/ngram-tree-ik-paired.jsonl --report $OUT/ngram-tree-ik-paired.md > $OUT/ngram-tree-ik-paired-log.txt 2>&1
.venv/bin/python $OUT/tree_table.py $OUT/ngram-tree-ik-paired.jsonl > $OUT/ngram-tree-ik-paired-table.md
