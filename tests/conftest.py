"""Test setup: CPU interpreter by default; the ``gpu`` marker skips cleanly without a GPU.

On a GPU machine, ``WORKBENCH_TEST_GPU=1 pytest -m gpu`` runs the GPU tests on the real
backend (the rest of the suite is written for the interpreter and its CPU tensors).
"""
from __future__ import annotations

import os

import pytest

# Before anything imports kernels: tests run the interpreter unless a GPU run is asked for.
if os.environ.get("WORKBENCH_TEST_GPU") != "1":
    os.environ.setdefault("KERNELS_BACKEND", "interpreter")

import kernels  # noqa: E402


@pytest.fixture
def make_row():
    """A valid results row; keyword arguments change fields."""
    from workbench.results import ResultRow

    def make(**change):
        base = dict(op="gemm", rung="v2", name="triton_tile", shape="4096x4096x4096", dtype="bfloat16",
                    ms=0.5, tflops=274.9, gbps=201.3, ratio_to_ref=0.8, gpu="AMD Instinct MI300X",
                    backend="hip", arch="gfx942", torch_version="2.13.0", triton_version="3.9.0",
                    commit="abc123", timestamp="2026-11-30T12:00:00+00:00")
        return ResultRow(**{**base, **change})
    return make


def pytest_collection_modifyitems(config, items):
    if kernels.backend.current().is_gpu:
        return
    skip = pytest.mark.skip(reason="needs a GPU (this run uses the Triton interpreter)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
