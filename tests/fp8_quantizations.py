"""Record every FP8 quantization a block runs: the fused Triton quantize
(``quantize_kernel.launch``, behind ``kernels.gemm_fp8.quantize``), the grouped one of the
FP8 MoE experts (``grouped_gemm_fp8.quantize_kernel.launch``) and the plain torch one
(``formats.quantize_fp8``), with the shape of the tensor each got and the FP8 format it
wrote; and the torch functions a block calls (:class:`TorchCalls`; in a backward, the aten ops
it runs, :class:`AtenCalls`), to show that no torch pass reads an operand for its amax."""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

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


class TorchCalls(torch.overrides.TorchFunctionMode):
    """The torch functions called within the block, by name, with their first argument's shape."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        first = args[0] if args else None
        self.calls.append((getattr(func, "__name__", str(func)), tuple(getattr(first, "shape", ()))))
        return func(*args, **(kwargs or {}))


class AtenCalls(TorchDispatchMode):
    """The aten ops (and custom ops) run within the block, by name (``abs``, ``amax``, ...),
    with their first argument's shape: what :class:`TorchCalls` cannot see, a backward
    (autograd's engine runs it outside torch-function modes, not outside dispatch modes)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        first = args[0] if args else None
        self.calls.append((func.overloadpacket.__name__, tuple(getattr(first, "shape", ()))))
        return func(*args, **(kwargs or {}))


def amax_passes(calls: list, shapes) -> list:
    """The torch ``abs``/``amax``/``max`` calls of :class:`TorchCalls` or :class:`AtenCalls` on a
    tensor of one of ``shapes``."""
    return [(name, shape) for name, shape in calls if name in ("abs", "amax", "max") and shape in shapes]
