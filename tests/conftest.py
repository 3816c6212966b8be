"""Test setup: CPU interpreter by default; the ``gpu`` marker skips cleanly without a GPU."""
from __future__ import annotations

import os

import pytest

# Before anything imports kernels: tests run the interpreter unless a GPU run is asked for.
if os.environ.get("WORKBENCH_TEST_GPU") != "1":
    os.environ.setdefault("KERNELS_BACKEND", "interpreter")

import kernels  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if kernels.backend.current().is_gpu:
        return
    skip = pytest.mark.skip(reason="needs a GPU (this run uses the Triton interpreter)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
