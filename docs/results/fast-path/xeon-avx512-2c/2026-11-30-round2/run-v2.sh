#!/usr/bin/env bash
# Issue 11, second round (after per-drafter probing, probe budget 4): the default on ik_llama.cpp against plain
# decoding on the same runtime, interleaved; plain llama.cpp numbers are those of run.sh (same prompts, same machine).
set -euo pipefail
OUT=docs/results/issue11
A="--threads 2 --methods plain,hybrid/goodput --backend ik"
adaspec compare --workloads humaneval --limit 10 --max-new-tokens 128 $A --out $OUT/v2-humaneval-ik.jsonl --report $OUT/v2-humaneval-ik.md
adaspec compare --workloads code-edit --limit 3 --max-new-tokens 160 $A --out $OUT/v2-code-edit-ik.jsonl --report $OUT/v2-code-edit-ik.md
adaspec compare --workloads gsm8k,specbench:translation --limit 5 --max-new-tokens 128 $A \
    --out $OUT/v2-gsm8k-translation-ik.jsonl --report $OUT/v2-gsm8k-translation-ik.md
for i in 1 2 3; do
  adaspec generate "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring and type hints." \
      --compare --threads 2 --json > $OUT/v2-demo-$i.json
done
# plain llama.cpp again, in this round, for the "vs plain llama.cpp" column
for w in humaneval:128:10 code-edit:160:3; do
  IFS=: read name tokens limit <<< "$w"
  adaspec compare --workloads $name --limit $limit --max-new-tokens $tokens --threads 2 --methods plain \
      --backend llamacpp --out $OUT/v2-$name-llamacpp.jsonl
done
