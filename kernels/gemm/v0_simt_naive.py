"""v0 simt_naive: one thread computes one element of C.

Idea:
    Thread (row, col) walks the K dimension and accumulates A[row, k] * B[k, col]
    in an fp32 register, then writes C[row, col] once.

Why faster:
    It is the baseline of the ladder, not faster than anything: every thread reads a
    full row of A and a full column of B from global memory, so each loaded element
    is used for one multiply-add. Arithmetic intensity is about 0.25 FLOP/byte in
    fp32 whatever the shape.

Expected bound:
    Memory (global/L2 bandwidth), far below the HBM roof because neighbouring
    threads reload the same data and the column walk of B is strided.

Limits:
    No data reuse, no matrix cores, fp32 accumulation on the vector ALUs. fp32 and
    fp16 inputs (NumPy has no bfloat16, so the CPU simulator cannot run bf16).
"""
from __future__ import annotations

import torch

from .. import validate
from ..outputs import new_output
from ..registry import rung
from ..simt import UNAVAILABLE, float32, launch, launch_shape, simt

DTYPES = (torch.float32, torch.float16)
BLOCK = (16, 16)


@simt.jit
def _gemm_naive_kernel(a, b, c):
    col, row = simt.grid(2)
    # exercise begin: element
    if row < c.shape[0] and col < c.shape[1]:
        acc = float32(0.0)
        for k in range(a.shape[1]):
            acc += float32(a[row, k]) * float32(b[k, col])
        c[row, col] = acc
    # exercise end


@rung(op="gemm", rung=0, name="simt_naive", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="simt", max_bench_flops=2.0 * 2048**3,
      unavailable=UNAVAILABLE)
def gemm_v0(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    validate.matmul_operands(a, b, DTYPES)
    m, n = a.shape[0], b.shape[1]
    c = new_output((m, n), a.dtype, a.device)
    grid, block = launch_shape(m, n, BLOCK)
    launch(_gemm_naive_kernel, grid, block, a, b, c)  # on torch's current stream: in order with its work
    return c
