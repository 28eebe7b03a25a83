#!/usr/bin/env bash
# Structured outputs beside llama.cpp's own server (issues 36 and 38): the structured workload (strict JSON schemas
# and a required tool call, docs/guide/structured.md) sent through the OpenAI chat API, streamed, one client,
# greedy, 2 threads, all on the zoo's Q4_K_M GGUF. Each pair of servers is started fresh (no cache of an earlier
# pair: neither adaspec's suffix cache nor llama-server's prompt cache has seen the prompts) and measured
# interleaved request by request (`bench --endpoint --baseline URL --interleave`), so a slow spell of the machine
# hits both arms of a pair:
#   adaspec    adaspec serve (the default: hybrid-suffix drafter, goodput controller, grammar-forced drafts)
#              vs `adaspec serve --draft none` (plain decoding)
#   llama      llama-server n-gram (n 3, m 8: its best speculative mode on these CPUs) vs llama-server plain
#   cross      adaspec serve (default) vs llama-server plain
#   prefix     adaspec serve (default) vs `adaspec serve --no-prefix-cache` (the prefix cache between requests)
# A pair named NAME-tools runs NAME on the tool-call tasks alone (`--workload structured:tool-translate`, 9 tasks):
# requests one after another that share their system prompt (the tool's definition), as an agent's do.
# Needs llama-server (`make peers`). Run on a QUIET machine; ~5 min per pair for 27 tasks. Every server's log is
# kept in OUTDIR/logs; a pair whose results file exists is skipped (rerun to resume).
#
# Usage: bash docs/results/structured/endpoint.sh OUTDIR [PAIR ...]   (default: adaspec llama cross prefix
#        prefix-tools cross-tools; PROMPTS=27 MAX_TOKENS=160)
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT="$1"; shift; mkdir -p "$OUT/logs"
PAIRS=("${@:-adaspec llama cross prefix prefix-tools cross-tools}"); PAIRS=(${PAIRS[*]})
PROMPTS=${PROMPTS:-27}; MAX_TOKENS=${MAX_TOKENS:-160}
PEERS=${ADASPEC_PEERS_DIR:-.peers}
LLAMA_SERVER=${LLAMA_SERVER:-$(find "$PEERS/llama-server" -name llama-server -type f 2>/dev/null | head -1 || true)}
[ -x "$LLAMA_SERVER" ] || { echo "llama-server not found (make peers, or LLAMA_SERVER=...)" >&2; exit 2; }
LIB="$(dirname "$(dirname "$LLAMA_SERVER")")/lib"
GGUF=$(.venv/bin/python -c "from adaspec.models import resolve_gguf; print(resolve_gguf('qwen2.5-coder-1.5b-instruct')[1])")
git rev-parse HEAD > "$OUT/commit.txt"; lscpu > "$OUT/lscpu.txt"
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT
start() {  # PORT LOG KIND [flags]: KIND llama (llama-server with its chat template; --jinja for tools) or adaspec
  local port=$1 log=$2 kind=$3; shift 3
  if [ "$kind" = llama ]; then
    LD_LIBRARY_PATH="$LIB:${LD_LIBRARY_PATH:-}" "$LLAMA_SERVER" -m "$GGUF" --host 127.0.0.1 --port "$port" -t 2 \
      -tb 2 -c 4096 -np 1 --jinja --no-webui "$@" > "$OUT/logs/$log" 2>&1 &
  else
    .venv/bin/adaspec serve --threads 2 --port "$port" "$@" > "$OUT/logs/$log" 2>&1 &
  fi
  PIDS+=($!)
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null && return; sleep 1; done
  echo "server on port $port did not start: $OUT/logs/$log" >&2; exit 1
}
stop() { kill "${PIDS[@]}" 2>/dev/null || true; wait "${PIDS[@]}" 2>/dev/null || true; PIDS=(); }
NGRAM=(--spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 8)
for pair in "${PAIRS[@]}"; do
  [ -s "$OUT/$pair.jsonl" ] && { echo "$pair: done already ($OUT/$pair.jsonl)"; continue; }
  echo "$(date -u +%FT%TZ) $pair" | tee -a "$OUT/log.txt"
  workload=structured; prompts=$PROMPTS
  [ "${pair%-tools}" != "$pair" ] && { workload=structured:tool-translate; prompts=9; }
  case ${pair%-tools} in
    adaspec) start 8473 "$pair-default.log" adaspec; start 8474 "$pair-plain.log" adaspec --draft none ;;
    llama) start 8473 "$pair-ngram.log" llama "${NGRAM[@]}"; start 8474 "$pair-plain.log" llama ;;
    cross) start 8473 "$pair-adaspec.log" adaspec; start 8474 "$pair-llama.log" llama ;;
    prefix) start 8473 "$pair-on.log" adaspec; start 8474 "$pair-off.log" adaspec --no-prefix-cache ;;
    *) echo "unknown pair $pair (adaspec, llama, cross, prefix, each with -tools or not)" >&2; exit 2 ;;
  esac
  .venv/bin/adaspec bench --workload "$workload" --api chat --prompts "$prompts" --max-tokens "$MAX_TOKENS" \
    --concurrency 1 --interleave --request-timeout 300 --endpoint http://127.0.0.1:8473 \
    --baseline http://127.0.0.1:8474 --out "$OUT/$pair.tmp.jsonl" >> "$OUT/log.txt" 2>&1
  mv "$OUT/$pair.tmp.jsonl" "$OUT/$pair.jsonl"
  stop
done
echo "$(date -u +%FT%TZ) done" | tee -a "$OUT/log.txt"
