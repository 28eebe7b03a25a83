#!/bin/bash
# Suffix decoding (issue 37) on the default configuration: ik_llama.cpp, Qwen2.5-Coder-1.5B target, 0.5B draft,
# 2 threads, nothing else running. About 7-8 minutes (each compare stops starting prompts at its --time-limit).
# Rerunning resumes the compare files (the answers already there are put back into each method's suffix cache).
# Writes, in $OUT (default: this folder): agentic.jsonl/.md, edits-novel.jsonl/.md, tree_cost.json, summary.md.
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
PY="${PYTHON:-.venv/bin/python}"
export PYTHONPATH=src  # this checkout's adaspec
A="$PY -m adaspec"
HERE=docs/results/suffix  # the helper scripts (the cwd is the repository), wherever OUT points
OUT=${OUT:-docs/results/suffix}; mkdir -p "$OUT"
STEPS="${STEPS:-5}"      # session steps per agentic category (4 categories)
TOKENS="${TOKENS:-48}"   # new tokens per request
CACHED="${CACHED:-100000}"  # tokens in the global tree for the cost measurement
M="plain,hybrid/goodput,suffix/goodput,hybrid-suffix/goodput"
date
# 1. Agentic sessions (tool calls over GSM8K and HumanEval, SQL over one schema, extraction): steps run in order,
#    each method keeps its own suffix cache across the run; speedup per step index in the report.
$A compare --workloads agentic --limit "$STEPS" --methods "$M" --max-new-tokens "$TOKENS" --threads 2 \
  --out $OUT/agentic.jsonl --report $OUT/agentic.md --time-limit 4.3 > $OUT/log-agentic.txt 2>&1
date
# 2. Code edits (one of each edit kind) and novel prompts (Spec-Bench QA): no earlier request shares their structure;
#    the suffix caches start empty (the first prompt sees an empty cache, later ones only unrelated answers).
$A compare --workloads code-edit,specbench:qa --limit 2 --methods "$M" --max-new-tokens "$TOKENS" --threads 2 \
  --out $OUT/edits-novel.jsonl --report $OUT/edits-novel.md --time-limit 1.6 > $OUT/log-edits-novel.txt 2>&1
date
# 3. The global tree's lookup + update cost per step at 100k cached tokens vs a plain target step; bytes per token.
$PY $HERE/tree_cost.py --cached "$CACHED" --threads 2 --out $OUT/tree_cost.json > $OUT/log-tree.txt 2>&1
date
# 4. The summary against the issue's targets.
$PY $HERE/summary.py $OUT > $OUT/summary.md
cat $OUT/summary.md
