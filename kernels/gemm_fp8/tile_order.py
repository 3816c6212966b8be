"""Which output tile a program of the tuned FP8 rungs (v1, v2) computes: gemm v3's order.

Both launch one program per tile over a 1-D grid, as gemm v3 does, so they take its two
steps: remap the hardware id so each XCD (a chiplet with its own L2) gets a contiguous run of
tiles (:func:`kernels.gemm.v3_grouped_order.xcd_remap`, a permutation for any tile count;
``NUM_XCDS`` from :mod:`kernels.xcd`, 1 on NVIDIA and the interpreter), then walk the tiles in
grouped order (``GROUP_M`` tile rows share each column tile of B while it is in L2).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def program_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
                 NUM_XCDS: tl.constexpr):
    """(tile row, tile column) of this program."""
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    if NUM_XCDS > 1:  # the arithmetic of gemm v3's xcd_remap
        per = tl.cdiv(tiles_m * tiles_n, NUM_XCDS)
        tall = tiles_m * tiles_n - (per - 1) * NUM_XCDS
        xcd = pid % NUM_XCDS
        pid = xcd * per - tl.maximum(xcd - tall, 0) + pid // NUM_XCDS
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = min(tiles_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_rows, (pid % per_group) // group_rows
