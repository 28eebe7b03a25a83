#!/bin/bash
# Issue 14, 2026-12-02: run-4b.sh repeated with the tree's width chosen per step (TreeChoice.width: the node budget
# with the most tokens per ms on the request's full-width tree steps, from the accepted path's node indices and the
# measured verification ms per node; one full-width tree step after every 8 narrower ones). Same settings as
# run-4b.sh. Run three times (suffixes "", -2, -3: `bash run-6.sh -2`).
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
A=".venv/bin/adaspec"; OUT=docs/results/issue14; S="${1:-}"
$A compare --target qwen2.5-coder-1.5b-instruct@ik --threads 2 \
  --methods plain,ngram/fixed:4,ngram-tree/fixed:4+tree:8,ngram/goodput,ngram-tree/goodput+tree:12 \
  --workloads code-edit --limit 2 --max-new-tokens 128 --temperatures 0 --time-limit 20 \
  --out $OUT/ngram-tree-ik-width$S.jsonl --report $OUT/ngram-tree-ik-width$S.md \
  > $OUT/ngram-tree-ik-width$S-log.txt 2>&1
.venv/bin/python $OUT/tree_table.py $OUT/ngram-tree-ik-width$S.jsonl > $OUT/ngram-tree-ik-width$S-table.md
