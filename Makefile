# Two commands on a fresh Linux machine:
#   make tour   set up .venv and run the main job (check every rung, print the ladders)
#   make test   set up .venv and run the test suite (tests + notebooks)
#
# CPU-only machine: the defaults. NVIDIA: make ... EXTRAS=cuda,dev TORCH=torch
# ROCm: keep the system's ROCm torch and its pytorch-triton-rocm untouched:
#   make ... VENV_FLAGS=--system-site-packages TORCH= EXTRAS=amd,dev
PYTHON ?= python3
VENV ?= .venv
VENV_FLAGS ?=
TORCH ?= torch==2.13.0
EXTRAS ?= cpu,dev
PYTEST_WORKERS ?= 2

STAMP := $(VENV)/.installed-$(subst $(comma),_,$(EXTRAS))
comma := ,

.PHONY: setup tour test clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(if $(TORCH),$(VENV)/bin/python -m pip install -q "$(TORCH)")
	$(VENV)/bin/python -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

tour: setup
	$(VENV)/bin/workbench tour

test: setup
	$(VENV)/bin/python -m pytest -n $(PYTEST_WORKERS) --timeout 900 tests --nbmake notebooks

clean:
	rm -rf $(VENV)
