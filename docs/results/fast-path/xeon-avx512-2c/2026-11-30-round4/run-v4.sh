#!/usr/bin/env bash
# Issue 11, final round (the code as committed: per-drafter probe gaps that double only for probes that ran, probe catch-up <= 1/4 of the request time
# so far, 48-token warm-up): the default on ik_llama.cpp against plain decoding on the same runtime, interleaved.
# Plain llama.cpp: v2-humaneval-llamacpp.jsonl and v2-code-edit-llamacpp.jsonl (run-v2.sh, same prompts, same hour).
set -euo pipefail
OUT=docs/results/issue11
A="--threads 2 --methods plain,hybrid/goodput --backend ik"
adaspec compare --workloads humaneval --limit 10 --max-new-tokens 128 $A --out $OUT/v4-humaneval-ik.jsonl --report $OUT/v4-humaneval-ik.md
adaspec compare --workloads code-edit --limit 3 --max-new-tokens 160 $A --out $OUT/v4-code-edit-ik.jsonl --report $OUT/v4-code-edit-ik.md
adaspec compare --workloads gsm8k,specbench:translation --limit 5 --max-new-tokens 128 $A \
    --out $OUT/v4-gsm8k-translation-ik.jsonl --report $OUT/v4-gsm8k-translation-ik.md
for i in 1 2 3; do  # make demo's command
  adaspec generate "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring and type hints." \
      --compare --threads 2 --json > $OUT/v4-demo-$i.json
done
