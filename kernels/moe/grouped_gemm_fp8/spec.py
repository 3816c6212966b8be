"""The FP8 grouped GEMM problem, stated once: y (T, N) = per group g,
(x[rows of g] * sx[rows of g]) @ (w[g] * sw[g]).

x is FP8 (T, K) with its rows sorted by group, sx float32 (T,) (one scale per token,
row-wise), w FP8 (G, K, N) in the same e4m3 format, sw float32 (G, N) (one scale per
expert and output channel), offsets int32 (G,) as in :mod:`kernels.moe.grouped_gemm`.
The output is bfloat16 by default, as :mod:`kernels.gemm_fp8`'s (the dtype the next
layer's FP8 recipe quantizes from, and the only one row-wise scaled library GEMMs give).

A problem is grouped GEMM's tuple (T, K, N, G, routing), with its smoke shapes and
benchmark presets: the same MoE layers, run in FP8. As in ``gemm_fp8`` the harness
judges y against the float64 product of the *dequantized* operands: quantization error
belongs to the recipe, a kernel is charged for its accumulation and output rounding.
"""
from __future__ import annotations

import torch

from ...gemm_fp8.formats import FP8_DTYPES, quantize_fp8
from ...gemm_fp8 import spec as gemm_fp8_spec
from ...registry import OpSpec, register_op
from ..grouped_gemm import spec as grouped_spec


def make_inputs(shape, dtype=torch.float8_e4m3fn, device="cpu", seed=0, layout="row"):
    """Fresh random (x, sx, w, sw, offsets): float32 operands with per-row (x) and
    per-column (w) magnitudes spread over ~e^±2, so the scales differ, quantized by amax
    per token and per expert channel. ``layout`` "col" gives column-major x and w stored
    (G, N, K) seen as (G, K, N), K-contiguous as ``nn.Linear`` expert weights are."""
    if dtype not in FP8_DTYPES:
        raise TypeError(f"grouped_gemm_fp8 inputs are one of {FP8_DTYPES}, got {dtype}")
    t, k, n, g, routing = shape
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(t, k, generator=gen) * torch.randn(t, 1, generator=gen).exp()
    w = torch.randn(g, k, n, generator=gen) * torch.randn(g, 1, n, generator=gen).exp()
    x8, sx = quantize_fp8(x, dtype, "row")
    # one scale per column of every w[g]: the columns of the (K, G*N) side-by-side view
    w8, sw = quantize_fp8(w.transpose(0, 1).reshape(k, g * n), dtype, "col")
    w8 = w8.reshape(k, g, n).transpose(0, 1)
    if layout == "col":
        x8, w8 = x8.t().contiguous().t(), w8.transpose(1, 2).contiguous().transpose(1, 2)
    elif layout == "row":
        w8 = w8.contiguous()
    else:
        raise ValueError(f"layout must be 'row' or 'col', got {layout!r}")
    offsets = grouped_spec.offsets_from_sizes(grouped_spec.group_sizes(t, g, routing, gen), device)
    return (x8.to(device), sx.reshape(t).to(device), w8.to(device), sw.reshape(g, n).to(device),
            offsets)


def reference(x, sx, w, sw, offsets) -> torch.Tensor:
    """float64 on the CPU, of the dequantized operands."""
    x64 = x.detach().cpu().double() * sx.detach().cpu().double()[:, None]
    w64 = w.detach().cpu().double() * sw.detach().cpu().double()[:, None, :]
    return grouped_spec.reference(x64, w64, offsets)


def bytes_moved(shape, dtype: torch.dtype) -> float:
    """Minimum traffic: the FP8 GEMM's for (T, N, K) (x and one weight read once, y
    written once in bfloat16, scales left out) plus the other G - 1 experts' weights."""
    t, k, n, g, _ = shape
    fp8_bytes = torch.empty((), dtype=dtype).element_size()
    return gemm_fp8_spec.bytes_moved((t, n, k), dtype) + float((g - 1) * k * n * fp8_bytes)


SPEC = register_op(OpSpec(
    name="grouped_gemm_fp8", make_inputs=make_inputs, reference=reference,
    flops=grouped_spec.flops, bytes_moved=bytes_moved, dtypes=FP8_DTYPES,
    smoke_shapes=grouped_spec.SMOKE_SHAPES, bench_shapes=grouped_spec.BENCH_SHAPES,
    shape_names=grouped_spec.SPEC.shape_names, quick_shapes=grouped_spec.SPEC.quick_shapes,
))
