#!/usr/bin/env bash
# Rebuild ik-llama-cpp-python from its source distribution for THIS CPU (-march=native), replacing the prebuilt
# wheel, whose kernels are AVX2-only. On AVX-512 CPUs ik_llama.cpp then takes its AVX-512/VNNI paths, which speed up
# the multi-token forwards of speculative verification (measured: docs/findings/ik-native.md). Where the CPU reports
# AMX, AMX code is left out (VMs that report AMX but do not grant it die with SIGILL).
#   usage: scripts/build_ik_native.sh PYTHON [VERSION]      (~10 min on 2 cores; `make ik-native` calls it)
# The 0.1.5 source distribution lacks common/cmake/build-info-gen-cpp.cmake (the wheel was built from git), so the
# build stops at "Generating build details from Git"; this script adds a two-line version of it. The prebuilt wheel's
# libraries find each other through auditwheel's RPATH; a source build needs $ORIGIN (libllama.so loads libggml.so).
set -euo pipefail
PY=${1:?usage: build_ik_native.sh PYTHON [VERSION]}
VERSION=${2:-0.1.5}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$PY" -m pip download -q --no-deps --no-binary :all: "ik-llama-cpp-python==$VERSION" -d "$WORK"
tar xzf "$WORK"/ik_llama_cpp_python-"$VERSION".tar.gz -C "$WORK"
SRC="$WORK/ik_llama_cpp_python-$VERSION"
GEN="$SRC/vendor/ik_llama.cpp/common/cmake/build-info-gen-cpp.cmake"
if [[ ! -f "$GEN" ]]; then
    mkdir -p "$(dirname "$GEN")"
    cat > "$GEN" <<'CMAKE'
include(${CMAKE_CURRENT_SOURCE_DIR}/cmake/build-info.cmake)
configure_file(${CMAKE_CURRENT_SOURCE_DIR}/common/build-info.cpp.in ${CMAKE_CURRENT_SOURCE_DIR}/common/build-info.cpp)
CMAKE
fi
NO_AMX=""
if grep -qm1 '^flags.* amx_tile' /proc/cpuinfo 2>/dev/null; then
    NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
echo "building ik-llama-cpp-python $VERSION with -march=native ${NO_AMX:+(AMX off: $NO_AMX)}"
CFLAGS="$NO_AMX" CXXFLAGS="$NO_AMX" CMAKE_ARGS="-DGGML_NATIVE=ON -DCMAKE_INSTALL_RPATH=\$ORIGIN ${CMAKE_ARGS:-}" \
    CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
    "$PY" -m pip install -q --no-deps --force-reinstall "$SRC"
"$PY" - <<'PYCHECK'
import ik_llama_cpp, pathlib
print("installed:", pathlib.Path(ik_llama_cpp.__file__).parent)
PYCHECK
