#!/bin/bash
# Issue 12, 2026-12-01 (late): speculation on vs off at 16 clients over 4 rounds (modes interleaved, order
# alternating), as run-load-4.sh did for 1 and 4 clients.
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
OUT=docs/results/issue12
.venv/bin/python -m adaspec.server.loadtest --spawn --concurrency 16 --requests 16 --max-tokens 64 --rounds 4 \
    --modes speculative,plain --out $OUT/server-batch16-5.json --markdown $OUT/server-batch16-5.md \
    -- --threads 2 --max-batch 16 > $OUT/server-batch16-5-log.txt 2>&1
