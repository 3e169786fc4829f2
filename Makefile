# Two entry points do all set-up on a fresh machine:
#   make run    - installs sopctl with the embedded local model and runs the software company SOP
#   make test   - installs sopctl with its test tools and runs the whole test suite
#   make lint   - ruff and mypy (CI runs it before the tests)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
IDEA ?= a command-line 2048 game
# llama.cpp is built from source once per machine (pip caches the wheel); leave out what we never use.
LLAMA_CMAKE_ARGS := -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \
  -DGGML_FMA=ON -DGGML_F16C=ON

.PHONY: run test lint bench install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

install: $(BIN)/python
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip install --quiet -e '.[local,dev]'

run: install
	$(BIN)/sopctl run sops/software_company.sop.yaml --idea "$(IDEA)"

test: install
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check engine tests bench
	$(BIN)/mypy

bench: install
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) runs .pytest_cache
