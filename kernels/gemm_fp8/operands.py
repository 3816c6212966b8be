"""What a scaled FP8 GEMM accepts, checked once for every rung and the public op.

The semantics are those of ``torch._scaled_mm``: ``c = (a * scale_a) @ (b * scale_b)``
with ``a`` (M, K) and ``b`` (K, N) in FP8 formats of one family (both e4m3, or one e4m3
and one e5m2 as FP8 backward GEMMs take a gradient: OCP e4m3fn/e5m2 or fnuz
e4m3fnuz/e5m2fnuz, :func:`.formats.same_family`), and float32 scales that are
either one number (per tensor) or one per row of ``a`` (M, 1) / per column of ``b``
(1, N). A kernel reads a scale through a stride: 0 for a per-tensor scale, so one
epilogue serves both granularities.

Block scales (:func:`check_blockwise`, rung v2 and :func:`kernels.gemm_fp8.blockwise_matmul`)
also change along K, every ``SCALE_K`` = 128 elements: ``a`` scaled per 1 x 128 (a_scale
(M, ceil(K/128))), ``b`` per 128 x 128 (b_scale (ceil(K/128), ceil(N/128))) or per 128 x 1
(b_scale (ceil(K/128), N)). Scales constant along K are the special case of one K block.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import validate
from .formats import OPERAND_DTYPES, same_family

OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SCALE_K = 128   # elements along K that one block scale covers (DeepSeek-V3's tile)


def _scale_stride(name: str, scale: torch.Tensor, length: int, per_shape: tuple[int, int],
                  axis: int) -> int:
    if scale.numel() == 1 and scale.dim() <= 2:
        return 0
    if tuple(scale.shape) == per_shape:
        return scale.stride(axis)
    kind = "row" if axis == 0 else "column"
    raise ValueError(f"{name} has shape {tuple(scale.shape)}; expected a single number "
                     f"(per tensor) or {per_shape} (one per {kind}, {length} of them)")


def check_family(**named: torch.Tensor) -> None:
    """Refuse two FP8 operands of one GEMM whose formats are of different families (the
    names are the caller's, for the message): OCP e4m3fn/e5m2 or fnuz e4m3fnuz/e5m2fnuz."""
    (na, a), (nb, b) = named.items()
    if not same_family(a.dtype, b.dtype):
        raise TypeError(f"{na} is {a.dtype} and {nb} {b.dtype}: FP8 formats of different families (OCP "
                        "e4m3fn/e5m2 or fnuz e4m3fnuz/e5m2fnuz) do not mix in one GEMM")


def _check_common(a, b, scale_a, scale_b, out_dtype, allow_empty: bool) -> None:
    # each alone first, so that a dtype error names the non-FP8 one; then what they share
    validate.tensor("a", a, ndim=2, dtypes=OPERAND_DTYPES, allow_empty=allow_empty)
    validate.tensor("b", b, ndim=2, dtypes=OPERAND_DTYPES, allow_empty=allow_empty)
    validate.same_device(a=a, b=b)
    check_family(a=a, b=b)
    validate.inner_dims(a, b)
    validate.tensor("scale_a", scale_a, dtypes=(torch.float32,), allow_empty=allow_empty)
    validate.tensor("scale_b", scale_b, dtypes=(torch.float32,), allow_empty=allow_empty)
    validate.same_device(a=a, b=b, scale_a=scale_a, scale_b=scale_b)
    if out_dtype not in OUT_DTYPES:   # the call only to refuse it: none on the hot path
        validate.dtype_choice("out_dtype", out_dtype, OUT_DTYPES)


def check(a, b, scale_a, scale_b, out_dtype, allow_empty: bool = False) -> tuple[int, int]:
    """Validate the operands; return the element strides of scale_a and scale_b.

    ``allow_empty``: the public op takes M, N or K = 0 as ``torch._scaled_mm`` does;
    a kernel launch does not."""
    _check_common(a, b, scale_a, scale_b, out_dtype, allow_empty)
    (m, _), n = a.shape, b.shape[1]
    return (_scale_stride("scale_a", scale_a, m, (m, 1), 0),
            _scale_stride("scale_b", scale_b, n, (1, n), 1))


@dataclass(frozen=True)
class BlockScales:
    """How a kernel reads scales that may change along K: ``a_scale[row, k // 128]`` and
    ``b_scale[k // 128, col // group_n]``, through these element strides (0 along an axis
    the scale does not change on)."""

    stride_sam: int
    stride_sak: int
    stride_sbk: int
    stride_sbn: int
    group_n: int        # columns of B one scale covers: 1 (per column) or 128 (128 x 128 blocks)

    @property
    def along_k(self) -> bool:
        """``SCALES_ALONG_K``: whether the kernel scales each K block in its loop. So it must
        where any scale changes along K; and B's 128 x 128 blocks (``group_n`` 128) take the
        loop even with one block along K (K <= 128, strides 0 along K): that is the binary
        compiled with ``GROUP_N`` 128 (:data:`.configs.BINARIES`' ``v2_blockwise``), while the
        epilogue's binaries (scales constant along K) are compiled with ``GROUP_N`` 1."""
        return bool(self.stride_sak or self.stride_sbk) or self.group_n > 1


def check_blockwise(a, b, scale_a, scale_b, out_dtype, allow_empty: bool = False) -> BlockScales:
    """Validate operands with scales per tensor, per row/column or per K block (module doc)."""
    _check_common(a, b, scale_a, scale_b, out_dtype, allow_empty)
    (m, k), n = a.shape, b.shape[1]
    kb, nb = -(-k // SCALE_K), -(-n // SCALE_K)
    if scale_a.numel() == 1 and scale_a.dim() <= 2:
        sam, sak = 0, 0
    elif tuple(scale_a.shape) in ((m, 1), (m, kb)):
        sam, sak = scale_a.stride(0), (scale_a.stride(1) if scale_a.shape[1] > 1 else 0)
    else:
        raise ValueError(f"scale_a has shape {tuple(scale_a.shape)}; expected a single number "
                         f"(per tensor), {(m, 1)} (per row) or {(m, kb)} (per row and "
                         f"{SCALE_K} elements of K = {k})")
    shape_b = tuple(scale_b.shape)
    if scale_b.numel() == 1 and scale_b.dim() <= 2:
        return BlockScales(sam, sak, 0, 0, 1)
    sbk = scale_b.stride(0) if shape_b[0] > 1 else 0
    if shape_b in ((1, n), (kb, n)):
        return BlockScales(sam, sak, sbk, scale_b.stride(1), 1)
    if shape_b == (kb, nb):
        return BlockScales(sam, sak, sbk, scale_b.stride(1), SCALE_K)
    raise ValueError(f"scale_b has shape {shape_b}; expected a single number (per tensor), "
                     f"{(1, n)} (per column), {(kb, n)} (per column and {SCALE_K} elements of "
                     f"K = {k}) or {(kb, nb)} ({SCALE_K} x {SCALE_K} blocks)")


def scales_per_element(a, b, scale_a, scale_b) -> tuple[torch.Tensor, torch.Tensor]:
    """Each element's scale, (M, K) for ``a`` and (K, N) for ``b``, in the scales' dtype:
    the semantics every scale layout of :func:`check_blockwise` stands for."""
    (m, k), n = a.shape, b.shape[1]
    layout = check_blockwise(a, b, scale_a, scale_b, torch.float32, allow_empty=True)
    sa = scale_a.reshape(scale_a.shape if scale_a.dim() == 2 else (1, 1))
    sb = scale_b.reshape(scale_b.shape if scale_b.dim() == 2 else (1, 1))
    sa = sa.repeat_interleave(SCALE_K, 1)[:, :k] if sa.shape[1] > 1 else sa
    sb = sb.repeat_interleave(SCALE_K, 0)[:k] if sb.shape[0] > 1 else sb
    if layout.group_n > 1:
        sb = sb.repeat_interleave(layout.group_n, 1)[:, :n]
    return sa.expand(m, k), sb.expand(k, n)
