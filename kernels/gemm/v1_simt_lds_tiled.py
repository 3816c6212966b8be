"""v1 simt_lds_tiled: a thread block stages tiles of A and B in LDS and reuses them.

Idea:
    A 16x16 block of threads owns a 16x16 tile of C. It walks K in steps of 16: each
    thread loads one element of the A tile and one of the B tile into LDS (shared
    memory), the block synchronises, and every thread then reads a row and a column
    of the tiles from LDS instead of global memory.

Why faster:
    Each element brought from global memory is now used 16 times (once per thread
    of its tile row or column), so global traffic drops by the tile width and the
    loads are coalesced. This is the first data-reuse lesson of the ladder.

Expected bound:
    LDS bandwidth and vector-ALU issue: two LDS reads per fused multiply-add and no
    register blocking, still on the vector units (no MFMA).

Limits:
    One output per thread, fixed 16x16 tiles; fp32 and fp16 inputs with fp32
    accumulation. Tails are handled by loading zeros outside the matrices.
"""
from __future__ import annotations

import torch

from .. import validate
from ..outputs import new_output
from ..registry import rung
from ..simt import UNAVAILABLE, float32, launch, launch_shape, simt

DTYPES = (torch.float32, torch.float16)
TILE = 16


@simt.jit
def _gemm_lds_tiled_kernel(a, b, c):
    a_tile = simt.shared.array(shape=(TILE, TILE), dtype=float32)
    b_tile = simt.shared.array(shape=(TILE, TILE), dtype=float32)
    tx = simt.threadIdx.x
    ty = simt.threadIdx.y
    col = simt.blockIdx.x * TILE + tx
    row = simt.blockIdx.y * TILE + ty
    m, k_total = a.shape
    n = b.shape[1]
    acc = float32(0.0)
    # exercise begin: tiles
    for k0 in range(0, k_total, TILE):
        a_tile[ty, tx] = float32(a[row, k0 + tx]) if row < m and k0 + tx < k_total else float32(0.0)
        b_tile[ty, tx] = float32(b[k0 + ty, col]) if k0 + ty < k_total and col < n else float32(0.0)
        simt.syncthreads()
        for kk in range(TILE):
            acc += a_tile[ty, kk] * b_tile[kk, tx]
        simt.syncthreads()
    # exercise end
    if row < m and col < n:
        c[row, col] = acc


@rung(op="gemm", rung=1, name="simt_lds_tiled", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="simt", max_bench_flops=2.0 * 2048**3,
      unavailable=UNAVAILABLE)
def gemm_v1(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    validate.matmul_operands(a, b, DTYPES)
    m, n = a.shape[0], b.shape[1]
    c = new_output((m, n), a.dtype, a.device)
    grid, block = launch_shape(m, n, (TILE, TILE))
    launch(_gemm_lds_tiled_kernel, grid, block, a, b, c)  # on torch's current stream: in order with its work
    return c
