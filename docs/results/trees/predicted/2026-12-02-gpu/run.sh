#!/bin/bash
# Issue 14, 2026-12-02: GPU predictions for token trees. The chain and tree steps measured on this CPU (greedy, so
# their acceptance does not depend on the machine) are priced on named GPUs by the roofline model
# (adaspec map --replay; adaspec.bench.predicted.replay_steps). PREDICTED, not measured.
#  - ngram-tree-ik.jsonl: code edits, Qwen2.5-Coder-1.5B on ik_llama.cpp, prompt lookup: chain K = 4 vs always-on
#    trees of 8 nodes (exact replays: fixed K, no choice that depends on costs), plus the chosen methods.
#  - draft-tree-torch-fp32.jsonl: code edits, the 0.5B draft model's chain (K = 4) vs its trees of 6 nodes; priced
#    with a Qwen2.5-0.5B draft for a Qwen2.5-7B target (the acceptance is that of the 1.5B/0.5B pair).
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../../..}"
A=".venv/bin/adaspec"; OUT=docs/results/issue14/gpu; R=docs/results/issue14
for hw in "h100-sxm eager" "h100-sxm graphs" "rtx-4090 eager" "a100-80gb eager"; do
  set -- $hw
  extra=""; [ "$2" = graphs ] && extra="--layer-ms 0"
  $A map --hardware $1 --shape 7b --draft 0.5b --draft ngram $extra --replay $R/ngram-tree-ik.jsonl \
    --report $OUT/$1-7b-$2-ngram-trees.md
  $A map --hardware $1 --shape 7b --draft 0.5b --draft ngram $extra --replay $R/draft-tree-torch-fp32.jsonl \
    --report $OUT/$1-7b-$2-draft-trees.md
done
# The same replay on this CPU (its profile measured now; PyTorch fp32, the 1.5B target and 0.5B draft of the file):
# the check of the method against what those steps measured here.
$A map --hardware this-cpu --shape qwen2.5-1.5b --dtype float32 --draft qwen2.5-0.5b --draft ngram \
  --replay $R/draft-tree-torch-fp32.jsonl --report $OUT/this-cpu-1.5b-float32-draft-trees.md
