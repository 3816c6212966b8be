"""ref: the baseline without an MXFP4 kernel: dequantize to bf16, then ``torch.matmul``.

Idea: what a user without an MXFP4 GEMM kernel does. There is no library call to put
here on every backend: ``torch._scaled_mm`` takes MX operands only where the BLAS
library has MX kernels (cuBLASLt on Blackwell), with scales in that library's
pre-shuffled layout, and torch 2.13 refuses them on the CPU ("Invalid scaling
configuration"). So the baseline
expands the operands to bfloat16 (exact: an MXFP4 value has one mantissa bit and an
exponent inside bf16's range) and runs the bf16 GEMM (hipBLASLt/cuBLAS on a GPU),
then converts to ``out_dtype``. It moves four times the operand bytes of the MXFP4
kernel and uses the bf16 matrix cores: the number to beat, not a gold standard. MXFP8
the same way (an e4m3 value times a power of two is a bf16 value, but for scales that
push it out of bf16's range).
"""
from __future__ import annotations

import torch

from ..registry import rung
from . import operands
from .formats import DTYPES
from .spec import dequantize


@rung(op="gemm_mxfp4", rung=None, name="ref", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="library")
def gemm_mxfp4_ref(a_packed: torch.Tensor, a_scales: torch.Tensor, b_packed: torch.Tensor,
                   b_scales: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    k = operands.check(a_packed, a_scales, b_packed, b_scales, out_dtype)
    a = dequantize(a_packed, operands.plain(a_scales, a_packed.shape[0], k), dtype=torch.bfloat16)
    b_t = dequantize(b_packed, operands.plain(b_scales, b_packed.shape[0], k), dtype=torch.bfloat16)
    return torch.matmul(a, b_t.t()).to(out_dtype)
