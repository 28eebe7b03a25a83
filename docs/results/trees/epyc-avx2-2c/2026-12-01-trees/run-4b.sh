#!/bin/bash
# Issue 14, 2026-12-01 (late): run-4.sh repeated after the review fixes of the paired chooser (a chain step every 8
# tree steps while trees win, so the chains' cost stays measured; the first probe after trees stop winning comes
# after 8 chain steps; trees capped to the context left and to the backend's tree sequences) and after the
# controllers count a tree's acceptance along its path (StepRecord.depth; before, a fully accepted 8-node tree of
# depth 4 taught the goodput controller a rejection at position 5). Same settings as run-4.sh.
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
A=".venv/bin/adaspec"; OUT=docs/results/issue14
$A compare --target qwen2.5-coder-1.5b-instruct@ik --threads 2 \
  --methods plain,ngram/fixed:4,ngram-tree/fixed:4+tree:8,ngram/goodput,ngram-tree/goodput+tree:12 \
  --workloads code-edit --limit 2 --max-new-tokens 128 --temperatures 0 --time-limit 20 \
  --out $OUT/ngram-tree-ik-paired-3.jsonl --report $OUT/ngram-tree-ik-paired-3.md \
  > $OUT/ngram-tree-ik-paired-3-log.txt 2>&1
.venv/bin/python $OUT/tree_table.py $OUT/ngram-tree-ik-paired-3.jsonl > $OUT/ngram-tree-ik-paired-3-table.md
