#!/bin/bash
# Quiet block: ik-native curves; depth-probe A/B (old aa57364 vs new cc7acfa) alternated twice on agentic and new text; native agentic.
cd /work/main
PY=/work/main/.venv/bin/python
R=docs/results
AB=$R/controls/epyc-zen5-avx512-2c/2026-12-05-depth-probe; mkdir -p $AB
echo "start $(date -u)" > $AB/times.txt
NATIVE=/work/iknative OUT=$R/ik-native/epyc-zen5-avx512-2c/2026-12-05 ROUNDS=3 bash $R/ik-native/run.sh > /tmp/iknative.log 2>&1
echo "curves done $(date -u)" >> $AB/times.txt
run() {  # version src pass
  local v=$1 src=$2 p=$3
  PYTHONPATH=$src $PY -m adaspec compare --workloads agentic --limit 10 --methods plain,hybrid/goodput,suffix/goodput \
    --max-new-tokens 48 --threads 2 --backend ik --out $AB/agentic-$v-$p.jsonl > $AB/log-agentic-$v-$p.txt 2>&1
  PYTHONPATH=$src $PY -m adaspec compare --workloads specbench:coding,specbench:writing,code-edit --limit 2 \
    --methods plain,hybrid/goodput --max-new-tokens 128 --threads 2 --backend ik --out $AB/newtext-$v-$p.jsonl > $AB/log-newtext-$v-$p.txt 2>&1
  echo "$v pass $p done $(date -u)" >> $AB/times.txt
}
run old /work/wt-old/src 1
run new /work/main/src 1
run new /work/main/src 2
run old /work/wt-old/src 2
N=$R/suffix/epyc-zen5-avx512-2c/2026-12-05-steps10-native; mkdir -p $N
LD_LIBRARY_PATH=/work/iknative/ik_llama_cpp/lib PYTHONPATH=/work/iknative:src $PY -m adaspec compare --workloads agentic --limit 10 \
   --methods plain,hybrid/goodput,suffix/goodput,hybrid-suffix/goodput --max-new-tokens 48 --threads 2 --backend ik \
   --out $N/agentic.jsonl --report $N/agentic.md > $N/log.txt 2>&1
echo "native agentic done $(date -u)" >> $AB/times.txt
