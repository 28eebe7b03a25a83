#!/usr/bin/env bash
# The profile's own check (issue 39): `adaspec profile --endpoint` for n-gram K 8 against off on each engine,
# predicted on N derivation prompts and re-measured on N held-out ones, both drawn from one random order of
# HumanEval's 82 prompts, taken in turns with the two servers' requests interleaved. Run on a QUIET machine:
#     make scaleout-profile               # or: N=41 OUT=... ENGINES=vllm bash docs/results/scaleout/profile.sh
# ~28 min for vLLM and ~14 for llama-server at N=41 on a 2-core Zen 4 (vLLM's plain decoding there: ~5 tokens/s).
# run.sh's paths and settings; its later flags here override (--profile-only skips the loop's levels and advice).
# Writes OUT/results.jsonl, OUT/report.md, OUT/meta.json, OUT/logs/, OUT/profile-*-mixed.jsonl.
set -euo pipefail
cd "$(dirname "$0")/../../.."
N=${N:-41}
export OUT=${OUT:-docs/results/scaleout/$(hostname -s)-$(date -u +%Y%m%d)-profile}
exec bash docs/results/scaleout/run.sh --derive-prompts "$N" --heldout-prompts "$N" --split random --split-seed 0 \
    --profile-only ngram:8 "$@"
