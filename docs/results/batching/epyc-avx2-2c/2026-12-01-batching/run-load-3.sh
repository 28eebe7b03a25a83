#!/bin/bash
# Issue 12, 2026-12-01 (late): the batched server's load test re-run after the fixes of the evening (the server's
# controller wrapper no longer hides the goodput controller's drafter choice and warm-up calibration; a draft
# model's prompt catch-up is priced in a batch). Modes interleaved per client count, order alternating, 2 rounds;
# default runtime and models, 64 greedy tokens per request.
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
OUT=docs/results/issue12
.venv/bin/python -m adaspec.server.loadtest --spawn --concurrency 1,4,16 --requests 4,8,16 --max-tokens 64 --rounds 2 \
    --modes speculative,plain --out $OUT/server-batch16-3.json --markdown $OUT/server-batch16-3.md \
    -- --threads 2 --max-batch 16 > $OUT/server-batch16-3-log.txt 2>&1
