"""A GEMM whose epilogue feeds FP8 training: C's amax, and C cast to FP8, with no pass over C.

An FP8 recipe quantizes a GEMM's output before the next layer reads it: it needs
``amax = max |C|`` (for the scale, now or in a delayed-scaling history) and
``C / scale`` cast to e4m3. Done after the GEMM, that is a kernel (or two) that reads
all of C back from HBM. Here the GEMM does it while C is still in registers:

* :func:`matmul_amax` stores C in the operands' dtype and returns ``amax`` of the
  stored values (each program reduces its tile, then one ``atomic_max`` on an fp32
  scalar: max is order-independent, so the result is deterministic, unlike an
  atomic sum);
* :func:`matmul_to_fp8` stores ``saturate(C / scale)`` in FP8 instead of C (``scale``
  is the dequant scale, as :func:`.formats.quantize_fp8` and :func:`kernels.matmul_fp8`
  take it: a delayed-scaling recipe's scale from earlier amaxes) and returns the amax
  of the fp32 accumulator, the unrounded C, for the recipe's next history entry.

:func:`traffic` gives the HBM bytes this saves, from the bytes each element moves.

The GEMM is v6's K loop over a plain one-tile-per-program grid (v3's grouped order),
with v6's prior tile for the shape; it is not tuned and has no autograd: an FP8
recipe calls it in a forward where the output's gradient is handled by the recipe.
Operands: bf16, fp16 or fp32 (M, K) and (K, N), any strides.

Limits: a NaN in C need not reach ``amax`` (``atomic_max`` on floats is defined for
ordered values); ``scale`` must be positive and finite (checked for dtype, shape and
device only: reading its value would make the host wait for the GPU).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import backend as _backend
from .. import validate
from ..gemm import configs
from ..gemm.tile_dot import tile_dot
from ..gemm.v6_persistent import _tile_coords
from ..outputs import new_output
from ..triton_support import cdiv, fp8_grid, interp_bf16, round_to_bf16, round_to_fp8, run_kwargs
from ..tuning import as_dict
from . import formats

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _gemm_amax_kernel(a_ptr, b_ptr, c_ptr, amax_ptr, scale_ptr, M, N, K,
                      stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, TO_FP8: tl.constexpr,
                      FP8_MAX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr, INTERP_BF16: tl.constexpr,
                      INTERP_FP8: tl.constexpr):
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tile_dot(a_ptr, b_ptr, pid_m, pid_n, M, N, 0, K, stride_am, stride_ak, stride_bk, stride_bn,
                   BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, INTERP_BF16)   # v6's K loop, shared
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    inside = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    # the epilogue: the tile's amax while C is in registers, then one atomic per program
    if TO_FP8:
        tile_amax = tl.max(tl.max(tl.where(inside, tl.abs(acc), 0.0), axis=1), axis=0)
        scale = tl.load(scale_ptr)
        y = tl.clamp(tl.math.div_rn(acc, scale), -FP8_MAX, FP8_MAX)
        if INTERP_FP8:   # the interpreter's FP8 cast drops round-up carries (triton_support)
            y = round_to_fp8(y, MANT, EMIN)
        out = y.to(c_ptr.dtype.element_ty)
    else:
        if INTERP_BF16:
            acc = round_to_bf16(acc)
        out = acc.to(c_ptr.dtype.element_ty)
        tile_amax = tl.max(tl.max(tl.where(inside, tl.abs(out.to(tl.float32)), 0.0), axis=1), axis=0)
    c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n.to(tl.int64)[None, :] * stride_cn
    tl.store(c_ptrs, out, mask=inside)
    tl.atomic_max(amax_ptr, tile_amax)


def _config(m: int, n: int, k: int) -> dict:
    here = _backend.current()
    return as_dict(configs.prune(configs.space(here.name, here.arch), m, n, k)[0])


def _launch(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype,
            scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    (m, k), n = a.shape, b.shape[1]
    c = new_output((m, n), out_dtype, a.device)
    amax = torch.zeros((), dtype=torch.float32, device=a.device)
    if c.numel() == 0:
        return c, amax
    if k == 0:   # torch: an empty sum is 0
        return c.zero_(), amax
    cfg = _config(m, n, k)
    to_fp8 = scale is not None
    grid = (cdiv(m, cfg["BLOCK_M"]) * cdiv(n, cfg["BLOCK_N"]),)
    _gemm_amax_kernel.run(
        a, b, c, amax, scale if to_fp8 else amax, m, n, k,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1), **run_kwargs(grid, dict(
            EVEN_K=k % cfg["BLOCK_K"] == 0, TO_FP8=to_fp8,
            FP8_MAX=torch.finfo(out_dtype).max if to_fp8 else 0.0,
            **(fp8_grid(out_dtype) if to_fp8 else dict(MANT=0, EMIN=0)),
            INTERP_BF16=interp_bf16(a.dtype), INTERP_FP8=to_fp8 and _backend.current().is_interpreter, **cfg)))
    return c, amax


def matmul_amax(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(c, amax)``: ``c = a @ b`` in the operands' dtype and ``amax = c.abs().amax()``
    (a 0-d float32 tensor, exactly that value; 0 for an empty ``c``), from one kernel."""
    validate.matmul_operands(a, b, DTYPES, allow_empty=True)
    return _launch(a, b, a.dtype, None)


def matmul_to_fp8(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor | float,
                  fp8_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(c8, amax)``: ``c8 = saturate((a @ b) / scale)`` in FP8 (``c8.float() * scale``
    approximates ``a @ b``) and ``amax`` = max |a @ b| of the fp32 accumulator, 0-d float32.

    ``fp8_dtype`` defaults to the format this machine's matrix cores take
    (:func:`.formats.fp8_dtype`: e4m3fnuz on gfx942, OCP e4m3fn elsewhere); a GPU takes only
    that one, the interpreter both (:func:`.formats.native_dtypes`). ``scale`` is
    a positive float32 number: a Python float or a one-element float32 tensor on ``a``'s device.
    """
    validate.matmul_operands(a, b, DTYPES, allow_empty=True)
    dtype = fp8_dtype or formats.fp8_dtype()
    if dtype not in formats.FP8_DTYPES:
        raise TypeError(f"fp8_dtype must be one of {formats.FP8_DTYPES}, got {dtype}")
    if dtype not in formats.native_dtypes():
        raise TypeError(f"{dtype} is not this GPU's FP8 format; it takes {formats.native_dtypes()}")
    if not isinstance(scale, torch.Tensor):
        scale = torch.tensor(float(scale), dtype=torch.float32, device=a.device)
    if scale.dtype != torch.float32 or scale.numel() != 1:
        raise ValueError(f"scale must be one float32 number (per-tensor scaling), got dtype "
                         f"{scale.dtype} and shape {tuple(scale.shape)}")
    validate.same_device(a=a, scale=scale)
    return _launch(a, b, dtype, scale.reshape(()))


def traffic(m: int, n: int, dtype: torch.dtype) -> list[dict]:
    """HBM bytes from a GEMM's accumulator to FP8 C (plus its 4-byte amax), unfused and
    fused, for both FP8 recipes; the minimum each way (every element read or written once
    per pass). A and B are read the same way in both, so they are left out.

    Delayed scaling (``scale`` known before the GEMM): unfused, the GEMM stores C and one
    quantize pass reads it and writes FP8 C and the amax; fused, :func:`matmul_to_fp8`
    writes FP8 C. Current scaling (``scale`` from this C's own amax): unfused, store C,
    an amax pass and a cast pass read it; fused, :func:`matmul_amax` stores C with its
    amax and only the cast pass reads it back."""
    e, mn = torch.empty((), dtype=dtype).element_size(), m * n
    rows = [("delayed scaling", (e + e + 1) * mn + 4, mn + 4),
            ("current scaling", (e + e + e + 1) * mn + 4, (e + e + 1) * mn + 4)]
    return [{"recipe": recipe, "unfused bytes": unfused, "fused bytes": fused,
             "saved bytes": unfused - fused} for recipe, unfused, fused in rows]
