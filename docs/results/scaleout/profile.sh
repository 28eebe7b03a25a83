#!/usr/bin/env bash
# The profile's own check (issue 39): `adaspec profile --endpoint` for n-gram K 8 against off on each engine,
# predicted on N derivation prompts and re-measured on N held-out ones, both drawn from one random order of
# HumanEval's 82 prompts, taken in turns with the two servers' requests interleaved. Run on a QUIET machine:
#     make scaleout-profile               # or: N=41 OUT=... ENGINES=vllm bash docs/results/scaleout/profile.sh
# ~28 min for vLLM and ~10 for llama-server at N=41 on a 2-core Zen 4 (vLLM's plain decoding there: ~5 tokens/s).
# Paths as in run.sh. Writes OUT/results.jsonl, OUT/report.md, OUT/meta.json, OUT/logs/, OUT/profile-*-mixed.jsonl.
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}
PEERS=${ADASPEC_PEERS_DIR:-.peers}
VLLM_VENV=${VLLM_VENV:-$PEERS/vllm}
HF_DIR=${HF_DIR:-${ADASPEC_CACHE:-$HOME/.cache/adaspec}/hf}
LLAMA_SERVER=${LLAMA_SERVER:-$(find "$PEERS/llama-server" -name llama-server -type f 2>/dev/null | head -1 || true)}
OUT=${OUT:-docs/results/scaleout/$(hostname -s)-$(date -u +%Y%m%d)-profile}
ENGINES=${ENGINES:-vllm,llamacpp}
N=${N:-41}
PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} "$PY" -m adaspec.engines.scaleout --out "$OUT" --engines "$ENGINES" \
    --vllm-venv "$VLLM_VENV" --vllm-target "$HF_DIR/qwen2.5-coder-1.5b-instruct" \
    --vllm-draft "$HF_DIR/qwen2.5-coder-0.5b-instruct" --vllm-kv-gib 2 \
    --llama-server "$LLAMA_SERVER" \
    --workload humaneval --derive-prompts "$N" --heldout-prompts "$N" --max-tokens 64 --settle 30 \
    --split random --split-seed 0 --profile-only ngram:8 "$@"
echo "report: $OUT/report.md"
