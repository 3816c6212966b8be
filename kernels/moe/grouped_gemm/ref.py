"""ref: the library baseline, ``torch._grouped_mm`` where this torch has it for the device
and dtype, else v0's loop of ``torch.matmul``.

Idea: what a user gets without writing a kernel. ``torch._grouped_mm`` (PyTorch's
grouped GEMM, CUTLASS-based on Hopper, with a CPU fallback) is what MoE training code
calls today; where it refuses (it raises for some devices, dtypes, and on NVIDIA for
strides that are not 16-byte aligned), the per-expert loop is the baseline. The choice
is remembered per :func:`case` (device, dtype, K, N, which dims are contiguous), and
:func:`baseline_name` tells which one ran. Every rung's speed is a ratio to it, timed in the same run.
"""
from __future__ import annotations

import torch

from ... import validate
from ...registry import rung
from .spec import DTYPES
from .v0_loop import loop

_REFUSED: dict[tuple, str] = {}   # case -> torch's error


def case(x: torch.Tensor, w: torch.Tensor) -> tuple:
    """What decides whether ``torch._grouped_mm`` takes the operands."""
    return (x.device.type, x.dtype, x.shape[1], w.shape[2], x.stride(1) == 1, w.stride(2) == 1)


def baseline_name(x: torch.Tensor, w: torch.Tensor) -> str:
    """``"torch._grouped_mm"``, or ``"loop"`` when torch refused operands like these."""
    return "loop" if case(x, w) in _REFUSED else "torch._grouped_mm"


@rung(op="grouped_gemm", rung=None, name="ref", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="library", backward=True)
def grouped_gemm_ref(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    offsets = validate.grouped_gemm_operands(x, w, offsets, DTYPES)
    key = case(x, w)
    if key not in _REFUSED and hasattr(torch, "_grouped_mm"):
        try:
            return torch._grouped_mm(x, w, offs=offsets)
        except (RuntimeError, NotImplementedError) as refused:
            _REFUSED[key] = str(refused)
    return loop(x, w, offsets)
