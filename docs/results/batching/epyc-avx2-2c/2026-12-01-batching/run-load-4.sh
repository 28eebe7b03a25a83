#!/bin/bash
# Issue 12, 2026-12-01 (late): speculation on vs off at 1 and 4 clients with more rounds (4, modes interleaved per
# client count, order alternating), to tell the 0.90-0.93x of run-load-3.sh at 4 clients from drift.
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
OUT=docs/results/issue12
.venv/bin/python -m adaspec.server.loadtest --spawn --concurrency 1,4 --requests 4,8 --max-tokens 64 --rounds 4 \
    --modes speculative,plain --out $OUT/server-batch16-4.json --markdown $OUT/server-batch16-4.md \
    -- --threads 2 --max-batch 16 > $OUT/server-batch16-4-log.txt 2>&1
