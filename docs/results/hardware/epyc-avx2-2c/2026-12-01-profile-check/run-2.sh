#!/bin/bash
# Issue 17 item 8, second check (2026-12-02, the Intel Xeon session; default models and runtime, 2 threads, nothing
# else running). For each workload: `adaspec profile` on 5 prompts spread over the workload (its JSON now lists
# them in prompt_ids), then `adaspec compare` of the recommended configuration against plain decoding at 128
# tokens (a) on those same 5 prompts, the check the issue describes, and (b) on 8 other prompts spread over the
# workload (none of profile's), an out-of-sample check of the interval.
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../../..}"
A=".venv/bin/adaspec"; PY=".venv/bin/python"; OUT=docs/results/issue17/profile/xeon-avx512
mkdir -p $OUT
for W in humaneval code-edit gsm8k; do
  date
  [ -s $OUT/profile-$W.json ] || $A profile $W --threads 2 --sample 5 --json > $OUT/profile-$W.json \
    2> $OUT/profile-$W-log.txt
  M=$($PY -c "
import json; a = json.load(open('$OUT/profile-$W.json')); r = a['recommended']
print('plain' if a['enable'] == 'no' else r['drafter'] + '/' + r['controller'] + ('' if r['controller'] == 'goodput' else ':%d' % r['k']))")
  # the two prompt sets, as JSONL workloads: profile's own, and 8 others spread over the rest of the workload
  $PY -c "
import json
from adaspec.bench.advise import _sample
from adaspec.workloads import load_workload
seen = set(json.load(open('$OUT/profile-$W.json'))['prompt_ids'])
prompts = load_workload('$W')
sets = {'sampled': [p for p in prompts if p.id in seen], 'others': _sample([p for p in prompts if p.id not in seen], 8)}
for name, ps in sets.items():
    with open('$OUT/$W-' + name + '.jsonl', 'w') as f:
        for p in ps:
            f.write(json.dumps({'id': p.id, 'category': p.category, 'prompt': p.text}) + '\n')
"
  for S in sampled others; do
    [ "$M" = plain ] || $A compare --workloads $OUT/$W-$S.jsonl --methods "plain,$M" --max-new-tokens 128 \
      --temperatures 0 --threads 2 --out $OUT/compare-$W-$S.jsonl --report $OUT/compare-$W-$S.md \
      > $OUT/compare-$W-$S-log.txt 2>&1
  done
done
date
