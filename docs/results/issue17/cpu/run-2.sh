#!/bin/bash
# Issue 17, 2026-12-02: the roofline model's CPU check again, after measured profiles price a model matrix by
# matrix (HardwareProfile.linear_curves: each of its matrix shapes timed with the weights streamed from memory),
# instead of one 2560 x 10240 probe per 10^9 weights, which missed the Qwen2.5-0.5B by 27.5 % (fp32) / 22.3 % (bf16).
# Forward times measured afresh (roofline-cpu-2.jsonl; roofline-cpu.jsonl keeps the first run's), each shape's map
# made right after its bench, so measured and predicted sit minutes apart. 2 threads, nothing else running.
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../../..}"
A=".venv/bin/adaspec"; OUT=docs/results/issue17/cpu
for s in 0.5b 1.5b; do
  $A bench --config configs/roofline-cpu.toml --set "bench.target=\"synthetic:qwen2.5-$s\"" \
    --out $OUT/roofline-cpu-2.jsonl >> $OUT/log-2.txt 2>&1
  for dt in float32 bfloat16; do
    $A map $OUT/roofline-cpu-2.jsonl --hardware this-cpu --shape synthetic:qwen2.5-$s --dtype $dt --draft ngram \
      --report $OUT/this-cpu-qwen2.5-$s-$dt.md >> $OUT/log-2.txt 2>&1
  done
done
grep -h "median |error|" $OUT/this-cpu-*.md
