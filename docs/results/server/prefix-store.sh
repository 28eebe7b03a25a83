#!/usr/bin/env bash
# The prefix cache's stored copies (`adaspec serve --prefix-cache-mib`, docs/guide/server.md#the-prefix-cache-max-batch-1)
# on sessions that interleave, as agents sharing one server do: the agentic workload's four sessions (tool calls,
# SQL, extraction, code; each request its session's system prompt and one task) taken round robin, STEPS requests
# each, so consecutive requests never belong to the same session. Then the structured workload (27 tasks of three
# kinds, each kind with its own system prompt, in file order).
#   on    adaspec serve (default: stored copies, 1024 MiB)
#   off   adaspec serve --prefix-cache-mib 0 (the request before only: the prefix cache as it was)
# Both servers run the default speculation and are measured interleaved request by request
# (`bench --endpoint --baseline URL --interleave`), one client, greedy, 2 threads. Run on a QUIET machine.
#
# Usage: bash docs/results/server/prefix-store.sh OUTDIR   (STEPS=6 MAX_TOKENS=64; rerun to resume: a part whose
#        results file exists is skipped)
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT="$1"; mkdir -p "$OUT/logs"
STEPS=${STEPS:-6}; MAX_TOKENS=${MAX_TOKENS:-64}
git rev-parse HEAD > "$OUT/commit.txt"; lscpu > "$OUT/lscpu.txt"
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT
start() {  # PORT LOG [flags]
  local port=$1 log=$2; shift 2
  .venv/bin/adaspec serve --threads 2 --port "$port" "$@" > "$OUT/logs/$log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null && return; sleep 1; done
  echo "server on port $port did not start: $OUT/logs/$log" >&2; exit 1
}
stop() { kill "${PIDS[@]}" 2>/dev/null || true; wait "${PIDS[@]}" 2>/dev/null || true; PIDS=(); }
PYTHONPATH=src .venv/bin/python - "$OUT/agentic-interleaved.jsonl" "$STEPS" <<'PY'
import json, sys
from adaspec.workloads import load_workload
out, steps = sys.argv[1], int(sys.argv[2])
by = {}
for p in load_workload("agentic"):
    by.setdefault(p.category, []).append(p)
with open(out, "w") as f:
    for step in range(steps):
        for cat in sorted(by):
            if step < len(by[cat]):
                p = by[cat][step]
                f.write(json.dumps({"id": p.id, "category": p.category, "step": p.step,
                                    "messages": list(p.messages)}) + "\n")
PY
run() {  # PART WORKLOAD PROMPTS
  local part=$1 workload=$2 prompts=$3
  [ -s "$OUT/$part.jsonl" ] && { echo "$part: done already ($OUT/$part.jsonl)"; return; }
  echo "$(date -u +%FT%TZ) $part" | tee -a "$OUT/log.txt"
  start 8473 "$part-on.log"; start 8474 "$part-off.log" --prefix-cache-mib 0
  .venv/bin/adaspec bench --workload "$workload" --api chat --prompts "$prompts" --max-tokens "$MAX_TOKENS" \
    --concurrency 1 --interleave --request-timeout 300 --endpoint http://127.0.0.1:8473 \
    --baseline http://127.0.0.1:8474 --out "$OUT/$part.tmp.jsonl" >> "$OUT/log.txt" 2>&1
  mv "$OUT/$part.tmp.jsonl" "$OUT/$part.jsonl"
  stop
}
run agentic "$OUT/agentic-interleaved.jsonl" $((STEPS * 4))
run structured structured 27
echo "$(date -u +%FT%TZ) done" | tee -a "$OUT/log.txt"
