"""The MXFP8 grouped GEMM problem, stated once: y (T, N) = per group g,
dequant(x[rows of g], sx[rows of g]) @ dequant(w[g], sw[g]).

x is float8_e4m3fn (T, K) with its rows sorted by group and sx uint8 (T, ceil(K/32)) its
e8m0 scales, one per 32 elements of a row along K; w is float8_e4m3fn (G, K, N) and sw
uint8 (G, N, ceil(K/32)), one scale per 32 elements of each expert's column along K (the
layout of ``kernels.matmul_mxfp4``'s B scales, per expert); offsets int32 (G,) as in
:mod:`kernels.moe.grouped_gemm`. K need not be a multiple of 32: the last block of a row
is partial. The output is bfloat16 by default.

A problem is grouped GEMM's tuple (T, K, N, G, routing), with its smoke shapes and
benchmark presets. As for ``grouped_gemm_fp8`` and ``gemm_mxfp4`` the harness judges y
against the float64 product of the *dequantized* operands (exact: an MXFP8 value is a
float64 value): quantization error belongs to the recipe.
"""
from __future__ import annotations

import torch

from ...gemm_fp8.quantize_ref import quantize_one
from ...gemm_mxfp4.spec import dequantize
from ...microscaling import BLOCK
from ...registry import OpSpec, register_op
from ..grouped_gemm import spec as grouped_spec

DTYPE = torch.float8_e4m3fn
"""MXFP8's element format here: OCP e4m3 on every GPU (the MX spec has no fnuz form)."""
DTYPES = (DTYPE,)
OUT_DTYPE = torch.bfloat16


def quantize_weight(w: torch.Tensor, dtype: torch.dtype = DTYPE, scale_rule: str = "ocp"
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """w (G, K, N) in MXFP8 along K: (elements (G, K, N) stored K-contiguous, scales (G, N, ceil(K/32)));
    ``scale_rule``: the e8m0 rule (:func:`kernels.gemm_fp8.quantize_ref.quantize_one`'s)."""
    g, k, n = w.shape
    q, scales = quantize_one(w.transpose(1, 2).reshape(g * n, k), "mx32", dtype, scale_rule)
    return q.reshape(g, n, k).transpose(1, 2), scales.reshape(g, n, -(-k // BLOCK))


def make_inputs(shape, dtype=DTYPE, device="cpu", seed=0, layout="col"):
    """Fresh random (x, sx, w, sw, offsets): float32 operands with magnitudes spread over
    ~e^±2 per row of x, per column of every w[g] and per position along K, so neighbouring
    blocks get different scales, quantized to MXFP8 along K. ``layout`` "col" (default)
    stores w K-contiguous, the layout MX matrix cores read; "row" stores it (G, K, N)
    row-major."""
    if dtype not in DTYPES:
        raise TypeError(f"grouped_gemm_mxfp8 inputs are {DTYPE} (OCP MXFP8), got {dtype}")
    t, k, n, g, routing = shape
    gen = torch.Generator(device="cpu").manual_seed(seed)
    along_k = torch.randn(k, generator=gen).exp()
    x = torch.randn(t, k, generator=gen) * torch.randn(t, 1, generator=gen).exp() * along_k
    w = torch.randn(g, k, n, generator=gen) * torch.randn(g, 1, n, generator=gen).exp() * along_k[:, None]
    x8, sx = quantize_one(x, "mx32", dtype)
    w8, sw = quantize_weight(w, dtype)
    if layout == "row":
        w8 = w8.contiguous()
    elif layout != "col":
        raise ValueError(f"layout must be 'row' or 'col', got {layout!r}")
    offsets = grouped_spec.offsets_from_sizes(grouped_spec.group_sizes(t, g, routing, gen), device)
    return x8.to(device), sx.to(device), w8.to(device), sw.to(device), offsets


def dequantized(x, sx, w, sw, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """(x (T, K), w (G, K, N)) as the values the MXFP8 operands stand for, on the CPU."""
    g, k, n = w.shape
    x_values = dequantize(x.detach().cpu(), sx.detach().cpu(), dtype)
    w_rows = w.detach().cpu().transpose(1, 2).reshape(g * n, k)
    w_values = dequantize(w_rows, sw.detach().cpu().reshape(g * n, -1), dtype)
    return x_values, w_values.reshape(g, n, k).transpose(1, 2)


def reference(x, sx, w, sw, offsets) -> torch.Tensor:
    """float64 on the CPU, of the dequantized operands."""
    return grouped_spec.reference(*dequantized(x, sx, w, sw), offsets)


def bytes_moved(shape, dtype: torch.dtype = DTYPE) -> float:
    """Minimum traffic: x and every expert's weights read once (a byte per element and one
    scale byte per 32), y written once in bfloat16."""
    t, k, n, g, _ = shape
    blocks = -(-k // BLOCK)
    return float((t + g * n) * (k + blocks) + t * n * OUT_DTYPE.itemsize)


SPEC = register_op(OpSpec(
    name="grouped_gemm_mxfp8", make_inputs=make_inputs, reference=reference,
    flops=grouped_spec.flops, bytes_moved=bytes_moved, dtypes=DTYPES,
    smoke_shapes=grouped_spec.SMOKE_SHAPES, bench_shapes=grouped_spec.BENCH_SHAPES,
    shape_names=grouped_spec.SPEC.shape_names, quick_shapes=grouped_spec.SPEC.quick_shapes,
))
