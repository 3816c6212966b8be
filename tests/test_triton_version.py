"""`import kernels` names an unsupported Triton at once, with the range and what to do."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

from kernels import triton_version
from kernels.triton_version import UnsupportedTritonError, UntestedTritonWarning

FLOOR, NEWEST = (f"{v[0]}.{v[1]}" for v in triton_version.GPU_RANGE)
BELOW = f"{triton_version.GPU_RANGE[0][0]}.{triton_version.GPU_RANGE[0][1] - 1}.1"
ABOVE = f"{triton_version.GPU_RANGE[1][0]}.{triton_version.GPU_RANGE[1][1] + 1}.0"

# Pretends to be a ROCm machine with an MI300X, then imports kernels under a given Triton.
_FAKE_GPU = """
import sys, types, torch, triton
triton.__version__ = sys.argv[1]
torch.version.hip = "6.4"
torch.cuda.is_available = lambda: True
torch.cuda.get_device_properties = lambda i: types.SimpleNamespace(
    gcnArchName="gfx942:sramecc+:xnack-", name="AMD Instinct MI300X", multi_processor_count=304)
import kernels
print(kernels.backend.current().name)
"""


def _import_kernels(version: str, fake_gpu: bool) -> subprocess.CompletedProcess:
    code = _FAKE_GPU if fake_gpu else "import sys, triton; triton.__version__ = sys.argv[1]; import kernels"
    env = {k: v for k, v in os.environ.items()
           if k not in ("KERNELS_BACKEND", "TRITON_INTERPRET", "NUMBA_ENABLE_CUDASIM")}
    return subprocess.run([sys.executable, "-c", code, version], env=env,
                          capture_output=True, text=True, timeout=120)


def test_an_older_triton_on_a_gpu_fails_at_import_naming_version_range_and_fix():
    result = _import_kernels(BELOW, fake_gpu=True)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("kernels.triton_version.UnsupportedTritonError: Triton " + BELOW)
    assert f"Triton {FLOOR} to {NEWEST}" in last and "pytorch-triton-rocm" in last


def test_a_supported_triton_on_a_gpu_imports_quietly():
    result = _import_kernels(f"{FLOOR}.0+rocm6.4", fake_gpu=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["hip"] and "Warning" not in result.stderr


def test_the_interpreter_warns_below_its_floor_and_says_why():
    result = _import_kernels("3.6.0", fake_gpu=False)
    assert result.returncode == 0, result.stderr
    assert "UntestedTritonWarning: Triton 3.6.0 is installed" in result.stderr
    assert "needs Triton >= 3.9" in result.stderr and "NumPy >= 2.4" in result.stderr


@pytest.mark.parametrize("backend", ["hip", "cuda"])
def test_gpu_floor_raises_and_newer_than_tested_warns(backend):
    with pytest.raises(UnsupportedTritonError, match=f"Triton {BELOW} is installed"):
        triton_version.check(backend, BELOW)
    with pytest.warns(UntestedTritonWarning, match=f"Triton {ABOVE} is newer.*make compat"):
        triton_version.check(backend, ABOVE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        triton_version.check(backend, f"{NEWEST}.0")
        triton_version.check(backend, f"{FLOOR}.0")


def test_interpreter_at_its_floor_is_quiet_whatever_the_gpu_range():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        triton_version.check("interpreter", "3.9.0")
        triton_version.check("interpreter", ABOVE)


def test_version_strings_of_local_builds_are_read():
    assert triton_version.minor("3.4.0+rocm6.4.1.git7bb8d9a") == (3, 4)
    assert triton_version.minor("3.10.0") == (3, 10)
    with pytest.raises(ValueError, match="'nightly'"):
        triton_version.minor("nightly")
