#!/usr/bin/env bash
# Structured outputs beside llama.cpp's own server (issues 36 and 38): the structured workload (strict JSON schemas
# and a required tool call, docs/guide/structured.md) sent through the OpenAI chat API to
#   llama-server plain, llama-server n-gram (n 3, m 8: its best speculative mode on these CPUs) and adaspec serve
#   (the default: hybrid-suffix drafter, goodput controller, grammar-forced drafts),
# all on the zoo's Q4_K_M GGUF, 2 threads, one client, greedy. Each pair is interleaved request by request
# (`bench --endpoint --baseline URL --interleave`), so a slow spell of the machine hits both arms of a pair:
#   1. adaspec default vs adaspec plain (the same server, speculation off per request)
#   2. llama-server n-gram vs llama-server plain
#   3. adaspec default vs llama-server plain
# Needs llama-server (`make peers`). Run on a QUIET machine; ~20 min for 27 tasks. Every server's log is kept.
#
# Usage: bash docs/results/structured/endpoint.sh OUTDIR   (PROMPTS=27 MAX_TOKENS=160 by default)
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT="$1"; mkdir -p "$OUT/logs"
PROMPTS=${PROMPTS:-27}; MAX_TOKENS=${MAX_TOKENS:-160}
PEERS=${ADASPEC_PEERS_DIR:-.peers}
LLAMA_SERVER=${LLAMA_SERVER:-$(find "$PEERS/llama-server" -name llama-server -type f 2>/dev/null | head -1 || true)}
[ -x "$LLAMA_SERVER" ] || { echo "llama-server not found (make peers, or LLAMA_SERVER=...)" >&2; exit 2; }
LIB="$(dirname "$(dirname "$LLAMA_SERVER")")/lib"
GGUF=$(.venv/bin/python -c "from adaspec.models import resolve_gguf; print(resolve_gguf('qwen2.5-coder-1.5b-instruct')[1])")
git rev-parse HEAD > "$OUT/commit.txt"; lscpu > "$OUT/lscpu.txt"
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT
llama() {  # PORT LOG [extra flags]: llama-server on the target GGUF with its chat template (--jinja: tools)
  local port=$1 log=$2; shift 2
  LD_LIBRARY_PATH="$LIB:${LD_LIBRARY_PATH:-}" "$LLAMA_SERVER" -m "$GGUF" --host 127.0.0.1 --port "$port" -t 2 -tb 2 \
    -c 4096 -np 1 --jinja --no-webui "$@" > "$OUT/logs/$log" 2>&1 &
  PIDS+=($!)
}
llama 8471 llama-plain.log
llama 8472 llama-ngram.log --spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 8
.venv/bin/adaspec serve --threads 2 --port 8473 > "$OUT/logs/adaspec-serve.log" 2>&1 &
PIDS+=($!)
for port in 8471 8472 8473; do
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null && break; sleep 1; done
done
B=(.venv/bin/adaspec bench --workload structured --api chat --prompts "$PROMPTS" --max-tokens "$MAX_TOKENS"
   --concurrency 1 --interleave --request-timeout 300)
echo "$(date -u +%FT%TZ) 1/3 adaspec default vs its plain" | tee -a "$OUT/log.txt"
"${B[@]}" --endpoint http://127.0.0.1:8473 --baseline http://127.0.0.1:8473 --baseline-body '{"speculation": {"drafter": "none"}}' \
  --out "$OUT/adaspec.jsonl" >> "$OUT/log.txt" 2>&1
echo "$(date -u +%FT%TZ) 2/3 llama-server n-gram vs its plain" | tee -a "$OUT/log.txt"
"${B[@]}" --endpoint http://127.0.0.1:8472 --baseline http://127.0.0.1:8471 --out "$OUT/llama.jsonl" >> "$OUT/log.txt" 2>&1
echo "$(date -u +%FT%TZ) 3/3 adaspec default vs llama-server plain" | tee -a "$OUT/log.txt"
"${B[@]}" --endpoint http://127.0.0.1:8473 --baseline http://127.0.0.1:8471 --out "$OUT/cross.jsonl" >> "$OUT/log.txt" 2>&1
echo "$(date -u +%FT%TZ) done" | tee -a "$OUT/log.txt"
