#!/bin/bash
# Issue 15: `adaspec compare` and the endpoint (`adaspec serve` + `adaspec bench --endpoint`) alternated four times
# (compare, server, compare, server, compare, server, compare, server, compare), each endpoint run set against the
# mean of the compare runs on either side of it (agreement.py). 4 HumanEval prompts, 128 tokens, greedy, default
# runtime and models, 2 threads; one endpoint round per server start. Usage: alternate.sh RUN [STEP ...], a step
# being cX (compare, files compare-RUNX.*) or sX (server, files serve-RUNX-log.txt, adaspec-serve-RUNX.*); default
# ca sa cb sb cc sc cd sd ce. PORT (default 8014); AGREEMENT, the table's file (default agreement-RUN.md),
# covers every file of the run present.
set -u
R=$1; shift
STEPS=${*:-ca sa cb sb cc sc cd sd ce}
PORT=${PORT:-8014}
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
A=".venv/bin/adaspec"; OUT=docs/results/issue15
wait_up() { for _ in $(seq 240); do curl -sf "$1/v1/models" > /dev/null && return 0; sleep 1; done; echo "no server at $1"; exit 1; }
cmp() {
  $A compare --workloads humaneval --limit 4 --methods plain,hybrid/goodput --max-new-tokens 128 --temperatures 0 \
    --threads 2 --out $OUT/compare-$R$1.jsonl --report $OUT/compare-$R$1.md > $OUT/compare-$R$1-log.txt 2>&1
}
srv() {
  $A serve --threads 2 --port $PORT > $OUT/serve-$R$1-log.txt 2>&1 & SERVE=$!
  wait_up http://127.0.0.1:$PORT
  $A bench --endpoint http://127.0.0.1:$PORT --baseline-body '{"speculation": {"drafter": "none"}}' \
    --workload humaneval --prompts 4 --max-tokens 128 --concurrency 1 --rounds 1 \
    --out $OUT/adaspec-serve-$R$1.jsonl > $OUT/adaspec-serve-$R$1-log.txt 2>&1
  kill $SERVE; wait $SERVE
}
for step in $STEPS; do
  case $step in c?) cmp "${step#c}" ;; s?) srv "${step#s}" ;; *) echo "unknown step $step"; exit 2 ;; esac
done
.venv/bin/python $OUT/agreement.py $OUT/compare-$R?.jsonl -- $OUT/adaspec-serve-$R?.jsonl > "$OUT/${AGREEMENT:-agreement-$R.md}"
