#!/bin/bash
# Issue 17: the roofline model's CPU check, run RUN: forward times of synthetic Qwen2.5-0.5B and -1.5B measured
# afresh (roofline-cpu-RUN.jsonl, log-RUN.txt), each shape's fp32 and bf16 maps made right after its bench (the
# reports this-cpu-qwen2.5-*.md are rewritten), so measured and predicted sit minutes apart. 2 threads, nothing
# else running. Usage: roofline.sh RUN [DIR]; with DIR (another machine), results, logs and reports go to cpu/DIR/.
set -u
RUN=$1
cd "${ADASPEC_REPO:-$(dirname "$0")/../../../..}"
A=".venv/bin/adaspec"; OUT=docs/results/issue17/cpu${2:+/$2}
mkdir -p $OUT
for s in 0.5b 1.5b; do
  $A bench --config configs/roofline-cpu.toml --set "bench.target=\"synthetic:qwen2.5-$s\"" \
    --out $OUT/roofline-cpu-$RUN.jsonl >> $OUT/log-$RUN.txt 2>&1
  for dt in float32 bfloat16; do
    $A map $OUT/roofline-cpu-$RUN.jsonl --hardware this-cpu --shape synthetic:qwen2.5-$s --dtype $dt --draft ngram \
      --report $OUT/this-cpu-qwen2.5-$s-$dt.md >> $OUT/log-$RUN.txt 2>&1
  done
done
grep -h "median |error|" $OUT/this-cpu-*.md
