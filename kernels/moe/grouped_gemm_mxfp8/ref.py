"""ref: the baseline without an MXFP8 grouped kernel: a loop over the experts of
``gemm_mxfp4``'s MX baseline (dequantize to bf16, then ``torch.matmul``).

Idea: what a user without an MX grouped GEMM does. No library call takes MX operands on
every backend (``torch._scaled_grouped_mm`` takes MX scales only in the pre-shuffled
layouts of Blackwell's cuBLASLt, and has no CPU kernel), so the baseline runs the dense
MX baseline (:mod:`kernels.gemm_mxfp4.ref`: bf16 operands on the bf16 matrix cores) once
per non-empty expert, reading the offsets on the host as grouped GEMM's v0 does.
"""
from __future__ import annotations

import torch

from ...gemm_mxfp4.ref import gemm_mxfp4_ref
from ...outputs import new_output
from ...registry import rung
from ..grouped_gemm.spec import group_bounds
from . import operands
from .spec import DTYPES


@rung(op="grouped_gemm_mxfp8", rung=None, name="ref", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="library")
def grouped_gemm_mxfp8_ref(x: torch.Tensor, sx: torch.Tensor, w: torch.Tensor, sw: torch.Tensor,
                           offsets: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    offsets = operands.check(x, sx, w, sw, offsets, out_dtype)
    out = new_output((x.shape[0], w.shape[2]), out_dtype, x.device)
    for g, (start, end) in enumerate(group_bounds(offsets)):
        if end > start:
            out[start:end] = gemm_mxfp4_ref(x[start:end], sx[start:end], w[g].t(), sw[g], out_dtype)
    return out
