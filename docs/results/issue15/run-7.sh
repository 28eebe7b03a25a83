#!/bin/bash
# Issue 15, 2026-12-02 (second session): run-6.sh repeated on the final code of the fix (one median level per
# bucket, a seed made non-decreasing; batched rows keep the old rule). Run 6: run-5.sh/run-5b.sh repeated after the
# goodput controller's seeded
# verification curve gives only the shape and the live steps its level (CostModel.verify_ms). Run 5's second server
# had warmed up while the VM ran ~20 % slow (plain step 80 ms against 63-69 ms), drafted at mean K 2.9 instead of
# 4.7-5.8, and decoded at half the speed of the compare runs beside it. The server now prints the curve it measured.
# Four alternations (compare, server, compare, server, compare, server, compare, server, compare): each endpoint
# run against the mean of the compare runs on either side of it. Same prompts and settings as run-5 (4 HumanEval
# prompts, 128 tokens, greedy, default runtime and models); one endpoint round per server start.
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
A=".venv/bin/adaspec"; OUT=docs/results/issue15
wait_up() { for _ in $(seq 240); do curl -sf "$1/v1/models" > /dev/null && return 0; sleep 1; done; echo "no server at $1"; exit 1; }
cmp() {
  $A compare --workloads humaneval --limit 4 --methods plain,hybrid/goodput --max-new-tokens 128 --temperatures 0 \
    --threads 2 --out $OUT/compare-7$1.jsonl --report $OUT/compare-7$1.md > $OUT/compare-7$1-log.txt 2>&1
}
srv() {
  $A serve --threads 2 --port 8014 > $OUT/serve-7$1-log.txt 2>&1 & SERVE=$!
  wait_up http://127.0.0.1:8014
  $A bench --endpoint http://127.0.0.1:8014 --baseline-body '{"speculation": {"drafter": "none"}}' \
    --workload humaneval --prompts 4 --max-tokens 128 --concurrency 1 --rounds 1 --out $OUT/adaspec-serve-7$1.jsonl \
    > $OUT/adaspec-serve-7$1-log.txt 2>&1
  kill $SERVE; wait $SERVE
}
cmp a; srv a; cmp b; srv b; cmp c; srv c; cmp d; srv d; cmp e
.venv/bin/python $OUT/agreement.py $OUT/compare-7{a,b,c,d,e}.jsonl -- $OUT/adaspec-serve-7{a,b,c,d}.jsonl \
  > $OUT/agreement-7.md
