"""ref: the library baseline, ``torch._scaled_mm`` (hipBLASLt on ROCm, cuBLASLt on NVIDIA).

Idea: what a user gets without writing a kernel. It is the same call on every backend:

* GPU: hipBLASLt/cuBLASLt want A row-major, B column-major and M, N, K multiples of 16.
  Other inputs are copied into that form first, zero-padded (zeros add nothing to the
  dot products; padded rows and columns are cut off again). Aligned inputs with that
  layout go straight through. Those copies are made by :func:`prepare`, which the
  benchmark calls before it starts the clock (``Rung.bind``): the baseline is timed for
  its GEMM alone, as every rung is. Per-row/column scales take a bfloat16 output only
  (row-wise scaling in hipBLASLt/cuBLASLt); other outputs are refused with that reason.
* CPU (torch >= 2.13): ``torch._scaled_mm`` has a CPU kernel that takes any shape,
  layout and either e4m3 format, and accumulates in float32; the harness therefore
  compares the interpreted rungs with it directly. Scales go in per row/column (a
  per-tensor scale broadcast, the same numbers): on CPUs where torch sends per-tensor
  scaling to oneDNN, that path refuses e4m3fnuz ("itensor_view_from_dense expects
  ... fp8"), and the row-wise path takes both formats. A 1 x 1 output gets a zero
  second row of A, because (1, 1) scales read as per-tensor again.

Scales per K block (v2's 1 x 128 / 128 x 128 / 128 x 1, :func:`.operands.check_blockwise`)
are not a form ``torch._scaled_mm`` takes on the CPU (it refuses them) and no library FP8
GEMM is called for them here: ``ref`` then dequantizes both operands to float32 (in
:func:`prepare`, before any clock) and times ``torch.matmul`` in float32, cast to the
output dtype. That is the dequantize-and-GEMM baseline a user without a blockwise kernel
has, not a vendor FP8 GEMM.
"""
from __future__ import annotations

import torch

from .. import backend as _backend
from ..registry import rung
from . import operands
from .formats import native_dtypes

ALIGN = 16


def _library_scales(scale_a, scale_b, m: int, n: int, per_tensor_ok: bool = True):
    """_scaled_mm takes two singletons or a contiguous (M, 1) and (1, N) pair, never a mix. It
    checks the strides of size-1 dims too, which ``.contiguous()`` leaves as they are (a (1, 1)
    slice of stride 2 is "contiguous"): a fresh copy gets unit strides."""
    if per_tensor_ok and scale_a.numel() == 1 and scale_b.numel() == 1:
        return scale_a.reshape(()), scale_b.reshape(())
    return (scale_a.reshape(-1, 1).expand(m, 1).clone(memory_format=torch.contiguous_format),
            scale_b.reshape(1, -1).expand(1, n).clone(memory_format=torch.contiguous_format))


def _padded(x: torch.Tensor, rows: int, cols: int, col_major: bool) -> torch.Tensor:
    """x in a zero (rows, cols) buffer of the given memory order; x itself if it already is."""
    fits = x.shape == (rows, cols) and (x.t().is_contiguous() if col_major else x.is_contiguous())
    if fits:
        return x
    out = x.new_zeros((cols, rows)).t() if col_major else x.new_zeros((rows, cols))
    out[:x.shape[0], :x.shape[1]] = x
    return out


def _gpu_operands(a, b, scale_a, scale_b, out_dtype):
    """Operands as hipBLASLt/cuBLASLt take them: aligned, A row- and B column-major."""
    (m, k), n = a.shape, b.shape[1]
    scale_a, scale_b = _library_scales(scale_a, scale_b, m, n)
    if scale_a.dim() and out_dtype != torch.bfloat16:
        raise ValueError(
            f"gemm_fp8 ref on a GPU: per-row/column scales need out_dtype=torch.bfloat16, got "
            f"{out_dtype}. torch._scaled_mm scales row-wise through hipBLASLt/cuBLASLt, whose "
            "row-wise scaling produces bfloat16 only; use per-tensor scales for a "
            f"{str(out_dtype).replace('torch.', '')} output, or take bfloat16 and cast it.")
    mp, np_, kp = (-(-d // ALIGN) * ALIGN for d in (m, n, k))
    if scale_a.dim():
        scale_a = torch.nn.functional.pad(scale_a, (0, 0, 0, mp - m))
        scale_b = torch.nn.functional.pad(scale_b, (0, np_ - n))
    return (_padded(a, mp, kp, col_major=False), _padded(b, kp, np_, col_major=True),
            scale_a, scale_b)


def _cpu_operands(a, b, scale_a, scale_b):
    """Row-wise scales always (see the module docstring), so both e4m3 formats run."""
    (m, _), n = a.shape, b.shape[1]
    rows = max(m, 2) if n == 1 else m
    scale_a, scale_b = _library_scales(scale_a, scale_b, rows, n, per_tensor_ok=False)
    if rows != m:   # a 1 x 1 output: a zero row keeps the scales row-wise
        a = torch.cat([a, a.new_zeros((rows - m, a.shape[1]))])
        scale_a = torch.cat([scale_a[:m], scale_a.new_ones((rows - m, 1))])
    return a, b, scale_a, scale_b


def prepare(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
            out_dtype: torch.dtype = torch.bfloat16):
    """Check and copy the operands into library form now; return the bare library call.

    The registry's ``prepare`` hook: a benchmark times only the returned call.
    """
    scales = operands.check_blockwise(a, b, scale_a, scale_b, out_dtype)
    m, n = a.shape[0], b.shape[1]
    if scales.along_k or scales.group_n > 1:
        sa, sb = operands.scales_per_element(a, b, scale_a, scale_b)
        a32, b32 = a.float() * sa, b.float() * sb
        return lambda: torch.matmul(a32, b32).to(out_dtype)
    if _backend.current().is_gpu:
        args = _gpu_operands(a, b, scale_a, scale_b, out_dtype)
    else:
        args = _cpu_operands(a, b, scale_a, scale_b)
    return lambda: torch._scaled_mm(*args, out_dtype=out_dtype)[:m, :n]


@rung(op="gemm_fp8", rung=None, name="ref", backends=("hip", "cuda", "interpreter"),
      dtypes=native_dtypes(), interpreter=True, kind="library", prepare=prepare)
def gemm_fp8_ref(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                 out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return prepare(a, b, scale_a, scale_b, out_dtype)()
