#!/usr/bin/env bash
# `adaspec profile --endpoint --precision 0.10` against two llama-servers (n-gram K 8 and off), requests interleaved:
# does the widening sample stop where its interval reaches ±10 %? From the repository root, on a quiet machine:
#     bash docs/results/scaleout/epyc-zen4-avx512-2c/2026-12-07-precision-live/run.sh
set -euo pipefail
cd "$(dirname "$0")/../../../../.."
DIR=docs/results/scaleout/epyc-zen4-avx512-2c/2026-12-07-precision-live
LS=$(find .peers/llama-server -name llama-server -type f | head -1)
G=${ADASPEC_CACHE:-$HOME/.cache/adaspec}/gguf/qwen2.5-coder-1.5b-instruct.gguf
common=(-m "$G" --host 127.0.0.1 -a target -t 2 -np 1 -c 8192 --metrics --no-webui)
"$LS" "${common[@]}" --port 8451 --spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 8 \
    --spec-draft-n-max 8 --spec-draft-n-min 0 > "$DIR/spec.log" 2>&1 &
"$LS" "${common[@]}" --port 8452 > "$DIR/off.log" 2>&1 &
trap 'kill $(jobs -p) 2>/dev/null' EXIT
for port in 8451 8452; do
    for _ in $(seq 60); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 1; done
done
PYTHONPATH=src .venv/bin/python -m adaspec profile humaneval --endpoint http://127.0.0.1:8451 \
    --baseline http://127.0.0.1:8452 --interleave --sample 8 --precision 0.10 --confirm-tokens 64 --settle 20 \
    --out "$DIR/profile.jsonl" --json > "$DIR/profile.json" 2> "$DIR/profile.err"
cat "$DIR/profile.json"
