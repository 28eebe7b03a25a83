#!/bin/bash
# The prepared GPU sweep of issue 17: one command, about 5-8 minutes on one data-centre GPU.
#   bash configs/gpu-sweep.sh OUT_DIR           (on a machine with CUDA; writes OUT_DIR/*.jsonl, *.md, img/)
#   SMOKE=1 bash configs/gpu-sweep.sh OUT_DIR   (the same pipeline on the CPU with 1-2 layer models: a check)
# Synthetic Qwen2.5 1.5B and 7B targets, two draft sizes each plus prompt lookup, 3 contexts, 3 alphas, batch 1.
# Needs only torch, transformers, numpy, matplotlib and tqdm (the package is used from src/, not installed).
set -u
OUT=${1:?usage: configs/gpu-sweep.sh OUT_DIR}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
A="$PY -m adaspec"
CFG=configs/gpu-sweep.toml
LIMIT=${LIMIT:-3.2}   # minutes per target: start no new point after that (the results file resumes)
if [ "${SMOKE:-0}" = 1 ]; then
  SMOKE_SET=(--set bench.device='"cpu"' --set bench.threads=[2] --set bench.max_new_tokens=6 --set micro.repeats=1
             --set micro.contexts=[64,128] --set micro.verify_tokens=[1,3,5] --set 'sweep.alpha-k.alpha=[0.9]'
             --set 'sweep.alpha-k.k=[2]' --set 'sweep.context.context=[64,128]' --set 'sweep.alpha-k.context=[64]')
  HW=this-cpu; DT=float32; SMOKE_SET+=(--set bench.dtype='["float32"]')
else
  SMOKE_SET=(); HW=${HARDWARE:-h200}; DT=bfloat16
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
fi
date
run() {  # $1 target shape, $2 and $3 its drafts (synthetic shapes, optionally :layers=N)
  local T="synthetic:$1" D1="synthetic:$2" D2="synthetic:$3" size=${1#qwen2.5-}
  if [ "${SMOKE:-0}" = 1 ]; then T="$T:layers=2"; D1="synthetic:${2%%:*}:layers=1"; D2="synthetic:${3%%:*}:layers=2"; fi
  $A bench --config $CFG --set "bench.target=\"$T\"" --set "micro.drafts=[\"$D1\", \"$D2\"]" \
    --set "sweep.alpha-k.cost=[\"$D1\", \"$D2\", \"0.1\"]" --set "sweep.context.cost=[\"$D1\", \"0.1\"]" \
    "${SMOKE_SET[@]}" --out "$OUT/gpu-$size.jsonl" --time-limit "$LIMIT" 2>&1 | tail -n 5
  $A map "$OUT/gpu-$size.jsonl" --report "$OUT/boundary-gpu-$size.md" --img-dir "$OUT/img" \
    --title "Measured: synthetic $1 on this machine" > /dev/null || echo "map of $size failed"
  $A map "$OUT/gpu-$size.jsonl" --hardware "$HW" --shape "$T" --draft "$D1" --draft "$D2" --draft ngram \
    --dtype $DT --report "$OUT/predicted-$size.md" --img-dir "$OUT/img" > /dev/null \
    || echo "predicted map of $size failed"
  date
}
run qwen2.5-1.5b qwen2.5-0.5b:layers=12 qwen2.5-0.5b
run qwen2.5-7b qwen2.5-0.5b qwen2.5-1.5b
