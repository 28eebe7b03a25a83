cd "$(dirname "$0")/../../.."
cmp() { rm -f /tmp/ci.jsonl; .venv/bin/adaspec compare --workloads humaneval --limit 4 --methods plain --max-new-tokens 128 --temperatures 0 --threads 2 --out /tmp/ci.jsonl >/dev/null 2>&1; .venv/bin/python -c "
from adaspec.compare import read_results, summarize; from pathlib import Path
t = summarize(read_results(Path('/tmp/ci.jsonl'))); print('$1', round(list(t.values())[0]['plain']['tokens_per_s'], 2))"; }
cmp alone-1
.venv/bin/adaspec serve --threads 2 --port 8012 > /tmp/serve-idle.log 2>&1 & S=$!
for i in $(seq 240); do curl -sf http://127.0.0.1:8012/v1/models >/dev/null && break; sleep 1; done
sleep 5
cmp server-idle-beside
kill $S; wait $S 2>/dev/null
cmp alone-2
