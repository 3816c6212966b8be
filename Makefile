# Two commands on a fresh Linux machine:
#   make tour   set up .venv and run the main job (check every rung, print the ladders)
#   make test   set up .venv and run the test suite (tests + notebooks)
#   make fuzz   the property-based fuzz tests alone, with many random examples (long profile)
# and one on a GPU machine:
#   make gpu    the gpu-marked tests, then `workbench gpu-report` (ceilings, quick suite,
#               rows into workbench/recorded/<gpu>-<date>.json), in under 8 minutes
#
# CPU-only machine: the defaults. NVIDIA: make ... EXTRAS=cuda,dev TORCH=torch
# ROCm: keep the system's ROCm torch and its pytorch-triton-rocm untouched:
#   make ... VENV_FLAGS=--system-site-packages TORCH= EXTRAS=amd,dev
# A GPU machine whose image already has torch, triton, numba and pytest (and may have no
# network): SYSTEM_PYTHON=1 runs `make gpu` on that python3 as it is, from this checkout,
# installing nothing:
#   make gpu SYSTEM_PYTHON=1
# and one that needs no GPU, only time and network (minutes per release, ~200 MB each):
#   make compat compile every Triton rung for gfx942, gfx950 and sm90 under each Triton
#               minor from PyPI (throwaway venvs under $TMPDIR); prints the matrix and
#               records it in workbench/triton_compat.json (README "Supported Triton versions");
#               Triton 3.4 without ROCm: TRITON_HIP_LLD_PATH=/usr/lib/llvm-19/bin/ld.lld make compat
PYTHON ?= python3
VENV ?= .venv
VENV_FLAGS ?=
TORCH ?= torch==2.13.0
EXTRAS ?= cpu,dev
PYTEST_WORKERS ?= 2
GPU_BUDGET_S ?= 300

ifdef SYSTEM_PYTHON
GPU_PYTHON := PYTHONPATH=$(CURDIR) $(PYTHON)
GPU_SETUP :=
else
GPU_PYTHON := $(VENV)/bin/python
GPU_SETUP := setup
endif

comma := ,
STAMP := $(VENV)/.installed-$(subst $(comma),_,$(EXTRAS))

.PHONY: setup tour test fuzz gpu compat clean

setup: $(STAMP)

$(STAMP): pyproject.toml binder/overrides.json
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(if $(TORCH),$(VENV)/bin/python -m pip install -q "$(TORCH)")
	$(VENV)/bin/python -m pip install -q -e ".[$(EXTRAS)]"
	mkdir -p $(VENV)/share/jupyter/lab/settings
	cp binder/overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json
	touch $@

tour: setup
	$(VENV)/bin/workbench tour

# The long tests are collected first (tests/conftest.py); work stealing hands an idle worker the
# other's queued tests, so neither waits for the other at the end. Bytecode is written even where
# the environment says not to (PYTHONDONTWRITEBYTECODE, set on this project's machines): the suite
# starts dozens of Python processes (workers, notebook kernels, compile helpers, CLI and gloo runs),
# and without .pyc files each compiles the package again and each collection rewrites every test
# module's asserts (-15 s of 110 on five of the files that start processes, measured).
test: setup
	PYTHONDONTWRITEBYTECODE= $(VENV)/bin/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal --timeout 900 --durations=30 tests --nbmake notebooks

# `make test` runs tests/fuzz too, in its bounded, derandomized `ci` profile.
fuzz: setup
	$(VENV)/bin/python -m pytest -n $(PYTEST_WORKERS) tests/fuzz --hypothesis-profile=long

# The quick suite runs once, inside gpu-report (which records its rows), so its gpu test
# is left out here; both steps run, and the first failure sets the exit status.
gpu: $(GPU_SETUP)
	status=0; WORKBENCH_TEST_GPU=1 $(GPU_PYTHON) -m pytest -m gpu --timeout 300 tests \
	    --deselect tests/test_timing.py::test_quick_suite_writes_one_results_file || status=$$?; \
	$(GPU_PYTHON) -m workbench.cli gpu-report --budget-s $(GPU_BUDGET_S) || status=$$?; \
	exit $$status

compat: setup
	nice -n 10 $(VENV)/bin/python -m workbench.isa.compat --torch "$(or $(TORCH),torch)"

clean:
	rm -rf $(VENV)
