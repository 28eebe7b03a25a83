#!/bin/bash
# Issue 17, 2026-12-02 (later): the roofline model's CPU check with layer-sequence curves: measured profiles now also
# time a decoder layer's seven matrix products in model order (HardwareProfile.layer_curves, measure_layer_curve),
# since run 2 found the same matrices ~20 % dearer interleaved as a forward runs them than streamed shape by shape
# (fp32: 13-14 % median error). Same commands as run-2.sh, forward times measured afresh (roofline-cpu-3.jsonl), each
# shape's maps made right after its bench. 2 threads, nothing else running.
bash "$(dirname "$0")/roofline.sh" 3
