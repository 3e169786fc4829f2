# Two entry points do all set-up on a fresh machine:
#   make run    - installs sopctl with the embedded local model and runs the software company SOP
#   make test   - installs sopctl with its test tools and runs the whole test suite
#   make lint   - ruff and mypy (CI runs it before the tests)
#   make test-py310 - the fast suite again on Python 3.10, the oldest we support, where this machine has it
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
IDEA ?= a command-line 2048 game
# llama.cpp is built from source once per machine (pip caches the wheel); leave out what we never use.
LLAMA_CMAKE_ARGS := -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \
  -DGGML_FMA=ON -DGGML_F16C=ON

.PHONY: run test test-py310 lint bench install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

install: $(BIN)/python
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip install --quiet -e '.[local,dev]'

run: install
	$(BIN)/sopctl run sops/software_company.sop.yaml --idea "$(IDEA)"

test: install
	$(BIN)/python -m pytest -q

# pyenv's 3.10 first (its shim answers for python3.10 even where no 3.10 is selected)
PY310 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.10*/bin/python3.10) $(shell command -v python3.10 2>/dev/null))

test-py310:
ifeq ($(PY310),)
	@echo "no Python 3.10 on this machine: the 3.10 run is skipped"
else
	test -x .venv310/bin/python || $(PY310) -m venv .venv310
	.venv310/bin/pip install --quiet --upgrade pip
	.venv310/bin/pip install --quiet -e '.[dev]'
	.venv310/bin/python -m pytest -q -m "not slow"
endif

lint: install
	$(BIN)/ruff check engine tests bench
	$(BIN)/mypy

bench: install
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .venv310 runs .pytest_cache
