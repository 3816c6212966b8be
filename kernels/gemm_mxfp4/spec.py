"""The MX GEMM problem, stated once: C (M, N) = A (M, K) @ B (K, N) in MXFP4 (or MXFP8).

A and B^T are stored as MXFP4 (:mod:`.formats`, :mod:`.operands`): (M, K/2) and
(N, K/2) uint8 bytes of packed e2m1 codes, (M, K/32) and (N, K/32) uint8 e8m0 scales;
C is bfloat16 by default. The op's one "dtype" is :data:`.formats.FORMAT`
(``torch.float4_e2m1fn_x2``): it names the format for the registry, the results and
the roofline's fp4 roof; C's dtype is what the harness judges in. The op's second dtype,
``torch.float8_e4m3fn`` (:data:`.formats.MXFP8`), is MXFP8: e4m3 elements one per byte,
(M, K) and (N, K), with the same e8m0 scales per 32 along K.

As for FP8, the harness judges C against the float64 product of the *dequantized*
operands: quantization error is the recipe's business, not the kernel's.
"""
from __future__ import annotations

import torch

from ..gemm import spec as gemm_spec
from ..registry import OpSpec, register_op
from ..gemm_fp8.quantize_ref import quantize_one
from ..microscaling import e8m0_values
from .formats import BLOCK, DTYPES, FORMAT, dequantize_mxfp4, quantize_mxfp4

OUT_DTYPE = torch.bfloat16   # the default output, and the one bytes_moved counts

# Small and odd in M and N; K from one scale block up, and 53 (padded to 64 by quantizing).
SMOKE_SHAPES = (
    (1, 1, 32),
    (37, 29, 53),
    (5, 67, 96),
    (64, 48, 128),
    (19, 1, 160),
)
BENCH_SHAPES = {name: shape for name, shape in gemm_spec.BENCH_SHAPES.items() if min(shape) >= 128}


def make_inputs(shape, dtype=FORMAT, device="cpu", seed=0, layout="row"):
    """Fresh random (a_packed, a_scales, b_packed, b_scales) for A (M, K) @ B (K, N).

    Magnitudes spread over ~e^+-2 per row of A, per column of B and per position
    along K, so neighbouring blocks get different scales. ``layout`` "row" stores all
    four K-contiguous (the fast layout); "col" stores them transposed (rows contiguous).
    ``dtype`` float8_e4m3fn gives MXFP8 operands (:func:`kernels.gemm_fp8.quantize`'s
    ``mx32``), with K as it is (no padding).
    """
    if dtype not in DTYPES:
        raise TypeError(f"gemm_mxfp4 inputs are one of {DTYPES}, got {dtype}")
    m, n, k = shape
    gen = torch.Generator(device="cpu").manual_seed(seed)
    def spread(rows):
        return (torch.randn(rows, k, generator=gen) * torch.randn(rows, 1, generator=gen).exp()
                * torch.randn(1, k, generator=gen).exp())
    a, b_t = spread(m), spread(n)
    if dtype == FORMAT:
        tensors = (*quantize_mxfp4(a, axis=1), *quantize_mxfp4(b_t, axis=1))
    else:
        tensors = (*quantize_one(a, "mx32", dtype), *quantize_one(b_t, "mx32", dtype))
    if layout == "col":
        tensors = tuple(t.t().contiguous().t() for t in tensors)
    elif layout != "row":
        raise ValueError(f"layout must be 'row' or 'col', got {layout!r}")
    return tuple(t.to(device) for t in tensors)


def dequantize(elements: torch.Tensor, scales: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """The values MX operands (rows, K) stand for, in ``dtype`` (float64 holds every MXFP4 and
    MXFP8 value; float32 and bfloat16 all but the extremes of the largest scales)."""
    if elements.dtype == torch.uint8:
        return dequantize_mxfp4(elements, scales, axis=1, dtype=dtype)
    work = torch.float64 if dtype == torch.float64 else torch.float32   # exact powers of two
    factor = e8m0_values(scales, work).repeat_interleave(BLOCK, 1)[:, :elements.shape[1]]
    return (elements.to(work) * factor).to(dtype)


def reference(a_packed, a_scales, b_packed, b_scales) -> torch.Tensor:
    """float64 on the CPU, of the dequantized operands (exact: MX values are float64 values)."""
    def dequant(elements, scales):
        return dequantize(elements.detach().cpu(), scales.detach().cpu())
    return dequant(a_packed, a_scales) @ dequant(b_packed, b_scales).T


def bytes_moved(shape, dtype: torch.dtype = FORMAT) -> float:
    """Minimum traffic: A and B read once (half a byte per element for MXFP4, one for
    MXFP8, one scale byte per 32), C written once in bfloat16. MXFP4's K counts as padded
    to a multiple of 32."""
    m, n, k = shape
    blocks = -(-k // BLOCK)
    element_bytes = blocks * BLOCK // 2 if dtype == FORMAT else k
    return float((m + n) * (element_bytes + blocks) + m * n * OUT_DTYPE.itemsize)


SPEC = register_op(OpSpec(
    name="gemm_mxfp4",
    make_inputs=make_inputs,
    reference=reference,
    flops=gemm_spec.flops,
    bytes_moved=bytes_moved,
    smoke_shapes=SMOKE_SHAPES,
    bench_shapes=BENCH_SHAPES,
    dtypes=DTYPES,
    shape_names=("M", "N", "K"),
    quick_shapes=("square 8192", "decode M=128 (4096x14336)"),
))
