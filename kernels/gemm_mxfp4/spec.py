"""The MXFP4 GEMM problem, stated once: C (M, N) = A (M, K) @ B (K, N) in MXFP4.

A and B^T are stored as MXFP4 (:mod:`.formats`, :mod:`.operands`): (M, K/2) and
(N, K/2) uint8 bytes of packed e2m1 codes, (M, K/32) and (N, K/32) uint8 e8m0 scales;
C is bfloat16 by default. The op's one "dtype" is :data:`.formats.FORMAT`
(``torch.float4_e2m1fn_x2``): it names the format for the registry, the results and
the roofline's fp4 roof; C's dtype is what the harness judges in.

As for FP8, the harness judges C against the float64 product of the *dequantized*
operands: quantization error is the recipe's business, not the kernel's.
"""
from __future__ import annotations

import torch

from ..gemm import spec as gemm_spec
from ..registry import OpSpec, register_op
from .formats import BLOCK, FORMAT, dequantize_mxfp4, quantize_mxfp4

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
    """
    if dtype != FORMAT:
        raise TypeError(f"gemm_mxfp4 inputs are {FORMAT}, got {dtype}")
    m, n, k = shape
    gen = torch.Generator(device="cpu").manual_seed(seed)
    def spread(rows):
        return (torch.randn(rows, k, generator=gen) * torch.randn(rows, 1, generator=gen).exp()
                * torch.randn(1, k, generator=gen).exp())
    a, b_t = spread(m), spread(n)
    tensors = (*quantize_mxfp4(a, axis=1), *quantize_mxfp4(b_t, axis=1))
    if layout == "col":
        tensors = tuple(t.t().contiguous().t() for t in tensors)
    elif layout != "row":
        raise ValueError(f"layout must be 'row' or 'col', got {layout!r}")
    return tuple(t.to(device) for t in tensors)


def reference(a_packed, a_scales, b_packed, b_scales) -> torch.Tensor:
    """float64 on the CPU, of the dequantized operands (exact: MXFP4 values are float64 values)."""
    def dequant(packed, scales):
        return dequantize_mxfp4(packed.detach().cpu(), scales.detach().cpu(), axis=1,
                                dtype=torch.float64)
    return dequant(a_packed, a_scales) @ dequant(b_packed, b_scales).T


def bytes_moved(shape, dtype: torch.dtype = FORMAT) -> float:
    """Minimum traffic: A and B read once (half a byte per element, one scale byte per
    32), C written once in bfloat16. K counts as padded to a multiple of 32."""
    m, n, k = shape
    k_pad = -(-k // BLOCK) * BLOCK
    return float((m + n) * (k_pad // 2 + k_pad // BLOCK) + m * n * OUT_DTYPE.itemsize)


SPEC = register_op(OpSpec(
    name="gemm_mxfp4",
    make_inputs=make_inputs,
    reference=reference,
    flops=gemm_spec.flops,
    bytes_moved=bytes_moved,
    smoke_shapes=SMOKE_SHAPES,
    bench_shapes=BENCH_SHAPES,
    dtypes=(FORMAT,),
    shape_names=("M", "N", "K"),
    quick_shapes=("square 8192", "decode M=128 (4096x14336)"),
))
