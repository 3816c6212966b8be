"""GEMM ladder exercises: each rung's one idea, from shared-memory tiles to the persistent kernel."""
from __future__ import annotations

import torch

from ..model import KernelExercise

EXERCISES = (
    KernelExercise(
        key="gemm/v1", module="kernels.gemm.v1_simt_lds_tiled", op="gemm", rung="v1",
        title="Stage tiles of A and B in shared memory (LDS)",
        task="Each block of TILE x TILE threads computes one tile of C. Write the K loop: every "
             "thread loads one element of A's tile and one of B's into a_tile / b_tile (zero "
             "outside the matrices), the block waits until both tiles are complete, each thread "
             "accumulates its row-times-column product from shared memory, and the block waits "
             "again before the next tiles overwrite these.",
        todo={"tiles": 'raise NotImplementedError("TODO: the K loop over shared-memory tiles")'},
        hints=(
            "Thread (ty, tx) loads a[row, k0 + tx] into a_tile[ty, tx] and b[k0 + ty, col] into "
            "b_tile[ty, tx]; a thread whose element is outside A or B stores 0.0 instead.",
            "A thread reads tile elements that other threads wrote: simt.syncthreads() after the "
            "loads, so every write is done before any read.",
            "A second simt.syncthreads() after the inner `for kk in range(TILE)` loop stops a fast "
            "thread from overwriting a tile that a slow thread is still reading.",
        ),
        wrong={
            "no barrier after the loads": {"tiles": '''
for k0 in range(0, k_total, TILE):
    a_tile[ty, tx] = float32(a[row, k0 + tx]) if row < m and k0 + tx < k_total else float32(0.0)
    b_tile[ty, tx] = float32(b[k0 + ty, col]) if k0 + ty < k_total and col < n else float32(0.0)
    for kk in range(TILE):
        acc += a_tile[ty, kk] * b_tile[kk, tx]
    simt.syncthreads()
'''},
            "no barrier before the next loads": {"tiles": '''
for k0 in range(0, k_total, TILE):
    a_tile[ty, tx] = float32(a[row, k0 + tx]) if row < m and k0 + tx < k_total else float32(0.0)
    b_tile[ty, tx] = float32(b[k0 + ty, col]) if k0 + ty < k_total and col < n else float32(0.0)
    simt.syncthreads()
    for kk in range(TILE):
        acc += a_tile[ty, kk] * b_tile[kk, tx]
'''},
            "off-by-one bound on K": {"tiles": '''
for k0 in range(0, k_total, TILE):
    a_tile[ty, tx] = float32(a[row, k0 + tx]) if row < m and k0 + tx <= k_total else float32(0.0)
    b_tile[ty, tx] = float32(b[k0 + ty, col]) if k0 + ty <= k_total and col < n else float32(0.0)
    simt.syncthreads()
    for kk in range(TILE):
        acc += a_tile[ty, kk] * b_tile[kk, tx]
    simt.syncthreads()
'''},
        },
        shapes=((19, 21, 37),), dtypes=(torch.float32,),
    ),
    KernelExercise(
        key="gemm/v2", module="kernels.gemm.v2_triton_tile", op="gemm", rung="v2",
        title="Masked tile loads for any M, N, K",
        task="One Triton program computes a BLOCK_M x BLOCK_N tile of C with tl.dot. Load this "
             "K step's tiles of A and B so that shapes that are not multiples of the blocks work: "
             "a lane whose row, column or k is outside the matrix must not touch memory and must "
             "contribute 0 to the dot.",
        todo={"masks": "a = tl.load(a_ptrs)  # TODO: mask the lanes outside A\n"
                       "b = tl.load(b_ptrs)  # TODO: mask the lanes outside B"},
        hints=(
            "tl.load(ptrs, mask=..., other=0.0): masked-off lanes read nothing and give 0.0.",
            "For A the lane (i, j) is inside when rows[i] < M and k0 + ks[j] < K; build it with "
            "broadcasting, rows[:, None] and ks[None, :].",
            "For B the lane (i, j) is inside when k0 + ks[i] < K and cols[j] < N.",
        ),
        wrong={
            "off-by-one row mask": {"masks": '''
a = tl.load(a_ptrs, mask=(rows[:, None] <= M) & (ks[None, :] + k0 < K), other=0.0)
b = tl.load(b_ptrs, mask=(ks[:, None] + k0 < K) & (cols[None, :] < N), other=0.0)
'''},
            "K tail not masked": {"masks": '''
a = tl.load(a_ptrs, mask=rows[:, None] < M, other=0.0)
b = tl.load(b_ptrs, mask=cols[None, :] < N, other=0.0)
'''},
        },
        shapes=((37, 45, 41),), dtypes=(torch.float32,),
    ),
)
