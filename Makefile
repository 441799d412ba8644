# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow notebooks lint format build clean gpu-check gpu-wheels

# (Re)create the virtual environment and install the project, editable, with its test tools.
# Reinstalls when the build inputs change, so the native module is always current.
# VARIOPATH_CUDA_STANDIN: also the test module over the CPU stand-in for CUDA (CMakeLists.txt,
# tests/test_cuda_standin.py); a wheel built without it (pip install .) has none.
$(STAMP): pyproject.toml CMakeLists.txt $(wildcard ffi/*.cc ffi/*.h ffi/*/*.cu ffi/*/*.h ffi/*/*.cc ffi/*/include/*.h)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]" --config-settings=cmake.define.VARIOPATH_CUDA_STANDIN=ON
	touch $(STAMP)

build: $(STAMP)

# Test-only wheels for what a CPU can prove about the GPU build (issue 52): JAX's CUDA plugin of
# the installed jaxlib's exact version (deviceless compiles for eight H100s, tests/test_cuda_aot.py)
# and NCCL (the loader test, tests/test_nccl.py). pyproject's `test` extra cannot say --no-deps,
# so they are installed here, each into its own folder off the virtual environment's path
# (importable, the plugin makes every jax process without a GPU print its failure). A wheel that
# cannot be installed (offline, no such version) only skips its tests; a success is kept until
# jaxlib changes.
GPU_WHEELS := $(VENV)/gpu-wheels
GPU_PIP := $(PY) -m pip install --quiet --no-deps --retries 1 --timeout 30 --upgrade --target

gpu-wheels: $(STAMP)
	@v=$$($(PY) -c "import jaxlib; print(jaxlib.__version__)"); \
	if [ "$$(cat $(GPU_WHEELS)/plugin/.version 2>/dev/null)" != "$$v" ]; then \
	  rm -rf $(GPU_WHEELS)/plugin; \
	  if $(GPU_PIP) $(GPU_WHEELS)/plugin "jax-cuda13-plugin==$$v" "jax-cuda13-pjrt==$$v"; \
	  then echo "$$v" > $(GPU_WHEELS)/plugin/.version; \
	  else rm -rf $(GPU_WHEELS)/plugin; \
	    echo "note: no jax-cuda13-plugin/pjrt $$v installed: tests/test_cuda_aot.py will skip"; fi; \
	fi; \
	if [ ! -f $(GPU_WHEELS)/nccl/.installed ]; then \
	  if $(GPU_PIP) $(GPU_WHEELS)/nccl nvidia-nccl-cu13; then touch $(GPU_WHEELS)/nccl/.installed; \
	  else rm -rf $(GPU_WHEELS)/nccl; \
	    echo "note: no nvidia-nccl-cu13 installed: the NCCL wheel's loader test will skip"; fi; \
	fi

demo: $(STAMP)
	$(VENV)/bin/variopath topo show r5080-bf3 --nodes 2
	$(VENV)/bin/variopath demo

test: $(STAMP) gpu-wheels
	$(PY) -m ruff check variopath_jax solver tests benchmarks notebooks
	$(PY) -m pytest -q

test-slow: $(STAMP) gpu-wheels
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
