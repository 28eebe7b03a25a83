#!/bin/bash
# Issue 13: the controls' cost and draft guidance measured for docs/controls.md (2 threads, nothing else running).
# Each step resumes from its results file.
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
P=.venv/bin/python
OUT=docs/results/issue13
# 1. Full-vocabulary apply (commit dcfa473 + draft guidance): all methods and control sets, 2 rounds (~15 min).
#    (HumanEval/6 round 0 without controls was re-measured after the other rows: tests had shared the cores.)
$P $OUT/controls_bench.py --out $OUT/controls.jsonl > $OUT/controls-log.txt 2>&1
$P $OUT/table.py $OUT/controls.jsonl > $OUT/controls-dense.md
# 2. Sparse apply (this change): the two control sets, 1 round (~6 min).
$P $OUT/controls_bench.py --controls openai,hf --rounds 1 --out $OUT/controls-sparse.jsonl > $OUT/controls-sparse-log.txt 2>&1
$P $OUT/table.py $OUT/controls-sparse.jsonl > $OUT/controls-sparse.md
# 3. One apply() call, before and after (1 thread, seconds).
$P $OUT/controls_micro.py > $OUT/controls-micro.md
