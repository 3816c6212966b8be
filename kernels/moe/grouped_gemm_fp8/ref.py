"""ref: the library baseline, ``torch._scaled_grouped_mm`` where this torch has it for the
device, format and layout, else a loop of ``gemm_fp8``'s baseline (``torch._scaled_mm``)
per expert.

Idea: what a user gets without writing a kernel. ``torch._scaled_grouped_mm`` is
PyTorch's FP8 grouped GEMM with exactly these row-wise scales (per token, per expert
channel) and offsets; it has no CPU kernel and on GPUs it refuses some targets, formats
and layouts (e.g. w not K-contiguous). Where it refuses, the baseline is what FP8 MoE
code did before it: one ``torch._scaled_mm`` per non-empty expert (hipBLASLt/cuBLASLt
on a GPU, a float32-accumulating CPU kernel here), through :mod:`kernels.gemm_fp8.ref`,
which brings each slice into the library's operand form. The choice is remembered per
:func:`case`, and :func:`baseline_name` tells which one ran. The loop's per-expert
operand copies into library form are part of its timed call: that is what a user of
the loop pays, and it reads the offsets on the host as grouped GEMM's v0 does.
"""
from __future__ import annotations

import torch

from ...gemm_fp8.formats import native_dtypes
from ...gemm_fp8.ref import gemm_fp8_ref
from ...outputs import new_output
from ...registry import rung
from ..grouped_gemm.spec import group_bounds
from . import operands

_REFUSED: dict[tuple, str] = {}   # case -> torch's error


def case(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype) -> tuple:
    """What decides whether ``torch._scaled_grouped_mm`` takes the operands."""
    return (x.device.type, x.dtype, out_dtype, x.shape[1], w.shape[2], x.stride(1) == 1,
            w.stride(1) == 1)


def baseline_name(x: torch.Tensor, w: torch.Tensor, out_dtype=torch.bfloat16) -> str:
    """``"torch._scaled_grouped_mm"``, or ``"loop of torch._scaled_mm"`` where torch
    refused operands like these."""
    refused = case(x, w, out_dtype) in _REFUSED or not hasattr(torch, "_scaled_grouped_mm")
    return "loop of torch._scaled_mm" if refused else "torch._scaled_grouped_mm"


def scaled_mm_loop(x, sx, w, sw, offsets, out_dtype) -> torch.Tensor:
    """One ``torch._scaled_mm`` per non-empty group (the offsets read on the host)."""
    out = new_output((x.shape[0], w.shape[2]), out_dtype, x.device)
    for g, (start, end) in enumerate(group_bounds(offsets)):
        if end > start:
            out[start:end] = gemm_fp8_ref(x[start:end], w[g], sx[start:end, None], sw[g, None, :],
                                          out_dtype=out_dtype)
    return out


@rung(op="grouped_gemm_fp8", rung=None, name="ref", backends=("hip", "cuda", "interpreter"),
      dtypes=native_dtypes(), interpreter=True, kind="library")
def grouped_gemm_fp8_ref(x: torch.Tensor, sx: torch.Tensor, w: torch.Tensor, sw: torch.Tensor,
                         offsets: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    offsets = operands.check(x, sx, w, sw, offsets, out_dtype)
    if sx.dim() == 2:
        raise NotImplementedError("the library baseline takes row-wise scales only, not 1 x 128 / "
                                  "128 x 128 blocks (the v0 rung takes both)")
    if baseline_name(x, w, out_dtype) == "torch._scaled_grouped_mm":
        try:
            return torch._scaled_grouped_mm(x, w, sx, sw, offs=offsets, out_dtype=out_dtype)
        except (RuntimeError, NotImplementedError) as refused:
            _REFUSED[case(x, w, out_dtype)] = str(refused)
    return scaled_mm_loop(x, sx, w, sw, offsets, out_dtype)
