"""Record every FP8 quantization a block runs: the fused Triton quantize
(``quantize_kernel.launch``, behind ``kernels.gemm_fp8.quantize``), the grouped one of the
FP8 MoE experts (``grouped_gemm_fp8.quantize_kernel.launch``) and the plain torch one
(``formats.quantize_fp8``), with the shape of the tensor each got and the FP8 format it
wrote."""
from __future__ import annotations

import contextlib
from typing import Iterator

from kernels.gemm_fp8 import formats, quantize_kernel
from kernels.moe.grouped_gemm_fp8 import quantize_kernel as grouped_kernel


@contextlib.contextmanager
def quantizations() -> Iterator[list[tuple[str, tuple[int, ...], object]]]:
    """Within the block, a list of (``"fused"`` | ``"grouped"`` | ``"torch"``, input shape, FP8 dtype)."""
    seen: list = []
    fused, grouped, plain = quantize_kernel.launch, grouped_kernel.launch, formats.quantize_fp8

    def counted_fused(x, granularity, fp8_dtype, *args):
        seen.append(("fused", tuple(x.shape), fp8_dtype))
        return fused(x, granularity, fp8_dtype, *args)

    def counted_grouped(t, offsets, fp8_dtype, *args):
        seen.append(("grouped", tuple(t.shape), fp8_dtype))
        return grouped(t, offsets, fp8_dtype, *args)

    def counted_plain(x, dtype=None, granularity="tensor", scale=None):
        seen.append(("torch", tuple(x.shape), dtype))
        return plain(x, dtype, granularity, scale)

    quantize_kernel.launch, grouped_kernel.launch, formats.quantize_fp8 = counted_fused, counted_grouped, counted_plain
    try:
        yield seen
    finally:
        quantize_kernel.launch, grouped_kernel.launch, formats.quantize_fp8 = fused, grouped, plain
