#!/usr/bin/env bash
# ik_llama.cpp's prebuilt wheel (AVX2 kernels) against a build for this CPU (`make ik-native`), alternated ROUNDS
# times in fresh processes, on a QUIET machine (~1 min per curve). The native build is read from NATIVE (a folder
# holding an `ik_llama_cpp` package, e.g. `pip install --no-deps --target DIR <the wheel scripts/build_ik_native.sh
# builds>`); the wheel from the venv. Writes OUT/curves.jsonl and OUT/summary.md.
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}
NATIVE=${NATIVE:?set NATIVE to the folder that holds the native build of ik_llama_cpp}
OUT=${OUT:?set OUT to the run folder}
ROUNDS=${ROUNDS:-3}
mkdir -p "$OUT"
for r in $(seq "$ROUNDS"); do
    PYTHONPATH=src "$PY" docs/results/ik-native/curve.py --label wheel --out "$OUT/curves.jsonl"
    LD_LIBRARY_PATH="$NATIVE/ik_llama_cpp/lib" PYTHONPATH="$NATIVE:src" "$PY" docs/results/ik-native/curve.py \
        --label native --out "$OUT/curves.jsonl"
done
"$PY" docs/results/ik-native/summary.py "$OUT/curves.jsonl" > "$OUT/summary.md"
cat "$OUT/summary.md"
