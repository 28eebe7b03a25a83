#!/bin/bash
# Issue 17, 2026-12-02: the roofline model's CPU check again, after measured profiles price a model matrix by
# matrix (HardwareProfile.linear_curves: each of its matrix shapes timed with the weights streamed from memory),
# instead of one 2560 x 10240 probe per 10^9 weights, which missed the Qwen2.5-0.5B by 27.5 % (fp32) / 22.3 % (bf16).
# Forward times measured afresh (roofline-cpu-2.jsonl; roofline-cpu.jsonl keeps the first run's), each shape's map
# made right after its bench, so measured and predicted sit minutes apart. 2 threads, nothing else running.
bash "$(dirname "$0")/roofline.sh" 2
