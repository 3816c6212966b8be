"""Launch plumbing of the Triton MXFP4 rungs: tile configs, the grid, AOT signatures."""
from __future__ import annotations

import torch

from .. import backend as _backend
from ..outputs import new_output
from ..registry import AotKernel
from ..triton_support import aot_launch, cdiv, interp_bf16, pointer_type
from ..tuning import with_overrides
from . import operands
from .formats import ELEMENTS, FORMAT, format_of


def config(backend: str, arch: str) -> dict:
    """Tiles per target; BLOCK_K counts elements (e2m1: half as many bytes are loaded).

    gfx950: 128x128x256, two stages: ``v_mfma_scale_f32_32x32x64_f8f6f4``, no spills,
    69 KiB of the 160 KiB LDS (AOT-checked; 256x128x256 fits too, 256x256x256 spills).
    Other AMD GPUs (gfx942) emulate: 128x128x128, since K = 256 spills there.
    cuda: 128x128x256, three stages. interpreter: small tiles, since each program costs
    ~1 ms; BLOCK_K 64 is two scale blocks, so the scale indexing is exercised.
    """
    if backend == "interpreter":
        return dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=64, GROUP_M=2, num_warps=4, num_stages=1)
    if backend == "hip":
        block_k = 256 if arch.split(":")[0] == "gfx950" else 128
        return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=block_k, GROUP_M=8, num_warps=8, num_stages=2)
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=256, GROUP_M=8, num_warps=8, num_stages=3)


def aot(kernel, backend: str, arch: str, overrides: dict | None = None,
        dtype: torch.dtype = FORMAT) -> list[AotKernel]:
    """The launch the ISA inspector compiles: an 8192^3 GEMM, every operand K-contiguous, in
    the MX format ``dtype`` names; ``overrides`` replaces settings of :func:`config` (e.g.
    ``{"BLOCK_M": 256}``)."""
    size = 8192
    elements, pack = ELEMENTS[dtype]
    ints = dict(M=size, N=size, K=size, stride_am=size // pack, stride_ak=1, stride_bn=size // pack,
                stride_bk=1, stride_cm=size, stride_cn=1, stride_sam=size // 32, stride_sak=1,
                stride_sbn=size // 32, stride_sbk=1)
    return [aot_launch(kernel, torch.uint8, with_overrides(config(backend, arch), overrides), ints,
                       constexprs={"INTERP_BF16": False, "ELEMENTS": elements, "PACK": pack},
                       pointers={"c_ptr": pointer_type(torch.bfloat16)})]


def launch(kernel, a_packed, a_scales, b_packed, b_scales, out_dtype) -> torch.Tensor:
    """Check the operands, allocate C (poisonable) and run ``kernel`` over a 1-D grid."""
    k = operands.check(a_packed, a_scales, b_packed, b_scales, out_dtype)
    m, n = a_packed.shape[0], b_packed.shape[0]
    c = new_output((m, n), out_dtype, a_packed.device)
    here = _backend.current()
    cfg = config(here.name, here.arch)
    grid = (cdiv(m, cfg["BLOCK_M"]) * cdiv(n, cfg["BLOCK_N"]),)
    elements, pack = ELEMENTS[format_of(a_packed)]
    # e4m3 elements go in as their bytes, as e2m1 ones do: tl.dot_scaled takes either
    kernel[grid](a_packed.view(torch.uint8), b_packed.view(torch.uint8), c, a_scales, b_scales, m, n, k,
                 *a_packed.stride(), *b_packed.stride(), *c.stride(), *a_scales.stride(),
                 *b_scales.stride(), ELEMENTS=elements, PACK=pack, INTERP_BF16=interp_bf16(out_dtype), **cfg)
    return c
