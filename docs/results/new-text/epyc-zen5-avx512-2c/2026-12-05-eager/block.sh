#!/bin/bash
# Quiet block: eager draft prefill + first probe + look-ahead stop + affine draft cost (new, working tree) against 08f4738 (old, a worktree).
cd /work/main
PY=/work/main/.venv/bin/python
OUT=docs/results/new-text/epyc-zen5-avx512-2c/2026-12-05-eager; mkdir -p $OUT
P="Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring and type hints."
echo "start $(date -u)" > $OUT/times.txt
src() { [ $1 = old ] && echo /work/wt-old/src || echo /work/wt-new/src; }
demo() {  # version run
  PYTHONPATH=$(src $1) $PY -m adaspec generate "$P" --compare --threads 2 --json > $OUT/demo-$1-$2.json 2> $OUT/log-demo-$1-$2.txt
  echo "demo $1 $2 $(date -u)" >> $OUT/times.txt
}
cmp() {  # version pass
  PYTHONPATH=$(src $1) $PY -m adaspec compare --workloads specbench:coding,specbench:writing,humaneval,gsm8k,code-edit --limit 2 \
    --methods plain,hybrid-suffix/goodput --max-new-tokens 128 --threads 2 --backend ik --out $OUT/newtext-$1-$2.jsonl > $OUT/log-newtext-$1-$2.txt 2>&1
  echo "compare $1 $2 $(date -u)" >> $OUT/times.txt
}
demo old 1; demo new 1
cmp old 1; cmp new 1
demo new 2; demo old 2
cmp new 2; cmp old 2
demo old 3; demo new 3
echo "end $(date -u)" >> $OUT/times.txt
