#!/bin/bash
# adaspec beside the engines a CPU user would pick instead (issue 36): plain decoding and the default
# (hybrid-suffix/goodput; runs before 2026-12-07 used hybrid/goodput, the default then) against llama.cpp's own
# server (plain, n-gram, 0.5B draft), llama-cpp-python's prompt lookup and OpenVINO GenAI (plain, prompt lookup),
# interleaved per prompt, each peer in its own process. The same families and prompts as
# docs/results/new-text/run.sh: new code (Spec-Bench coding), chat (Spec-Bench writing), HumanEval, code edits,
# GSM8K; 2 prompts per category, 128 tokens, greedy, 2 threads, ik_llama.cpp for adaspec.
#
# Needs the peers: `make peers` (or ADASPEC_LLAMA_SERVER / ADASPEC_OPENVINO_PYTHON, see docs/peers.md); a peer
# that is missing gets "not installed" rows, the rest still runs. About 20 min on 2 cores; compare stops starting
# new prompts after TIME_LIMIT minutes (default 18; prompts go round-robin over the families, so a stopped run
# covers them all) and a rerun with the same OUTDIR continues where it stopped.
#
# Usage: run.sh OUTDIR [CHRT]     e.g. run.sh docs/results/peers/epyc-2026-12-04
#   (CHRT, e.g. "chrt -f 50": real-time priority for a machine where other work cannot be stopped; say so.)
#   METHODS=... overrides the method list (e.g. add llama-server:draft+ngram, llama-server:draft:16, openvino:draft).
set -u
cd "${ADASPEC_REPO:-$(dirname "$0")/../../..}"
OUT="$1"; PRIO="${2:-}"; mkdir -p "$OUT"
W="specbench:coding,specbench:writing,humaneval,code-edit,gsm8k"
M="${METHODS:-plain,hybrid-suffix/goodput,llama-server:plain,llama-server:ngram,llama-server:draft,llamacpp:pld,openvino:plain,openvino:lookup}"
git rev-parse HEAD > "$OUT/commit.txt"; grep -m1 "model name" /proc/cpuinfo > "$OUT/cpu.txt"; nproc >> "$OUT/cpu.txt"
$PRIO .venv/bin/adaspec compare --threads 2 --workloads $W --limit 2 --max-new-tokens 128 --methods "$M" \
  --time-limit "${TIME_LIMIT:-18}" --out "$OUT/peers.jsonl" --report "$OUT/report.md" > "$OUT/log.txt" 2>&1
.venv/bin/python "$(dirname "$0")/table.py" "$OUT" > "$OUT/README.md"
cat "$OUT/README.md"
