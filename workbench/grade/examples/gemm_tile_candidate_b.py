"""A take-home answer: C = A @ B with one Triton program per 64 x 64 tile of C.

Graded by ``workbench grade gemm_tile_candidate_b.py --op gemm``: it defines
``matmul(a, b)``, the public GEMM's signature. The K loop walks BLOCK_K slices and masks
the loads by the K elements left, so any M, N, K and any strides work. On the CPU
interpreter, bf16 ``tl.dot`` multiplies raw bit patterns (Triton issue 11584), so the
tiles are upcast there (``INTERP_BF16``, the workbench's convention; a GPU compiles the
native bf16 dot).

(An exercise in reading a grade: grade this file and ``gemm_tile.py`` before reading the
note at the end of this file.)
"""
import torch
import triton
import triton.language as tl

from kernels.triton_support import interp_bf16, round_to_bf16


@triton.jit
def gemm_tile_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                     stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, INTERP_BF16: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_left = K - k0 - 1
        a = tl.load(a_ptr + rows.to(tl.int64)[:, None] * stride_am + (k0 + ks)[None, :] * stride_ak,
                    mask=(rows[:, None] < M) & (ks[None, :] < k_left), other=0.0)
        b = tl.load(b_ptr + (k0 + ks)[:, None] * stride_bk + cols.to(tl.int64)[None, :] * stride_bn,
                    mask=(ks[:, None] < k_left) & (cols[None, :] < N), other=0.0)
        if INTERP_BF16:
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision="ieee")
    if INTERP_BF16:
        acc = round_to_bf16(acc)
    tl.store(c_ptr + rows.to(tl.int64)[:, None] * stride_cm + cols.to(tl.int64)[None, :] * stride_cn,
             acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    grid = (triton.cdiv(m, 64), triton.cdiv(n, 64))
    gemm_tile_kernel[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                           c.stride(0), c.stride(1), BLOCK_M=64, BLOCK_N=64, BLOCK_K=32,
                           INTERP_BF16=interp_bf16(a.dtype), num_warps=4)
    return c

# The note: the K mask is one short. `k_left = K - k0 - 1` counts the elements left as if K
# were 1-based, so the last K column of A and row of B never join the sum: every element of
# C misses the rank-one term a[:, K-1] * b[K-1, :], at every K, which the harness's report
# names at the first shape it checks.
