#!/bin/bash
# Issue 15, 2026-12-02: run-5.sh continued (one more alternation: server d, compare e) after its second endpoint
# run's default arm came out 50 % slow (one server whose goodput controller drafted short: mean K 2.9). Run-5:
# the server runs its warm-up on the generation thread (one OpenMP team per process; see
# ModelHost.on_generation_thread). Earlier text of run-4.sh follows.
#
# The VM's speed drifts by 10-20 % over
# minutes, and run-2/run-3 measured compare, then the server, then compare once each. Here the two tools alternate
# three times (compare, server, compare, server, compare, server, compare), each endpoint run against the mean of
# the compare runs on either side of it. Same prompts and settings as run-2.sh (4 HumanEval prompts, 128 tokens,
# greedy, default runtime and models); one endpoint round per server start.
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
A=".venv/bin/adaspec"; OUT=docs/results/issue15
wait_up() { for _ in $(seq 240); do curl -sf "$1/v1/models" > /dev/null && return 0; sleep 1; done; echo "no server at $1"; exit 1; }
cmp() {
  $A compare --workloads humaneval --limit 4 --methods plain,hybrid/goodput --max-new-tokens 128 --temperatures 0 \
    --threads 2 --out $OUT/compare-5$1.jsonl --report $OUT/compare-5$1.md > $OUT/compare-5$1-log.txt 2>&1
}
srv() {
  $A serve --threads 2 --port 8014 > $OUT/serve-5$1-log.txt 2>&1 & SERVE=$!
  wait_up http://127.0.0.1:8014
  $A bench --endpoint http://127.0.0.1:8014 --baseline-body '{"speculation": {"drafter": "none"}}' \
    --workload humaneval --prompts 4 --max-tokens 128 --concurrency 1 --rounds 1 --out $OUT/adaspec-serve-5$1.jsonl \
    > $OUT/adaspec-serve-5$1-log.txt 2>&1
  kill $SERVE; wait $SERVE
}
srv d; cmp e
.venv/bin/python $OUT/agreement.py $OUT/compare-5{a,b,c,d,e}.jsonl -- $OUT/adaspec-serve-5{a,b,c,d}.jsonl \
  > $OUT/agreement-5b.md
