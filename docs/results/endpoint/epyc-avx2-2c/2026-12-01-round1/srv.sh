cd "$(dirname "$0")/../../.."
.venv/bin/adaspec serve --threads 2 --port 8012 > /tmp/serve.log 2>&1 &
S=$!
for i in $(seq 240); do curl -sf http://127.0.0.1:8012/v1/models >/dev/null && break; sleep 1; done
grep "plain step" /tmp/serve.log
.venv/bin/python docs/results/issue15/probe.py http://127.0.0.1:8012 2>&1 | cut -c1-200
kill $S; wait $S 2>/dev/null
