"""``Float8MoE``'s permutation and weighted combine with Triton k-sums, no float32 (T·k, dim) copy.

:func:`kernels.moe.permutation.permute` and ``unpermute`` (the v2 rung's, unchanged) sum a
token's k slots with torch: ``unpermute`` gathers y into slot order and sums ``y.float() · w``
over (T, k, dim), its backward writes float32 ``dy · w`` and ``y.float() · dy`` temporaries of
that shape, and ``permute``'s backward gathers the slots' gradients and sums a float32 copy.
Each of those is a pass over (T·k, dim), several in float32. Here:

- :func:`permute_rows` (``kernels::moe_permute``): x's rows for the sorted slots, a gather (the
  grouped GEMMs read contiguous expert rows, so x_sorted is written once in x's dtype); its
  backward is ``kernels::moe_slot_sum``, the fused rung's k-sum (:func:`.layer_ladder.slot_sum.slot_sum`)
  reading each slot's gradient row through ``inverse``, in fp32 registers, rounded once.
- :func:`combine` (``kernels::moe_combine``): ``Σ_j w[t, j] · y[inverse[t·k + j]]``, the same
  kernel weighted and gathering; its backward ``kernels::moe_combine_backward``
  (:func:`.layer_ladder.combine_backward.combine_backward`) writes dy_sorted and the weights'
  gradient in one pass.

All sums run in slot order (j = 0..k-1) or along one row in one program: the same bits on every
run, no atomics. Torch's reductions in ``unpermute`` need not add in those orders (the weights'
gradient's ``.sum(-1)`` over a row does not), so results can differ from its in the last bits. What still passes over (T·k, dim) outside these kernels: the
gather of x's rows and, in the backward, autograd's bf16 add of gate's and up's dX (both GEMMs
read x_sorted) before ``kernels::moe_slot_sum``. Custom ops with fakes, joined by ``register_autograd``, so ``torch.compile``
traces the layer and its backward without a graph break; an eager call that nothing watches
runs the implementations directly (:func:`kernels.eager.direct`). The expert-parallel layers
(:mod:`kernels.moe.ep_layer`, eager only) call the same kernels on rows already in slot order:
the weighted k-sum ungathered, the combine's backward with the identity permutation.
"""
from __future__ import annotations

import torch

from .. import eager, validate
from .permutation import _check_permutation
from .layer_ladder.combine_backward import combine_backward
from .layer_ladder.slot_sum import slot_sum
from .layer_ladder.spec import DTYPES
from .layer_ladder.swiglu_rows import check_unit_columns, unit_columns


def _permute_impl(x: torch.Tensor, permutation: torch.Tensor, inverse: torch.Tensor, top_k: int) -> torch.Tensor:
    """x's rows for the sorted slots; ``inverse`` is an input for the backward to keep."""
    return x.index_select(0, torch.div(permutation, top_k, rounding_mode="floor"))


_permute = torch.library.custom_op("kernels::moe_permute", _permute_impl, mutates_args=())


@_permute.register_fake
def _(x, permutation, inverse, top_k):
    return x.new_empty((permutation.shape[0], x.shape[1]))


def _slot_sum_impl(grad_sorted: torch.Tensor, inverse: torch.Tensor, top_k: int) -> torch.Tensor:
    return slot_sum(grad_sorted, top_k, rows=inverse)


_slot_sum = torch.library.custom_op("kernels::moe_slot_sum", _slot_sum_impl, mutates_args=())


@_slot_sum.register_fake
def _(grad_sorted, inverse, top_k):
    return grad_sorted.new_empty((grad_sorted.shape[0] // top_k, grad_sorted.shape[1]))


def _permute_setup(ctx, inputs, output):
    ctx.top_k = inputs[3]
    ctx.save_for_backward(inputs[2])


def _permute_backward(ctx, grad_sorted):
    (inverse,) = ctx.saved_tensors
    grad_sorted = unit_columns(grad_sorted)
    op = _slot_sum_impl if eager.direct(grad_sorted, inverse) else _slot_sum
    return op(grad_sorted, inverse, ctx.top_k), None, None, None


_permute.register_autograd(_permute_backward, setup_context=_permute_setup)


def _combine_impl(y_sorted: torch.Tensor, weights: torch.Tensor, permutation: torch.Tensor,
                  inverse: torch.Tensor) -> torch.Tensor:
    return slot_sum(y_sorted, weights.shape[1], rows=inverse, w=weights)


_combine = torch.library.custom_op("kernels::moe_combine", _combine_impl, mutates_args=())


@_combine.register_fake
def _(y_sorted, weights, permutation, inverse):
    return y_sorted.new_empty((weights.shape[0], y_sorted.shape[1]))


_combine_backward = torch.library.custom_op("kernels::moe_combine_backward", combine_backward, mutates_args=())


@_combine_backward.register_fake
def _(dy, y_sorted, weights, permutation):
    return y_sorted.new_empty(y_sorted.shape), weights.new_empty(weights.shape, dtype=torch.float32)


def _combine_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:3])


def _combine_backward_autograd(ctx, dy):
    y_sorted, weights, permutation = ctx.saved_tensors
    dy = unit_columns(dy)
    op = combine_backward if eager.direct(dy, y_sorted, weights, permutation) else _combine_backward
    dy_sorted, dw = op(dy, y_sorted, weights, permutation)
    return dy_sorted, dw, None, None


_combine.register_autograd(_combine_backward_autograd, setup_context=_combine_setup)


def _check(name: str, x: torch.Tensor, permutation: torch.Tensor, inverse: torch.Tensor, slots: int,
           check_permutation: bool) -> None:
    """x (R, D) of a dtype of :data:`.layer_ladder.spec.DTYPES` with unit column stride; the int64
    ``permutation`` and ``inverse`` of ``slots`` entries each on x's device (the kernels take
    their values as row and slot numbers). ``check_permutation`` reads on the host (one sync)
    whether ``permutation`` holds each of 0..slots-1 once, as ``unpermute``'s check does: a
    repeated index would leave a slot's weight gradient unwritten."""
    validate.tensor(name, x, ndim=2, dtypes=DTYPES, allow_empty=True)
    for index_name, index in (("permutation", permutation), ("inverse", inverse)):
        validate.tensor(index_name, index, ndim=1, dtypes=(torch.int64,), allow_empty=True)
        validate.same_device(**{name: x, index_name: index})
        if index.shape[0] != slots:
            raise ValueError(f"{index_name} has {index.shape[0]} entries, but there are T·k = {slots} slots")
    check_unit_columns(name, x)
    if check_permutation:
        _check_permutation(permutation)


def permute_rows(x: torch.Tensor, permutation: torch.Tensor, inverse: torch.Tensor, top_k: int, *,
                 check_permutation: bool = True) -> torch.Tensor:
    """x (T, D) -> its rows for the sorted slots (T·k, D): row i is token ``permutation[i] // k``;
    differentiable in x, whose gradient is each token's k rows summed in fp32, rounded once.
    ``permutation`` is :func:`kernels.moe.permutation.sort_slots`'s, ``inverse`` its inverse
    (int64: ``inverse[permutation[i]] = i``); ``check_permutation`` as :func:`_check` says
    (``Float8MoE``, which made them with ``sort_slots``, passes False: no host sync)."""
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive int, got {top_k!r}")
    _check("x", x, permutation, inverse, x.shape[0] * top_k, check_permutation)
    op = _permute_impl if eager.direct(x, permutation, inverse) else _permute
    return op(x, permutation, inverse, top_k)


def combine(y_sorted: torch.Tensor, weights: torch.Tensor, permutation: torch.Tensor,
            inverse: torch.Tensor, *, check_permutation: bool = True) -> torch.Tensor:
    """The experts' rows (T·k, D) in sorted order -> (T, D) in y's dtype: per token
    ``Σ_j weights[t, j] · y[inverse[t·k + j]]`` in fp32, slot order, rounded once;
    differentiable in y_sorted and weights (float32 (T, k), contiguous). ``permutation`` and
    ``inverse`` as :func:`permute_rows` takes them, ``check_permutation`` too."""
    validate.tensor("weights", weights, ndim=2, dtypes=(torch.float32,), allow_empty=True)
    if weights.shape[1] < 1 or not weights.is_contiguous():
        raise ValueError(f"weights must be contiguous (T, k) with k >= 1, got shape {tuple(weights.shape)} "
                         f"and strides {weights.stride()}")
    _check("y_sorted", y_sorted, permutation, inverse, weights.numel(), check_permutation)
    validate.same_device(y_sorted=y_sorted, weights=weights)
    if y_sorted.shape[0] != weights.numel():
        raise ValueError(f"y_sorted has {y_sorted.shape[0]} rows but weights {tuple(weights.shape)} has "
                         f"T·k = {weights.numel()} slots")
    op = _combine_impl if eager.direct(y_sorted, weights, permutation, inverse) else _combine
    return op(y_sorted, weights, permutation, inverse)
