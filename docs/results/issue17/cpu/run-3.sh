#!/bin/bash
# Issue 17, 2026-12-02 (later): the roofline model's CPU check with layer-sequence curves: measured profiles now also
# time a decoder layer's seven matrix products in model order (HardwareProfile.layer_curves, measure_layer_curve),
# since run 2 found the same matrices ~20 % dearer interleaved as a forward runs them than streamed shape by shape
# (fp32: 13-14 % median error). Same commands as run-2.sh, forward times measured afresh (roofline-cpu-3.jsonl), each
# shape's maps made right after its bench. 2 threads, nothing else running.
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../../..}"
A=".venv/bin/adaspec"; OUT=docs/results/issue17/cpu
for s in 0.5b 1.5b; do
  $A bench --config configs/roofline-cpu.toml --set "bench.target=\"synthetic:qwen2.5-$s\"" \
    --out $OUT/roofline-cpu-3.jsonl >> $OUT/log-3.txt 2>&1
  for dt in float32 bfloat16; do
    $A map $OUT/roofline-cpu-3.jsonl --hardware this-cpu --shape synthetic:qwen2.5-$s --dtype $dt --draft ngram \
      --report $OUT/this-cpu-qwen2.5-$s-$dt.md >> $OUT/log-3.txt 2>&1
  done
done
grep -h "median |error|" $OUT/this-cpu-*.md
