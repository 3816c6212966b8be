"""Which torch releases the package was run under, and the warning ``import kernels`` gives below them.

CI runs the suite under torch 2.13 (the CPU wheel ``make`` installs). On 2026-12-07 it also ran whole,
on a CPU, under torch 2.12.0 and 2.11.0 (PyPI's cu130 wheels, Triton 3.9 for the interpreter; 2.11 is
the torch of the GPU image this project is lent): README "Supported PyTorch versions". What fails
under 2.11 is torch's own: its CPU ``torch._scaled_mm`` takes per-tensor scales only, so the FP8 GEMM
baseline (``gemm_fp8`` ``ref``, which the CPU checks of every FP8 rung compare with) refuses its
row-wise call (2.12's takes it); its CPU SDPA crashes on inputs with no heads. On a GPU torch's BLAS
takes row-wise scales.

* CPU (the interpreter backend): below :data:`CPU_MIN` warns, naming the FP8 baseline.
* GPU: below :data:`GPU_MIN` warns: no older torch was tried.

Warnings, not errors: all else works where it was tried, and on ROCm the torch is the machine's.
"""
from __future__ import annotations

import warnings

import torch

from .triton_version import minor

CPU_MIN = (2, 12)
"""The oldest torch whose CPU ``torch._scaled_mm`` takes the FP8 baseline's row-wise scales."""
GPU_MIN = (2, 11)
"""The oldest torch the suite was run under (the lent GPU image's; on a CPU)."""


class TorchVersionWarning(UserWarning):
    """The installed torch is older than the releases the package was run under."""


def _name(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def check(backend: str, version: str | None = None) -> None:
    """Warn, as the module docstring says, for torch ``version`` (the installed one by default) on
    ``backend``."""
    version = torch.__version__ if version is None else version
    installed = minor(version)
    if backend == "interpreter" and installed < CPU_MIN:
        warnings.warn(
            f"torch {version} on the CPU: the FP8 GEMM baseline (gemm_fp8 ref), and every FP8 check "
            "that compares with it, needs torch._scaled_mm with row-wise scales, which its CPU kernel "
            f"takes from torch {_name(CPU_MIN)} on (2.11's takes per-tensor scales only). CI runs "
            "torch 2.13 (pip install torch==2.13.0: the CPU wheel).", TorchVersionWarning, stacklevel=3)
    elif backend != "interpreter" and installed < GPU_MIN:
        warnings.warn(
            f"torch {version} is older than any torch this package was run under "
            f"({_name(GPU_MIN)} and newer); it was not tried.", TorchVersionWarning, stacklevel=3)
