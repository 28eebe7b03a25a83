#!/bin/bash
# Issue 15: adaspec bench --endpoint measured here (2 threads, nothing else running). Each step resumes.
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
A=".venv/bin/adaspec"; PY=".venv/bin/python"; OUT=docs/results/issue15
GGUF="$HOME/.cache/adaspec/gguf/qwen2.5-coder-1.5b-instruct.gguf"
wait_up() { for _ in $(seq 240); do curl -sf "$1/v1/models" > /dev/null && return 0; sleep 1; done; echo "no server at $1"; exit 1; }
date
# 1. adaspec compare on 4 HumanEval prompts: plain vs the default (hybrid/goodput), 128 tokens, greedy.
$A compare --workloads humaneval --limit 4 --methods plain,hybrid/goodput --max-new-tokens 128 --temperatures 0 \
  --threads 2 --out $OUT/compare.jsonl --report $OUT/compare.md > $OUT/compare-log.txt 2>&1
date
# 2. The same prompts through adaspec serve (default models and speculation), measured as an endpoint; the baseline
#    arm turns speculation off per request on the same server.
$A serve --threads 2 --port 8011 > $OUT/serve-log.txt 2>&1 & SERVE=$!
wait_up http://127.0.0.1:8011
$A bench --endpoint http://127.0.0.1:8011 --baseline-body '{"speculation": {"drafter": "none"}}' \
  --workload humaneval --prompts 4 --max-tokens 128 --concurrency 1 --rounds 2 --out $OUT/adaspec-serve.jsonl
# 2b. A stateless configuration on both sides (n-gram drafts, fixed K = 4), so the two tools see the same engine:
#     compare's ngram/fixed:4 rows against the endpoint's, and plain against plain.
$A compare --workloads humaneval --limit 4 --methods plain,ngram/fixed:4 --max-new-tokens 128 --temperatures 0 \
  --threads 2 --out $OUT/compare.jsonl --report $OUT/compare-fixed.md > $OUT/compare-fixed-log.txt 2>&1
$A bench --endpoint http://127.0.0.1:8011 --body '{"speculation": {"drafter": "ngram", "controller": "fixed", "k": 4}}' \
  --baseline-body '{"speculation": {"drafter": "none"}}' --workload humaneval --prompts 4 --max-tokens 128 \
  --concurrency 1 --rounds 2 --out $OUT/adaspec-serve-fixed.jsonl
kill $SERVE; wait $SERVE
date
# 3. llama-cpp-python's own OpenAI server (a third-party engine): the 1.5B Q4_K_M target, prompt lookup (4 tokens)
#    on one port, plain on another; code-edit prompts (they repeat their input), 1 and 2 clients. Its default
#    --interrupt_requests True ends a running request when the next one arrives (first run, kept as
#    llamacpp-server-interrupt.jsonl: 3 of 4 requests failed at 2 clients); False queues them instead.
$PY -m llama_cpp.server --model "$GGUF" --host 127.0.0.1 --port 8021 --n_ctx 4096 --n_threads 2 \
  --interrupt_requests False > $OUT/llamacpp-plain-log.txt 2>&1 & PLAIN=$!
$PY -m llama_cpp.server --model "$GGUF" --host 127.0.0.1 --port 8022 --n_ctx 4096 --n_threads 2 \
  --interrupt_requests False --draft_model prompt-lookup-decoding --draft_model_num_pred_tokens 4 \
  > $OUT/llamacpp-pld-log.txt 2>&1 & PLD=$!
wait_up http://127.0.0.1:8021; wait_up http://127.0.0.1:8022
$A bench --endpoint http://127.0.0.1:8022 --baseline http://127.0.0.1:8021 --workload code-edit --prompts 4 \
  --max-tokens 128 --concurrency 1,2 --out $OUT/llamacpp-server.jsonl
kill $PLAIN $PLD; wait
date
# 4. Reports and advice.
$A map $OUT/adaspec-serve.jsonl --report $OUT/adaspec-serve.md --img-dir $OUT/img
$A map $OUT/adaspec-serve-fixed.jsonl --report $OUT/adaspec-serve-fixed.md --img-dir $OUT/img
$A map $OUT/llamacpp-server.jsonl --report $OUT/llamacpp-server.md --img-dir $OUT/img
$A map $OUT/llamacpp-server-interrupt.jsonl --report $OUT/llamacpp-server-interrupt.md --img-dir $OUT/img
$A advise --for vllm $OUT/adaspec-serve.jsonl > $OUT/advise-vllm.txt
$A advise --for llamacpp $OUT/llamacpp-server.jsonl > $OUT/advise-llamacpp.txt
