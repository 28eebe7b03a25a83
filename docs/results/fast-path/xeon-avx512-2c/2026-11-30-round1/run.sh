#!/usr/bin/env bash
# Issue 11 measurements (docs/fast-path.md): one machine, 2 threads, greedy, nothing else running.
# Each command appends to its JSONL and resumes where it stopped.
set -euo pipefail
OUT=docs/results/issue11
A="--threads 2 --methods plain,hybrid/goodput"
for rt in ik llamacpp; do
  adaspec compare --workloads humaneval --limit 10 --max-new-tokens 128 --backend $rt $A \
      --out $OUT/humaneval-$rt.jsonl --report $OUT/humaneval-$rt.md
  adaspec compare --workloads code-edit --limit 3 --max-new-tokens 160 --backend $rt $A \
      --out $OUT/code-edit-$rt.jsonl --report $OUT/code-edit-$rt.md
done
adaspec compare --workloads gsm8k,specbench:translation --limit 5 --max-new-tokens 128 --backend ik $A \
    --out $OUT/gsm8k-translation-ik.jsonl --report $OUT/gsm8k-translation-ik.md
