#!/bin/bash
# Quiet block 3: the structured benchmark on this machine (default drafter; then hybrid-suffix), new code.
cd /work/main
S=docs/results/structured/epyc-zen5-avx512-2c/2026-12-05; mkdir -p $S
git rev-parse --short HEAD > $S/commit.txt
date -u > $S/times.txt
PYTHONPATH=src .venv/bin/python docs/results/structured/bench.py --backend ik --threads 2 --limit 9 --max-new-tokens 160 \
   --out $S/results.jsonl --report $S/results.md > $S/log.txt 2>&1
date -u >> $S/times.txt
PYTHONPATH=src .venv/bin/python docs/results/structured/bench.py --backend ik --threads 2 --limit 9 --max-new-tokens 160 \
   --draft hybrid-suffix --methods plain,speculative \
   --out $S/results-hybrid-suffix.jsonl --report $S/results-hybrid-suffix.md > $S/log-hybrid-suffix.txt 2>&1
date -u >> $S/times.txt
