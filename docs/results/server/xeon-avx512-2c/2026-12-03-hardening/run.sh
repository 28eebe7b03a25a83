#!/bin/bash
# Issue 41: `adaspec serve` under hostile load on the default models (qwen2.5-coder-1.5b-instruct target, hybrid
# drafter with the 0.5B draft model, ik_llama.cpp, 2 threads, --max-batch 4). Run on a quiet machine from the
# repository root (or anywhere: it cds there). About 8 minutes with the defaults: start-up ~1 min, (a) ~1-2 min,
# (b) ~1 min, (c) SOAK_S seconds (default 240). A 30-minute soak: SOAK_S=1800 docs/results/server-hardening/run.sh
# Writes results.json, results.md and results.serve-log.txt here. Extra arguments go to bench.py (e.g. --parts c).
set -eu
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}
OUT=docs/results/server-hardening
$PY $OUT/bench.py --backend "${BACKEND:-ik}" --threads "${THREADS:-2}" --max-batch "${MAX_BATCH:-4}" \
    ${PREFILL_CHUNK:+--prefill-chunk "$PREFILL_CHUNK"} ${PREFILL_STEP_MS:+--prefill-step-ms "$PREFILL_STEP_MS"} --soak-s "${SOAK_S:-240}" --clients "${CLIENTS:-4}" --long-tokens "${LONG_TOKENS:-8000}" \
    --out "$OUT/${NAME:-results}.json" --markdown "$OUT/${NAME:-results}.md" "$@"
