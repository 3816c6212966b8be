"""ref: the library baseline, ``torch.matmul`` (hipBLASLt on ROCm, cuBLAS on NVIDIA).

Idea: what a user gets without writing a kernel. Every table and chart shows it, and
every rung's speed is reported as a ratio to it, timed in the same run.
"""
from __future__ import annotations

import torch

from .. import validate
from ..registry import rung
from .spec import DTYPES


@rung(op="gemm", rung=None, name="ref", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="library")
def gemm_ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    validate.matmul_operands(a, b, DTYPES)
    return torch.matmul(a, b)
