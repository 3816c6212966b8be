"""The public grouped GEMM: ``kernels.grouped_gemm(x, w, offsets)``, differentiable and
visible to ``torch.compile``.

Which kernels run: the forward and the backward's dx on the highest-numbered Triton rung
of ``grouped_gemm`` that runs here (:func:`kernels.gemm.ops.best_rung`, read at call
time), and dw on the dW kernel (:mod:`.dw`) with v4's tuned tiles
(:func:`.v4_persistent.grouped_dw`). Both find each group's rows from the offsets on
the device, so a call with ``check_offsets=False`` has no host sync (a test holds the
chosen rung to that; on a GPU the first call of a tuning key also times candidates).

How it is wrapped: two PyTorch custom ops with fake (meta) implementations,
``kernels::grouped_gemm`` (the forward, also the dx of the backward: dx = dy · wᵀ per
group, wᵀ a stride view) and ``kernels::grouped_gemm_dw`` (dw[g] = x_gᵀ · dy_g, a GEMM
whose reduction runs over the group's variable row count, zero for an empty group),
joined by ``register_autograd``. So ``torch.compile(fullgraph=True)`` sees opaque nodes
and no graph break, and the backward runs through our kernels. An eager call that nothing
traces (:func:`kernels.eager.path`) runs the forward's launch plan itself, through an
``autograd.Function`` with the same formula when it needs a gradient; its backward then
runs dx as such a call and dw without the custom op.

Empty operands are legal, as in ``torch._grouped_mm``: T = 0 or N = 0 give an empty
result, K = 0 gives zeros, and the gradients have the operands' shapes; an empty group
is a group like any other (its dw is zero).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from ... import eager, plans, validate
from ...gemm.ops import best_rung
from . import v4_persistent
from .grads import gradients
from .spec import DTYPES


def _grouped_gemm_impl(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    if x.numel() == 0 or w.numel() == 0:
        return x.new_zeros((x.shape[0], w.shape[2]))
    return best_rung("grouped_gemm", x.dtype)(x, w, offsets, check_offsets=False)


_grouped_gemm = torch.library.custom_op("kernels::grouped_gemm", _grouped_gemm_impl, mutates_args=())


@_grouped_gemm.register_fake
def _(x, w, offsets):
    return x.new_empty((x.shape[0], w.shape[2]))


def _grouped_gemm_dw_impl(x: torch.Tensor, dy: torch.Tensor, offsets: torch.Tensor,
                          groups: int, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """dw in ``dtype``, x's if None; fp32 (an fp32 master weight's gradient, the MoE layer's under
    autocast) is not one of the public op's forms: dw's only caller passing it is the MoE backward."""
    if x.numel() == 0 or dy.numel() == 0:
        return x.new_zeros((groups, x.shape[1], dy.shape[1]), dtype=dtype or x.dtype)
    return v4_persistent.grouped_dw(x, dy, offsets, groups, dtype=dtype)


_grouped_gemm_dw = torch.library.custom_op("kernels::grouped_gemm_dw", _grouped_gemm_dw_impl, mutates_args=())


@_grouped_gemm_dw.register_fake
def _(x, dy, offsets, groups, dtype=None):
    return x.new_empty((groups, x.shape[1], dy.shape[1]), dtype=dtype or x.dtype)


def _save(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _dx(dy, w_t, offsets):
    """dX through :func:`grouped_gemm`: its launch plan eagerly, the custom op when traced."""
    return grouped_gemm(dy, w_t, offsets, check_offsets=False)


def _dw(x, dy, offsets, groups):
    """dW: the custom op, or its implementation where nothing watches (:func:`kernels.eager.direct`)."""
    return (_grouped_gemm_dw_impl if eager.direct(x, dy, offsets) else _grouped_gemm_dw)(x, dy, offsets, groups)


def _backward(ctx, dy):
    return gradients(_dx, _dw, *ctx.saved_tensors, dy, ctx.needs_input_grad)


_grouped_gemm.register_autograd(_backward, setup_context=_save)


class _GroupedGemm(torch.autograd.Function):
    """The custom op's autograd formula, for an eager call that needs a gradient and that nothing
    else watches (:data:`kernels.eager.AUTOGRAD`): ``forward`` runs the launch plan."""

    @staticmethod
    def forward(ctx, x, w, offsets, plan):
        ctx.save_for_backward(x, w, offsets)
        return plan.call(x, w, offsets)

    @staticmethod
    def backward(ctx, dy):
        return (*_backward(ctx, dy), None)


_apply_grouped_gemm = eager.applier(_GroupedGemm, tensors=3)


def grouped_gemm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, *,
                 check_offsets: bool = True) -> torch.Tensor:
    """``x (T, K)`` with rows grouped by expert, ``w (G, K, N)``, int32 ``offsets (G,)`` of
    cumulative row ends (``torch._grouped_mm``'s ``offs``) -> ``(T, N)``; differentiable
    in x and w.

    fp32, fp16 and bf16 with fp32 accumulation; x and w share one dtype and device; any
    strides, the offsets' too. ``check_offsets`` reads the offsets on the host (one sync)
    to refuse ends that decrease or do not finish at T; code that built them itself
    passes False, which also keeps the call free of host syncs under ``torch.compile``.

    Unchecked offsets never move a kernel outside x, w or the result: the kernels clamp
    each end to [0, T] and give group g the rows from the previous clamped end to its
    own, none if that decreases (:mod:`.schedule`). Offsets that never decrease once
    clamped give exactly the grouped GEMM of the clamped ends, rows past the last end
    left unwritten (in the result and in dx); offsets that decrease make groups
    overlap, and the rows they share are not defined.
    """
    plan = _PLANS(plans.meta(x, w, offsets), _Checked, x, w, offsets)
    if not plan.packed:   # as validate.index packs them: a copy only for a strided view
        offsets = offsets.contiguous()
    if check_offsets:   # the values: read on every call that asks
        validate.group_ends(offsets, x.shape[0])
    how = eager.path(known=plan.kind)
    if how == eager.PLAIN:
        return plan.call(x, w, offsets)
    if how == eager.AUTOGRAD:
        return _apply_grouped_gemm(x, w, offsets, plan)
    return _grouped_gemm(x, w, offsets)


_PLANS = plans.PlanCache()


class _Checked(plans.Checked):
    """:func:`grouped_gemm`'s checks of the operands' metadata (the offsets' values are read
    per call, where the caller asks), their :func:`kernels.eager.kind`, and whether the offsets are
    contiguous (``packed``; their strides are in the key): a call then skips ``offsets.contiguous()``,
    a C call that would return them as they are."""

    def __init__(self, x, w, offsets):
        validate.grouped_gemm_operands(x, w, offsets, DTYPES, allow_empty=True, check_values=False)
        self.kind = eager.kind(x, w, offsets)
        self.packed = offsets.is_contiguous()

    def bind(self, x, w, offsets):
        if x.numel() == 0 or w.numel() == 0:
            return _grouped_gemm_impl
        rung = best_rung("grouped_gemm", x.dtype)
        return rung.plan(x, w, offsets) if rung.plan else functools.partial(rung, check_offsets=False)
