"""The weight gradient of a master weight: ``matmul_to(a, b, dtype)``, the GEMM's fp32 sum written
in the weight's own dtype (fp32) by the GEMM itself.

Under ``torch.autocast`` a Linear's fp32 weight is cast to bf16 for the GEMMs, and autograd then
hands the weight its gradient through the cast's backward: a bf16 GEMM result, rounded to bf16's
8 bits, cast back to fp32 by one more device op per weight per step. Megatron's gradient
accumulation fusion writes the fp32 gradient from the GEMM instead; :func:`kernels.gemm.linear.linear`
does the same here, with this function: the best rung's launch plan (v6's) with C allocated in
``dtype`` (:meth:`~kernels.gemm.v6_persistent.LaunchPlan.writing`), so the accumulator reaches the
gradient unrounded and no cast runs.

Not one of the package's public ops: no checks of its own (its caller's operands passed
:func:`kernels.matmul`'s when the forward ran) and no autograd (a backward's GEMM). Where a graph
of the backward is made (``create_graph=True``), the gradient must be differentiable: the
differentiable GEMM runs, and a cast. A traced backward (``torch.compile``'s) sees the custom op ``kernels::matmul_to``, with a
fake; an eager one runs its implementation (:func:`kernels.eager.direct`).
"""
from __future__ import annotations

import torch

from .. import eager, plans
from . import ops


def matmul_to(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``a (M, K) @ b (K, N)`` with its fp32 sum stored in ``dtype``."""
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return ops.matmul(a, b).to(dtype)
    if eager.direct(a, b):
        return _matmul_to_impl(a, b, dtype)
    return _matmul_to(a, b, dtype)


def _matmul_to_impl(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return _PLANS(plans.meta(a, b, extra=(dtype,)), ops.best_call, a, b, dtype)(a, b)


_matmul_to = torch.library.custom_op("kernels::matmul_to", _matmul_to_impl, mutates_args=())


@_matmul_to.register_fake
def _(a, b, dtype):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=dtype)


_PLANS = plans.PlanCache()
