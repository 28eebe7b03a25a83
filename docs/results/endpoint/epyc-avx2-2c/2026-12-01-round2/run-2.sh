#!/bin/bash
# Issue 15, 2026-12-01 (evening): the default configuration's endpoint-vs-compare agreement re-measured after the
# server's controller wrapper was fixed (it hid the goodput controller's per-step drafter choice, its warm-up
# calibration and the draft cache bookkeeping, and asked it for two decisions per step). Same prompts and settings
# as steps 1-2 of run.sh; compare runs before and after the server, so VM drift shows.
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
A=".venv/bin/adaspec"; OUT=docs/results/issue15
wait_up() { for _ in $(seq 240); do curl -sf "$1/v1/models" > /dev/null && return 0; sleep 1; done; echo "no server at $1"; exit 1; }
$A compare --workloads humaneval --limit 4 --methods plain,hybrid/goodput --max-new-tokens 128 --temperatures 0 \
  --threads 2 --out $OUT/compare-2a.jsonl --report $OUT/compare-2a.md > $OUT/compare-2a-log.txt 2>&1
$A serve --threads 2 --port 8011 > $OUT/serve-2-log.txt 2>&1 & SERVE=$!
wait_up http://127.0.0.1:8011
$A bench --endpoint http://127.0.0.1:8011 --baseline-body '{"speculation": {"drafter": "none"}}' \
  --workload humaneval --prompts 4 --max-tokens 128 --concurrency 1 --rounds 2 --out $OUT/adaspec-serve-2.jsonl \
  > $OUT/adaspec-serve-2-log.txt 2>&1
kill $SERVE; wait $SERVE
$A compare --workloads humaneval --limit 4 --methods plain,hybrid/goodput --max-new-tokens 128 --temperatures 0 \
  --threads 2 --out $OUT/compare-2b.jsonl --report $OUT/compare-2b.md > $OUT/compare-2b-log.txt 2>&1
$A map $OUT/adaspec-serve-2.jsonl --report $OUT/adaspec-serve-2.md --img-dir $OUT/img
