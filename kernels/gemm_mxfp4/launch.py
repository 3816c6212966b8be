"""Launch plumbing of the Triton MXFP4 rungs: tile configs, the grid, AOT signatures."""
from __future__ import annotations

import torch

from .. import backend as _backend
from ..outputs import new_output
from ..registry import AotKernel
from ..triton_support import aot_launch, cdiv, interp_bf16, pointer_type, run_kwargs
from ..tuning import with_overrides
from . import operands
from .formats import ELEMENTS, FORMAT, format_of
from ..mx_preshuffle import preshuffled_shape


def takes_preshuffled(backend: str, arch: str) -> bool:
    """Whether the kernel reads pre-shuffled scales as they are on this target (:mod:`kernels.mx_preshuffle`):
    gfx950, whose scaled MFMA the layout is built for, and the interpreter, which checks the
    kernel's indexing on the CPU. gfx942 emulates the MFMA, and there the 256-deep K step
    the layout needs spills (AOT-checked): it reads row-major scales."""
    return backend == "interpreter" or (backend == "hip" and arch.split(":")[0] == "gfx950")


def config(backend: str, arch: str, preshuffled: bool = False) -> dict:
    """Tiles per target; BLOCK_K counts elements (e2m1: half as many bytes are loaded).

    gfx950: 128x128x256, two stages. With pre-shuffled scales, 16x16 MFMA tiles
    (``matrix_instr_nonkdim=16``, ``v_mfma_scale_f32_16x16x128_f8f6f4``), the instruction
    the layout is built for, 70 KiB of the 160 KiB LDS, no spills (AOT-checked; 256x128x256
    fits too, 256x256x256 spills); with row-major ones Triton's default 32x32 tiles
    (``v_mfma_scale_f32_32x32x64_f8f6f4``). Other AMD GPUs (gfx942) emulate: 128x128x128,
    since K = 256 spills there. cuda: 128x128x256, three stages. interpreter: small tiles,
    since each program costs ~1 ms, 256 deep: eight scale blocks, one pre-shuffled chunk, so
    both layouts run the same tiles and give the same bits (``tests/test_mx_preshuffle.py``).
    """
    flag = {"PRESHUFFLED": preshuffled}
    if backend == "interpreter":
        return dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=256, GROUP_M=2, num_warps=4, num_stages=1, **flag)
    if backend == "hip":
        gfx950 = arch.split(":")[0] == "gfx950"
        mfma = {"matrix_instr_nonkdim": 16} if preshuffled else {}
        return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=256 if gfx950 else 128, GROUP_M=8, num_warps=8,
                    num_stages=2, **mfma, **flag)
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=256, GROUP_M=8, num_warps=8, num_stages=3, **flag)


def aot(kernel, backend: str, arch: str, overrides: dict | None = None,
        dtype: torch.dtype = FORMAT) -> list[AotKernel]:
    """The launch the ISA inspector compiles: an 8192^3 GEMM, every operand K-contiguous, in
    the MX format ``dtype`` names, with the scales in the layout the target reads
    (:func:`takes_preshuffled`); ``overrides`` replaces settings of :func:`config` (e.g.
    ``{"BLOCK_M": 256}``, ``{"PRESHUFFLED": False}``)."""
    size = 8192
    elements, pack = ELEMENTS[dtype]
    preshuffled = (overrides or {}).get("PRESHUFFLED", takes_preshuffled(backend, arch))
    cfg = with_overrides(config(backend, arch, preshuffled), overrides)
    width = preshuffled_shape(size, size // 32)[1]
    scale_rows = dict(stride_sam=width, stride_sbn=width) if preshuffled else \
        dict(stride_sam=size // 32, stride_sbn=size // 32)
    ints = dict(M=size, N=size, K=size, stride_am=size // pack, stride_ak=1, stride_bn=size // pack,
                stride_bk=1, stride_cm=size, stride_cn=1, stride_sak=1, stride_sbk=1, **scale_rows)
    return [aot_launch(kernel, torch.uint8, cfg, ints,
                       constexprs={"INTERP_BF16": False, "ELEMENTS": elements, "PACK": pack},
                       pointers={"c_ptr": pointer_type(torch.bfloat16)})]


def launch(kernel, a_packed, a_scales, b_packed, b_scales, out_dtype) -> torch.Tensor:
    """Check the operands, allocate C (poisonable) and run ``kernel`` over a 1-D grid.

    Pre-shuffled scales (both operands') go in as they are where the target reads them so
    (:func:`takes_preshuffled`); anywhere else, or with only one operand's pre-shuffled, the
    kernel reads row-major scales, and a pre-shuffled operand is unshuffled first (a copy)."""
    k = operands.check(a_packed, a_scales, b_packed, b_scales, out_dtype)
    m, n = a_packed.shape[0], b_packed.shape[0]
    c = new_output((m, n), out_dtype, a_packed.device)
    here = _backend.current()
    preshuffled = (takes_preshuffled(here.name, here.arch) and operands.is_preshuffled(a_scales, m, k)
                   and operands.is_preshuffled(b_scales, n, k))
    if not preshuffled:
        a_scales, b_scales = operands.plain(a_scales, m, k), operands.plain(b_scales, n, k)
    cfg = config(here.name, here.arch, preshuffled)
    grid = (cdiv(m, cfg["BLOCK_M"]) * cdiv(n, cfg["BLOCK_N"]),)
    elements, pack = ELEMENTS[format_of(a_packed)]
    # e4m3 elements go in as their bytes, as e2m1 ones do: tl.dot_scaled takes either
    kernel.run(a_packed.view(torch.uint8), b_packed.view(torch.uint8), c, a_scales, b_scales, m, n, k,
               *a_packed.stride(), *b_packed.stride(), *c.stride(), *a_scales.stride(), *b_scales.stride(),
               **run_kwargs(grid, dict(ELEMENTS=elements, PACK=pack, INTERP_BF16=interp_bf16(out_dtype), **cfg)))
    return c
