#!/bin/bash
# New text and the default draft: plain decoding against the default (METHOD, default hybrid-suffix/goodput; runs
# before 2026-12-06 used hybrid/goodput, the default of before 2026-12-05) with the default draft (the
# 0.5B requantised to Q4_0 here) and with the zoo's Q4_K_M 0.5B, on every workload family: new code (Spec-Bench
# coding), chat (Spec-Bench writing), HumanEval, code edits, GSM8K. ik_llama.cpp, 2 threads, greedy, 128 tokens.
# Usage: run.sh OUTDIR [CHRT]   e.g. run.sh docs/results/new-text/xeon-2026-12-03 "chrt -f 50"
# (CHRT: run the benchmark at real-time priority, for a machine where other work cannot be stopped; say so.)
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
OUT="$1"; PRIO="${2:-}"; mkdir -p "$OUT"
W="specbench:coding,specbench:writing,humaneval,code-edit,gsm8k"
git rev-parse HEAD > "$OUT/commit.txt"; grep -m1 "model name" /proc/cpuinfo > "$OUT/cpu.txt"
for D in qwen2.5-coder-0.5b-instruct-q4_0 qwen2.5-coder-0.5b-instruct; do
  $PRIO .venv/bin/adaspec compare --threads 2 --draft $D@ik --workloads $W --limit 2 --max-new-tokens 128 \
    --methods "plain,${METHOD:-hybrid-suffix/goodput}" --out "$OUT/$D.jsonl" > "$OUT/$D-log.txt" 2>&1
done
.venv/bin/python "$(dirname "$0")/table.py" "$OUT"/qwen2.5-coder-0.5b-instruct-q4_0.jsonl \
  "$OUT"/qwen2.5-coder-0.5b-instruct.jsonl > "$OUT/table.md"
cat "$OUT/table.md"
