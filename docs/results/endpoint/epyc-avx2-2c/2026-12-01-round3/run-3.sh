#!/bin/bash
# Issue 15, 2026-12-01 (evening), a repetition of run-2.sh (the default configuration's endpoint-vs-compare
# agreement) plus an open-loop run (Poisson arrivals) against adaspec serve, which had been tested on a fake server
# only. Same prompts and settings; compare before and after the server.
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
A=".venv/bin/adaspec"; OUT=docs/results/issue15
wait_up() { for _ in $(seq 240); do curl -sf "$1/v1/models" > /dev/null && return 0; sleep 1; done; echo "no server at $1"; exit 1; }
$A compare --workloads humaneval --limit 4 --methods plain,hybrid/goodput --max-new-tokens 128 --temperatures 0 \
  --threads 2 --out $OUT/compare-3a.jsonl --report $OUT/compare-3a.md > $OUT/compare-3a-log.txt 2>&1
$A serve --threads 2 --port 8011 > $OUT/serve-3-log.txt 2>&1 & SERVE=$!
wait_up http://127.0.0.1:8011
$A bench --endpoint http://127.0.0.1:8011 --baseline-body '{"speculation": {"drafter": "none"}}' \
  --workload humaneval --prompts 4 --max-tokens 128 --concurrency 1 --rounds 2 --out $OUT/adaspec-serve-3.jsonl \
  > $OUT/adaspec-serve-3-log.txt 2>&1
# open loop: 8 requests per arm at 0.1 requests/s (a mean gap of 10 s, about one 128-token answer), seeded arrivals
$A bench --endpoint http://127.0.0.1:8011 --baseline-body '{"speculation": {"drafter": "none"}}' \
  --workload humaneval --prompts 4 --max-tokens 128 --rate 0.1 --requests 8 --out $OUT/adaspec-serve-open.jsonl \
  > $OUT/adaspec-serve-open-log.txt 2>&1
kill $SERVE; wait $SERVE
$A compare --workloads humaneval --limit 4 --methods plain,hybrid/goodput --max-new-tokens 128 --temperatures 0 \
  --threads 2 --out $OUT/compare-3b.jsonl --report $OUT/compare-3b.md > $OUT/compare-3b-log.txt 2>&1
$A map $OUT/adaspec-serve-3.jsonl --report $OUT/adaspec-serve-3.md --img-dir $OUT/img
$A map $OUT/adaspec-serve-open.jsonl --report $OUT/adaspec-serve-open.md --img-dir $OUT/img
