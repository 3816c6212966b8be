"""The one tile of the MXFP8 grouped kernels (forward, dX and dW), per target."""
from __future__ import annotations

from ..grouped_gemm import launch as grouped_launch


def config(backend: str, arch: str = "gfx942") -> dict:
    """Grouped GEMM's 128 x 128 tile (:func:`kernels.moe.grouped_gemm.launch.config`) with a K
    step of 128 on gfx950, where that depth is what selects the scaled MFMA
    (``v_mfma_scale_f32_16x16x128_f8f6f4``; at 64 Triton emulates on bf16 MFMAs, AOT-checked),
    and 64 elsewhere: on gfx942, which emulates anyway, 128 spills SGPRs and sends scale
    bytes through LDS in 16-bit reads (AOT-checked). In the interpreter 64 is two scale
    blocks per tile, so their indexing is exercised."""
    block_k = 128 if backend == "hip" and arch.split(":")[0] == "gfx950" else 64
    return {**grouped_launch.config(backend, arch), "BLOCK_K": block_k}
