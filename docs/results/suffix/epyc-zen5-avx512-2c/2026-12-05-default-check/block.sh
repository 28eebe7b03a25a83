#!/bin/bash
# Quiet block 4: hybrid-suffix against the default on code edits and new text (new code), alternated order twice.
cd /work/main
O=docs/results/suffix/epyc-zen5-avx512-2c/2026-12-05-default-check; mkdir -p $O
git rev-parse --short HEAD > $O/commit.txt
for p in 1 2; do
  if [ $p = 1 ]; then M=plain,hybrid/goodput,hybrid-suffix/goodput; else M=plain,hybrid-suffix/goodput,hybrid/goodput; fi
  PYTHONPATH=src .venv/bin/python -m adaspec compare --workloads code-edit,specbench:coding,specbench:writing,gsm8k,humaneval \
    --limit 2 --methods $M --max-new-tokens 128 --threads 2 --backend ik --out $O/pass$p.jsonl --report $O/pass$p.md > $O/log$p.txt 2>&1
  date -u >> $O/times.txt
done
