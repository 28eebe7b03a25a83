# Quick start:   make demo   (venv + package + default models, then a real --compare run)
#                make test   (venv + package + test models, then the test suite)
PY ?= python3
# llama-cpp-python (the llama.cpp backend) builds llama.cpp from source once (10-14 min on 2 cores; pip caches the
# wheel). Its multimodal library is not needed here. Add e.g. CMAKE_ARGS=-DGGML_CUDA=on for a GPU build.
VENV ?= .venv
BIN := $(VENV)/bin
PROMPT ?= Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring and type hints.

.PHONY: setup demo test test-fast models

$(BIN)/adaspec: pyproject.toml constraints-cpu.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	CMAKE_ARGS="-DLLAVA_BUILD=OFF $(CMAKE_ARGS)" $(BIN)/python -m pip install -q -c constraints-cpu.txt -e ".[test,llamacpp]"
	touch $(BIN)/adaspec

setup: $(BIN)/adaspec

models: setup
	$(BIN)/adaspec models fetch qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct

demo: models
	$(BIN)/adaspec generate "$(PROMPT)" --compare --threads 2

test: setup
	$(BIN)/adaspec models fetch smollm2-135m-instruct
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"
