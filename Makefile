# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow notebooks lint format build clean gpu-check

# (Re)create the virtual environment and install the project, editable, with its test tools.
# Reinstalls when the build inputs change, so the native module is always current.
$(STAMP): pyproject.toml CMakeLists.txt $(wildcard ffi/*.cc ffi/*.h ffi/*/*.cu ffi/*/*.h ffi/*/*.cc)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

build: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/variopath topo show r5080-bf3 --nodes 2
	$(VENV)/bin/variopath demo

test: $(STAMP)
	$(PY) -m ruff check variopath_jax solver tests benchmarks notebooks
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# Every notebook at full size (the tests run them small); refreshes the README's thumbnails and
# keeps the executed notebooks, with their outputs, in out/notebooks.
notebooks: $(STAMP)
	$(PY) -m variopath_jax.notebooks --size full --thumbnails docs/img/notebooks --out out/notebooks

# First contact with a GPU machine (issues 16, 52): builds there with its own python3 for that
# GPU only, one process per check, the verdict last (scripts/README.md). Needs no virtual
# environment and no registry; `bash scripts/gpu_first.sh --platform cpu` is its dry run here.
gpu-check:
	bash scripts/gpu_first.sh

lint: $(STAMP)
	$(PY) -m ruff check variopath_jax solver tests benchmarks notebooks

format: $(STAMP)
	$(PY) -m ruff format variopath_jax solver tests benchmarks notebooks
	$(PY) -m ruff check --fix variopath_jax solver tests benchmarks notebooks

clean:
	rm -rf $(VENV) build
