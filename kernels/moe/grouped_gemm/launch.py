"""What the Triton grouped GEMM kernels share around a launch: the tile, the problem
the ISA inspector compiles for, and the launch's int arguments."""
from __future__ import annotations

from ...gemm.v4_lds_pipeline import amd_options
from .spec import BENCH_SHAPES

AOT_SHAPE = BENCH_SHAPES["dsv3 down (32 experts)"]
"""The launch the ISA inspector shows: T = 32768 rows, K = 2048, N = 7168, 32 experts."""


def forward_ints(shape=AOT_SHAPE, transposed_w: bool = False) -> dict[str, int]:
    """Int arguments of a contiguous forward launch; ``transposed_w`` gives the dX launch
    of the backward instead: dy (T, N) times wᵀ, a (G, N, K) stride view of w, so the
    reduction runs over N and the weight is contiguous along it."""
    t, k, n, g, _ = shape
    if transposed_w:
        return dict(T=t, N=k, K=n, G=g, stride_xt=n, stride_xk=1, stride_wg=k * n, stride_wk=1,
                    stride_wn=n, stride_ot=k, stride_on=1)
    return dict(T=t, N=n, K=k, G=g, stride_xt=k, stride_xk=1, stride_wg=k * n, stride_wk=n,
                stride_wn=1, stride_ot=n, stride_on=1)


def dw_ints(shape=AOT_SHAPE) -> dict[str, int]:
    """Int arguments of a contiguous dW launch: x (T, K), dy (T, N), dw (G, K, N)."""
    t, k, n, _, _ = shape
    return dict(T=t, K=k, N=n, stride_xt=k, stride_xk=1, stride_dyt=n, stride_dyn=1,
                stride_dwg=k * n, stride_dwk=n, stride_dwn=1)


def config(backend: str, arch: str = "gfx942") -> dict:
    """GEMM v4's 128 x 128 tile, 64 deep, two stages and AMD knobs on GPUs, for the
    forward and the dW kernel alike; small tiles for the slow interpreter."""
    if backend == "interpreter":
        return dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, num_warps=4, num_stages=1)
    knobs = amd_options(arch) if backend == "hip" else {}
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8 if backend == "hip" else 4,
                num_stages=2 if backend == "hip" else 3, **knobs)
