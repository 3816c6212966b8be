"""The public grouped GEMM: ``kernels.grouped_gemm(x, w, offsets)``, differentiable and
visible to ``torch.compile``.

How it is wrapped: two PyTorch custom ops with fake (meta) implementations,
``kernels::grouped_gemm`` (the forward, also the dx of the backward: dx = dy · wᵀ per
group, wᵀ a stride view) and ``kernels::grouped_gemm_dw`` (dw[g] = x_gᵀ · dy_g, a GEMM
whose reduction runs over the group's variable row count, zero for an empty group),
joined by ``register_autograd``. So ``torch.compile(fullgraph=True)`` sees opaque nodes
and no graph break, and the backward runs through our kernels.

Empty operands are legal, as in ``torch._grouped_mm``: T = 0 or N = 0 give an empty
result, K = 0 gives zeros, and the gradients have the operands' shapes; an empty group
is a group like any other (its dw is zero).
"""
from __future__ import annotations

import torch

from ... import validate
from .spec import DTYPES, group_bounds
from .v0_loop import loop


@torch.library.custom_op("kernels::grouped_gemm", mutates_args=())
def _grouped_gemm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    if x.numel() == 0 or w.numel() == 0:
        return x.new_zeros((x.shape[0], w.shape[2]))
    return loop(x, w, offsets)


@_grouped_gemm.register_fake
def _(x, w, offsets):
    return x.new_empty((x.shape[0], w.shape[2]))


@torch.library.custom_op("kernels::grouped_gemm_dw", mutates_args=())
def _grouped_gemm_dw(x: torch.Tensor, dy: torch.Tensor, offsets: torch.Tensor,
                     groups: int) -> torch.Tensor:
    dw = x.new_zeros((groups, x.shape[1], dy.shape[1]))
    for g, (start, end) in enumerate(group_bounds(offsets)):
        if end > start:
            dw[g] = x[start:end].t() @ dy[start:end]
    return dw


@_grouped_gemm_dw.register_fake
def _(x, dy, offsets, groups):
    return x.new_empty((groups, x.shape[1], dy.shape[1]))


def _save(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, dy):
    x, w, offsets = ctx.saved_tensors
    dx = _grouped_gemm(dy, w.transpose(1, 2), offsets) if ctx.needs_input_grad[0] else None
    dw = _grouped_gemm_dw(x, dy, offsets, w.shape[0]) if ctx.needs_input_grad[1] else None
    return dx, dw, None


_grouped_gemm.register_autograd(_backward, setup_context=_save)


def grouped_gemm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, *,
                 check_offsets: bool = True) -> torch.Tensor:
    """``x (T, K)`` with rows grouped by expert, ``w (G, K, N)``, int32 ``offsets (G,)`` of
    cumulative row ends (``torch._grouped_mm``'s ``offs``) -> ``(T, N)``; differentiable
    in x and w.

    fp32, fp16 and bf16 with fp32 accumulation; x and w share one dtype and device; any
    strides. ``check_offsets`` reads the offsets on the host (one sync) to refuse ends
    that decrease or do not finish at T; code that built them itself passes False,
    which also keeps the call free of host syncs under ``torch.compile``.
    """
    validate.grouped_gemm_operands(x, w, offsets, DTYPES, allow_empty=True,
                                   check_values=check_offsets)
    return _grouped_gemm(x, w, offsets)
