"""One output tile's fp32 product over a K range: the K loop the GEMM kernels off the ladder share.

The ladder's rungs (v2-v6) keep their K loops inline, so the diff between neighbours shows one
idea (DESIGN.md). Kernels beside the ladder (split-K, the FP8 epilogue) take v5/v6's loop from
here, once, rather than copying it: rows and columns wrapped (no load mask), 64-bit offsets,
the ragged last K step peeled out of the loop, and the interpreter's bf16 upcast
(:mod:`kernels.triton_support`).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tile_dot(a_ptr, b_ptr, pid_m, pid_n, M, N, k_lo, k_hi, stride_am, stride_ak, stride_bk, stride_bn,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             EVEN_K: tl.constexpr, INTERP_BF16: tl.constexpr):
    """fp32 ``A[tile rows, k_lo:k_hi] @ B[k_lo:k_hi, tile cols]``; ``k_lo`` a multiple of
    ``BLOCK_K``, ``EVEN_K`` true only when no range has a ragged end."""
    ks = tl.arange(0, BLOCK_K)
    rows = ((pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M).to(tl.int64)   # wrapped: no mask
    cols = ((pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N).to(tl.int64)
    k_offs = (ks + k_lo).to(tl.int64)
    a_ptrs = a_ptr + rows[:, None] * stride_am + k_offs[None, :] * stride_ak
    b_ptrs = b_ptr + k_offs[:, None] * stride_bk + cols[None, :] * stride_bn
    a_step = tl.cast(stride_ak, tl.int64) * BLOCK_K
    b_step = tl.cast(stride_bk, tl.int64) * BLOCK_K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_full = k_lo + ((k_hi - k_lo) // BLOCK_K) * BLOCK_K
    for k0 in range(k_lo, k_full, BLOCK_K):
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
        if INTERP_BF16:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision="ieee")  # fp32: no TF32
        a_ptrs += a_step
        b_ptrs += b_step
    if not EVEN_K:  # the ragged last K step
        if k_full < k_hi:
            a = tl.load(a_ptrs, mask=ks[None, :] + k_full < k_hi, other=0.0)
            b = tl.load(b_ptrs, mask=ks[:, None] + k_full < k_hi, other=0.0)
            if INTERP_BF16:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision="ieee")  # fp32: no TF32
    return acc
