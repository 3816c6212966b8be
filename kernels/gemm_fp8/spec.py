"""The scaled FP8 GEMM problem, stated once: C (M, N) = (A * s_a) @ (B * s_b).

A and B are FP8 (one e4m3 format here; the rungs also take one e5m2 operand of the same
family, a gradient, checked in ``tests/test_gemm_fp8.py``), the scales float32, C bfloat16
by default. Rungs, benchmarks and the harness read inputs, work and traffic from here.

The harness judges C against the float64 product of the *dequantized* FP8 operands:
quantization error is the recipe's business, not the kernel's, so a kernel is only
charged for its accumulation and its output rounding.
"""
from __future__ import annotations

import torch

from ..registry import OpSpec, register_op
from ..gemm import spec as gemm_spec
from .formats import FP8_DTYPES, quantize_fp8
from .operands import scales_per_element
from .quantize_ref import quantize_one

OUT_DTYPE = torch.bfloat16   # the default output, and the one bytes_moved counts

# The GEMM's smoke shapes; benchmark presets: its large ones plus FP8-era models.
SMOKE_SHAPES = gemm_spec.SMOKE_SHAPES
BENCH_SHAPES = {
    **{name: shape for name, shape in gemm_spec.BENCH_SHAPES.items() if min(shape) >= 128},
    "deepseek-v3 mlp up (8192 tok)": (8192, 18432, 7168),
}


GRANULARITIES = ("tensor", "channel", "block128x128", "block128x1")


def make_inputs(shape, dtype=torch.float8_e4m3fn, device="cpu", seed=0, layout="row",
                granularity=None):
    """Fresh random (a_fp8, b_fp8, scale_a, scale_b), quantized from float32 by amax.

    ``granularity`` "tensor" gives scalar scales, "channel" a per-row scale for A and a
    per-column one for B; by default odd seeds take "channel" and even seeds "tensor", so
    the harness's random seeds cover both and a report's seed reproduces its case. Rows
    of A and columns of B get magnitudes spread over ~e^±2, so per-channel scales differ.
    The block granularities (rung v2 only; ask for them by name) scale A per 1 x 128 and
    B per 128 x 128 ("block128x128", DeepSeek-V3's forward and dgrad) or per 128 x 1
    ("block128x1", its wgrad's token-major operand); there every 128 elements of K also
    get a magnitude of their own, so the K blocks' scales differ too.
    ``layout`` as the GEMM's (:func:`kernels.gemm.spec.with_layout`): "row" both row-major,
    "col" both column-major, "NT" B column-major (K-contiguous, the layout FP8 matrix cores,
    ``torch._scaled_mm`` and nn.Linear's forward take).
    """
    if dtype not in FP8_DTYPES:
        raise TypeError(f"gemm_fp8 inputs are one of {FP8_DTYPES}, got {dtype}")
    granularity = granularity or ("channel" if seed % 2 else "tensor")
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    m, n, k = shape
    gen = torch.Generator(device="cpu").manual_seed(seed)
    a = torch.randn(m, k, generator=gen) * torch.randn(m, 1, generator=gen).exp()
    b = torch.randn(k, n, generator=gen) * torch.randn(1, n, generator=gen).exp()
    if granularity.startswith("block"):
        k_blocks = torch.randn(-(-k // 128), generator=gen).exp().repeat_interleave(128)[:k]
        a8, scale_a = quantize_one(a * k_blocks, "block1x128", dtype)
        # B's blocks are quantized on B^T, whose rows run along K: 128 x 128 stays, 128 x 1 is 1 x 128
        b_t_granularity = {"block128x128": "block128x128", "block128x1": "block1x128"}[granularity]
        b8, scale_b = quantize_one((b * k_blocks[:, None]).t(), b_t_granularity, dtype)
        b8, scale_b = b8.t(), scale_b.t()
    else:
        per_channel = granularity == "channel"
        a8, scale_a = quantize_fp8(a, dtype, "row" if per_channel else "tensor")
        b8, scale_b = quantize_fp8(b, dtype, "col" if per_channel else "tensor")
    # row-major first: a block-scaled B was quantized as its transpose and is a view of it
    a8, b8 = gemm_spec.with_layout(a8.contiguous(), b8.contiguous(), layout)
    return tuple(t.to(device) for t in (a8, b8, scale_a, scale_b))


def reference(a, b, scale_a, scale_b) -> torch.Tensor:
    """float64 on the CPU, of the dequantized operands (any scale layout v2 takes)."""
    sa, sb = scales_per_element(a, b, scale_a, scale_b)
    def dequant(x, s):
        return x.detach().cpu().double() * s.detach().cpu().double()
    return dequant(a, sa) @ dequant(b, sb)


def bytes_moved(shape, dtype: torch.dtype) -> float:
    """Minimum traffic: A and B read once (1 byte each), C written once in bfloat16.

    The scales (at most M + N floats) are left out: under 0.1 % at any bench shape.
    """
    m, n, k = shape
    fp8_bytes = torch.empty((), dtype=dtype).element_size()
    return float((m * k + k * n) * fp8_bytes + m * n * OUT_DTYPE.itemsize)


SPEC = register_op(OpSpec(
    name="gemm_fp8",
    make_inputs=make_inputs,
    reference=reference,
    flops=gemm_spec.flops,
    bytes_moved=bytes_moved,
    smoke_shapes=SMOKE_SHAPES,
    bench_shapes=BENCH_SHAPES,
    dtypes=FP8_DTYPES,
    shape_names=("M", "N", "K"),
    quick_shapes=("square 8192", "decode M=128 (4096x14336)"),
))
