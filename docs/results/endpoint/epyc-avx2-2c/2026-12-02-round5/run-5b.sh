#!/bin/bash
# Issue 15, 2026-12-02: run-5.sh continued (one more alternation: server d, compare e) after its second endpoint
# run's default arm came out 50 % slow (one server whose goodput controller drafted short: mean K 2.9). Run-5:
# the server runs its warm-up on the generation thread (one OpenMP team per process; see
# ModelHost.on_generation_thread). Earlier text of run-4.sh follows.
#
# The VM's speed drifts by 10-20 % over
# minutes, and run-2/run-3 measured compare, then the server, then compare once each. Here the two tools alternate
# three times (compare, server, compare, server, compare, server, compare), each endpoint run against the mean of
# the compare runs on either side of it. Same prompts and settings as run-2.sh (4 HumanEval prompts, 128 tokens,
# greedy, default runtime and models); one endpoint round per server start.
# The commands that ran are those of alternate.sh with the steps below (written out here when it ran).
AGREEMENT=agreement-5b.md exec bash "$(dirname "$0")/alternate.sh" 5 sd ce
