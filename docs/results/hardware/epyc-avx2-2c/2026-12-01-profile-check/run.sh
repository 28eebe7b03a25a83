#!/bin/bash
# Issue 17 item 8: does `adaspec profile` predict what `adaspec compare` then measures? Default models and runtime,
# 2 threads, nothing else running. For each workload: profile (3 sampled prompts, recommended configuration
# confirmed at 128 tokens), then compare that configuration against plain decoding on the workload's first prompts.
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../../..}"
A=".venv/bin/adaspec"; OUT=docs/results/issue17/profile
for W in humaneval code-edit gsm8k; do
  date
  [ -s $OUT/profile-$W.json ] || $A profile $W --threads 2 --sample 3 --json > $OUT/profile-$W.json 2> $OUT/profile-$W-log.txt
  M=$(.venv/bin/python -c "
import json; a = json.load(open('$OUT/profile-$W.json')); r = a['recommended']
print('plain' if a['enable'] == 'no' else r['drafter'] + '/' + r['controller'] + ('' if r['controller'] == 'goodput' else ':%d' % r['k']))")
  LIMIT=4; [ $W = code-edit ] && LIMIT=1
  [ "$M" = plain ] || $A compare --workloads $W --limit $LIMIT --methods "plain,$M" --max-new-tokens 128 \
    --temperatures 0 --threads 2 --out $OUT/compare-$W.jsonl --report $OUT/compare-$W.md > $OUT/compare-$W-log.txt 2>&1
done
date
# The code-edit check again on profile's own 3 sampled prompts (written to code-edit-sampled.jsonl by
# adaspec.bench.advise._sample), to separate the prompt sample from the prediction.
$A compare --workloads $OUT/code-edit-sampled.jsonl --methods plain,ngram/goodput --max-new-tokens 128 \
  --temperatures 0 --threads 2 --out $OUT/compare-code-edit-sampled.jsonl --report $OUT/compare-code-edit-sampled.md \
  > $OUT/compare-code-edit-sampled-log.txt 2>&1
date
