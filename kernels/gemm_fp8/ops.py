"""The public scaled FP8 GEMMs: ``kernels.matmul_fp8`` and ``kernels.gemm_fp8.blockwise_matmul``.

``matmul_fp8`` has the semantics of ``torch._scaled_mm``: ``(a * scale_a) @ (b * scale_b)``
with fp32 accumulation (see :mod:`.operands`). It runs the highest-numbered Triton rung of
``gemm_fp8`` that runs here and takes the FP8 format (:func:`kernels.gemm.ops.best_rung`;
v2, which compiles scales constant along K into v1's epilogue),
wrapped as the custom op ``kernels::matmul_fp8`` with a fake implementation, so
``torch.compile(fullgraph=True)`` keeps it in the graph; an eager call that nothing traces
runs the implementation itself (:func:`kernels.eager.direct`). Both run the launch plan kept
for the operands' metadata and ``out_dtype`` (:mod:`kernels.plans`): a repeated call skips the
checks, the rung lookup and the argument packing.

No autograd: like ``torch._scaled_mm`` it defines no derivative for FP8 operands. An
FP8 training recipe quantizes the output gradient itself and calls this op for the
two backward GEMMs (e.g. ``grad_a = matmul_fp8(grad_fp8, b_fp8.t(), ...)``).
"""
from __future__ import annotations

import torch

from .. import eager, plans
from ..gemm.ops import best_rung
from . import formats, operands
from .v2_triton_blockwise import plan as v2_plan


def _matmul_fp8_impl(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                     out_dtype: torch.dtype) -> torch.Tensor:
    return _plan(a, b, scale_a, scale_b, out_dtype).call(a, b, scale_a, scale_b)


_matmul_fp8 = torch.library.custom_op("kernels::matmul_fp8", _matmul_fp8_impl, mutates_args=())


@_matmul_fp8.register_fake
def _(a, b, scale_a, scale_b, out_dtype):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


def matmul_fp8(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
               out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``(a * scale_a) @ (b * scale_b)`` for FP8 ``a`` (M, K) and ``b`` (K, N), in ``out_dtype``.

    Scales are float32: a single number (per tensor), or ``(M, 1)`` for ``a`` and
    ``(1, N)`` for ``b`` (per row / per column). Prepare operands with
    :func:`kernels.gemm_fp8.quantize_fp8` in :func:`kernels.gemm_fp8.fp8_dtype`.
    Empty operands give what ``torch._scaled_mm`` gives: an empty result, or zeros
    for K = 0.
    """
    plan = _plan(a, b, scale_a, scale_b, out_dtype)
    if eager.direct(a, b, scale_a, scale_b):
        return plan.call(a, b, scale_a, scale_b)
    return _matmul_fp8(a, b, scale_a, scale_b, out_dtype)


_PLANS = plans.PlanCache()


def _plan(a, b, scale_a, scale_b, out_dtype) -> "_Checked":
    return _PLANS(plans.meta(a, b, scale_a, scale_b, extra=(out_dtype,)), _Checked,
                  a, b, scale_a, scale_b, out_dtype)


class _Checked(plans.Checked):
    """:func:`matmul_fp8`'s checks for operands of one metadata and ``out_dtype`` (a dtype
    equals only itself, so the key needs no type beside it)."""

    def __init__(self, a, b, scale_a, scale_b, out_dtype):
        operands.check(a, b, scale_a, scale_b, out_dtype, allow_empty=True)
        self.out_dtype = out_dtype

    def bind(self, a, b, scale_a, scale_b):
        """The best rung's plan (a rung without one is called as it is), or torch's result for
        empty operands."""
        out_dtype = self.out_dtype
        if a.numel() == 0 or b.numel() == 0:   # M, N or K is 0: what torch._scaled_mm returns
            return lambda a, b, *scales: torch.zeros((a.shape[0], b.shape[1]), dtype=out_dtype, device=a.device)
        # the rungs are registered under the e4m3 formats; an e5m2 operand of the family rides along
        rung = best_rung("gemm_fp8", formats.e4m3_of(a.dtype))
        if rung.plan:
            return rung.plan(a, b, scale_a, scale_b, out_dtype)
        return lambda a, b, scale_a, scale_b: rung(a, b, scale_a, scale_b, out_dtype=out_dtype)


def _blockwise_matmul_impl(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                           out_dtype: torch.dtype) -> torch.Tensor:
    return _blockwise_plan(a, a_scale, b, b_scale, out_dtype).call(a, b, a_scale, b_scale)


_BLOCKWISE_PLANS = plans.PlanCache()


def _blockwise_plan(a, a_scale, b, b_scale, out_dtype) -> "_CheckedBlockwise":
    return _BLOCKWISE_PLANS(plans.meta(a, a_scale, b, b_scale, extra=(out_dtype,)), _CheckedBlockwise,
                            a, a_scale, b, b_scale, out_dtype)


class _CheckedBlockwise(plans.Checked):
    """:func:`blockwise_matmul`'s checks for operands of one metadata and ``out_dtype``; its call
    is v2's launch plan (``call(a, b, a_scale, b_scale)``, the rung's order), or torch's result
    for empty operands."""

    def __init__(self, a, a_scale, b, b_scale, out_dtype):
        operands.check_blockwise(a, b, a_scale, b_scale, out_dtype, allow_empty=True)
        self.out_dtype = out_dtype

    def bind(self, a, b, a_scale, b_scale):
        out_dtype = self.out_dtype
        if a.numel() == 0 or b.numel() == 0:   # M, N or K is 0: as matmul_fp8
            return lambda a, b, *scales: torch.zeros((a.shape[0], b.shape[1]), dtype=out_dtype, device=a.device)
        return v2_plan(a, b, a_scale, b_scale, out_dtype)


_blockwise_matmul = torch.library.custom_op("kernels::blockwise_matmul_fp8", _blockwise_matmul_impl,
                                            mutates_args=())


@_blockwise_matmul.register_fake
def _(a, a_scale, b, b_scale, out_dtype):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


def blockwise_matmul(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                     out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """C = A·B for FP8 ``a`` (M, K) and ``b`` (K, N) with scales per block of 128 along K.

    ``a_scale`` (M, ceil(K/128)): one per row and 1 x 128 tile of A. ``b_scale``
    (ceil(K/128), ceil(N/128)) for 128 x 128 blocks of B (a weight), or (ceil(K/128), N)
    for 128 x 1 (per column and K block: wgrad's token-major operand). Made by
    :func:`kernels.gemm_fp8.quantize`::

        a8, sa = quantize(x, "block1x128", fp8)                 # x: (M, K)
        w8, sw = quantize(w, "block128x128", fp8)               # w: (N, K), nn.Linear's
        y = blockwise_matmul(a8, sa, w8.t(), sw.t())            # x @ w.T

    The scales are applied per K block on the fp32 accumulator inside the loop
    (DeepSeek-V3 style; rung v2, :mod:`.v2_triton_blockwise`); scales per tensor or per
    row/column are taken too. Empty operands give what :func:`kernels.matmul_fp8` gives.
    Custom op ``kernels::blockwise_matmul_fp8`` (``torch.compile`` keeps it in the graph); no
    autograd, as for :func:`kernels.matmul_fp8`.
    """
    plan = _blockwise_plan(a, a_scale, b, b_scale, out_dtype)   # checked once per metadata
    if eager.direct(a, b, a_scale, b_scale):
        return plan.call(a, b, a_scale, b_scale)
    return _blockwise_matmul(a, a_scale, b, b_scale, out_dtype)
