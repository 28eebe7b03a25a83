#!/bin/bash
# Issue 37's study of suffix decoding, on the default configuration: ik_llama.cpp, Qwen2.5-Coder-1.5B target,
# 2 threads, nothing else running. About 7 minutes (each part stops starting prompts at its time limit); rerunning
# resumes every part (the answers already written go back into each method's suffix cache).
# Writes, in $OUT (default: this folder): rule.jsonl/.md, cache-size.jsonl/.md, study-cost.json, study.md (and log-study-*.txt).
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
PY="${PYTHON:-.venv/bin/python}"
export PYTHONPATH=src  # this checkout's adaspec
A="$PY -m adaspec"
HERE=docs/results/suffix  # the helper scripts (the cwd is the repository), wherever OUT points
OUT=${OUT:-docs/results/suffix}; mkdir -p "$OUT"
STEPS="${STEPS:-4}"      # session steps per agentic category (4 categories)
TOKENS="${TOKENS:-48}"   # new tokens per request
LIMIT_RULE="${LIMIT_RULE:-3.2}" LIMIT_SIZE="${LIMIT_SIZE:-2.6}"  # minutes after which a part starts no prompt
date
# (a) What sets the speculation length on the agentic sessions: the paper's max_spec_factor/min_token_prob rule
#     alone (fixed K that never binds), the rule with the goodput controller's K (today's suffix/goodput), the
#     goodput controller pricing each candidate token's frequency with its confidence stop (stop=1, no rule), and
#     the goodput controller's K alone. Acceptance, tau and speedup in rule.md and study.md.
RULE="plain,suffix/fixed:16,suffix/goodput,suffix:factor=16;prob=0;stop=1/goodput,suffix:factor=16;prob=0/goodput"
$A compare --workloads agentic --limit "$STEPS" --methods "$RULE" --max-new-tokens "$TOKENS" --threads 2 \
  --out $OUT/rule.jsonl --report $OUT/rule.md --time-limit "$LIMIT_RULE" > $OUT/log-study-rule.txt 2>&1
date
# (b) Cache size (1k, 10k, 100k tokens) with 2,000 tokens of other answers cached before each request, and speedup
#     by session step (how many earlier requests share the structure).
$PY $HERE/cache_study.py --steps "$STEPS" --tokens "$TOKENS" --threads 2 --sizes 1000,10000,100000 --filler 2000 \
  --out $OUT/cache-size.jsonl --report $OUT/cache-size.md --time-limit "$LIMIT_SIZE" > $OUT/log-study-size.txt 2>&1
date
# (c) Memory per cached token and the global tree's lookup + update cost per step at 100k cached tokens, against a
#     plain target step (once: delete study-cost.json to measure again).
[ -s $OUT/study-cost.json ] || $PY $HERE/tree_cost.py --cached 100000 --threads 2 --out $OUT/study-cost.json \
  > $OUT/log-study-cost.txt 2>&1
date
$PY $HERE/study_summary.py $OUT > $OUT/study.md
cat $OUT/study.md
