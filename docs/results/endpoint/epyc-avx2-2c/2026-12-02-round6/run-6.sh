#!/bin/bash
# Issue 15, 2026-12-02 (second session): run-5.sh/run-5b.sh repeated after the goodput controller's seeded
# verification curve gives only the shape and the live steps its level (CostModel.verify_ms, first form: the level
# from the nearest run width). Run 5's second server had warmed up while the VM ran ~20 % slow (plain step 80 ms
# against 63-69 ms), drafted at mean K 2.9 instead of 4.7-5.8, and decoded at half the speed of the compare runs
# beside it. The server now prints the curve it measured. Four alternations; the commands that ran are those of
# alternate.sh (written out here when it ran; moved there unchanged for run 7).
exec bash "$(dirname "$0")/alternate.sh" 6
