"""Permute token-slots into expert order and back, deterministically, with autograd.

After routing, token t goes to experts ``ids[t, 0..k-1]``: T·k token-slots, slot
``s = t·k + j``. :func:`permute` sorts the slots by expert so that each expert's rows
are contiguous (what :func:`kernels.grouped_gemm` takes) and :func:`unpermute` brings
the experts' outputs back, weighted and summed per token.

Why no scatter-add: the textbook way back is ``out.index_add_(0, token, w · y)``, and
on a GPU that is a float atomic add whose rounding depends on which slot lands first,
so two runs differ in the last bits. Here every data movement is a gather by a
permutation (a bijection, so no two writes meet), and every sum (the k slots of one
token, forward in unpermute and backward in permute) is a reduction over a fixed
``(T, k, ·)`` axis in float32: the same bits on every run.
"""
from __future__ import annotations

import torch

from .. import validate

_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _inverse(permutation: torch.Tensor) -> torch.Tensor:
    """``inverse[permutation[i]] = i``: an ``index_put`` without accumulation of unique
    indices, so deterministic (and allowed by ``torch.use_deterministic_algorithms``).
    Zeros, not empty: an unchecked index tensor that repeats an index leaves entries
    unset, and those must still point at a row (row 0), not at whatever memory held."""
    inverse = torch.zeros_like(permutation)
    inverse[permutation] = torch.arange(permutation.shape[0], device=permutation.device)
    return inverse


def _accumulator(*dtypes: torch.dtype) -> torch.dtype:
    """float32, or float64 when an operand is float64."""
    acc = torch.float32
    for d in dtypes:
        acc = torch.promote_types(acc, d)
    return acc


class _Permute(torch.autograd.Function):
    """x (T, K) -> its rows for the sorted slots (T·k, K); backward sums each token's k
    slot gradients in float32."""

    @staticmethod
    def forward(ctx, x, permutation, top_k):
        ctx.save_for_backward(permutation)
        ctx.shape = (x.shape[0], top_k, x.shape[1])
        return x.index_select(0, torch.div(permutation, top_k, rounding_mode="floor"))

    @staticmethod
    def backward(ctx, grad_sorted):
        (permutation,) = ctx.saved_tensors
        per_slot = grad_sorted.index_select(0, _inverse(permutation))
        per_slot = per_slot.view(ctx.shape)
        grad_x = per_slot.to(_accumulator(grad_sorted.dtype)).sum(dim=1).to(grad_sorted.dtype)
        return grad_x, None, None


class _Unpermute(torch.autograd.Function):
    """y_sorted (T·k, N), weights (T, k) -> Σ_j weights[t, j] · y[slot t·k+j] (T, N)."""

    @staticmethod
    def forward(ctx, y_sorted, weights, permutation):
        inverse = _inverse(permutation)
        acc = _accumulator(y_sorted.dtype, weights.dtype)
        per_slot = y_sorted.index_select(0, inverse).view(*weights.shape, y_sorted.shape[1])
        ctx.save_for_backward(per_slot, weights, permutation)
        summed = (per_slot.to(acc) * weights.to(acc).unsqueeze(-1)).sum(dim=1)
        # No .to that returns its input: under torch.compile, torch 2.11 gives a zero gradient to the
        # inputs of an autograd.Function whose forward returns such a .to (float32 y_sorted here)
        return summed if summed.dtype == y_sorted.dtype else summed.to(y_sorted.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        per_slot, weights, permutation = ctx.saved_tensors
        acc = _accumulator(per_slot.dtype, weights.dtype)
        grad = grad_out.to(acc).unsqueeze(1)                  # (T, 1, N)
        grad_y = grad_w = None
        if ctx.needs_input_grad[0]:
            slots = (grad * weights.to(acc).unsqueeze(-1)).to(per_slot.dtype)
            grad_y = slots.flatten(0, 1).index_select(0, permutation)
        if ctx.needs_input_grad[1]:
            grad_w = (per_slot.to(acc) * grad).sum(dim=-1).to(weights.dtype)
        return grad_y, grad_w, None


def _check_ids(ids: torch.Tensor, num_experts: int) -> None:
    """Refuse ids outside [0, num_experts): reads two numbers on the host (one sync)."""
    if ids.numel() == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= num_experts:
        raise ValueError(f"ids must lie in [0, num_experts={num_experts}), got values from "
                         f"{low} to {high}")


def _check_permutation(permutation: torch.Tensor) -> None:
    """Refuse anything but each of 0..n-1 exactly once: one host read of the comparison
    (the offending value is looked up only on the way to the error)."""
    n = permutation.shape[0]
    ordered = torch.sort(permutation).values
    if torch.equal(ordered, torch.arange(n, dtype=ordered.dtype, device=ordered.device)):
        return
    values = ordered.tolist()
    outside = [v for v in values if not 0 <= v < n]
    if outside:
        raise ValueError(f"permutation must hold each of 0..{n - 1} once; {outside[0]} is "
                         f"outside that range")
    repeated = next(a for a, b in zip(values, values[1:]) if a == b)
    raise ValueError(f"permutation must hold each of 0..{n - 1} once; {repeated} appears "
                     f"more than once, so another slot's row would never be read")


def permute(x: torch.Tensor, ids: torch.Tensor, num_experts: int, *, check_ids: bool = True
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x ``(T, K)`` and expert ids ``(T, k)`` -> (x_sorted ``(T·k, K)``, offsets int32
    ``(num_experts,)``, permutation int64 ``(T·k,)``).

    Row i of x_sorted is token ``permutation[i] // k``, and ``permutation[i]`` is the slot
    ``t·k + j`` it came from. Rows are sorted by expert, stable: within an expert by
    token, then by slot. ``offsets[e]`` is the end row of expert e (``torch._grouped_mm``'s
    ``offs``, ready for :func:`kernels.grouped_gemm`); an expert with no tokens repeats
    the previous end. Differentiable in x: the gradient of a token is the sum of its k
    rows' gradients. ``check_ids`` reads the ids' range on the host (one sync); code
    that made the ids with :func:`kernels.moe.route` passes False, which also keeps the
    call free of host syncs under ``torch.compile``.
    """
    validate.tensor("x", x, ndim=2, dtypes=_FLOATS, allow_empty=True)
    validate.tensor("ids", ids, ndim=2, dtypes=(torch.int32, torch.int64), allow_empty=True)
    validate.same_device(x=x, ids=ids)
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts must be a positive int, got {num_experts!r}")
    if ids.shape[0] != x.shape[0]:
        raise ValueError(f"ids has {ids.shape[0]} tokens (rows) but x has {x.shape[0]}")
    if ids.shape[1] < 1:
        raise ValueError(f"ids must choose at least one expert per token, got shape "
                         f"{tuple(ids.shape)}")
    if check_ids:
        _check_ids(ids, num_experts)
    offsets, permutation = sort_slots(ids, num_experts)
    return _Permute.apply(x, permutation, ids.shape[1]), offsets, permutation


def sort_slots(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`permute`'s (offsets, permutation) of expert ids ``(T, k)`` in [0, num_experts),
    unchecked: also ``Float8MoE``'s (:mod:`kernels.moe.combine_op` moves its rows)."""
    sorted_ids, permutation = torch.sort(ids.reshape(-1), stable=True)
    experts = torch.arange(num_experts, device=ids.device, dtype=sorted_ids.dtype)
    return torch.searchsorted(sorted_ids, experts, right=True).to(torch.int32), permutation


def unpermute(y_sorted: torch.Tensor, permutation: torch.Tensor, weights: torch.Tensor, *,
              check_permutation: bool = True) -> torch.Tensor:
    """The experts' outputs ``(T·k, N)`` in :func:`permute`'s order, its ``permutation`` and
    the routing weights ``(T, k)`` -> ``(T, N)``: per token, ``Σ_j weights[t, j] · y`` of its
    k slots, summed in float32 (float64 for float64 operands) in slot order, cast to
    y_sorted's dtype. Differentiable in y_sorted and weights.

    ``check_permutation`` reads on the host (one sync) whether ``permutation`` holds each
    of 0..T·k-1 once, and refuses a repeated or out-of-range index by its value. Code
    that passes :func:`permute`'s own permutation passes False, which also keeps the call
    free of host syncs under ``torch.compile``; a repeated index then gives rows of
    y_sorted in the wrong slots (a slot no index names reads row 0), never memory outside
    y_sorted.
    """
    validate.tensor("y_sorted", y_sorted, ndim=2, dtypes=_FLOATS, allow_empty=True)
    validate.tensor("permutation", permutation, ndim=1, dtypes=(torch.int64,), allow_empty=True)
    validate.tensor("weights", weights, ndim=2, dtypes=_FLOATS, allow_empty=True)
    validate.same_device(y_sorted=y_sorted, permutation=permutation, weights=weights)
    slots = weights.shape[0] * weights.shape[1]
    if not y_sorted.shape[0] == permutation.shape[0] == slots:
        raise ValueError(f"y_sorted has {y_sorted.shape[0]} rows and permutation "
                         f"{permutation.shape[0]} entries, but weights {tuple(weights.shape)} "
                         f"has T·k = {slots} slots; all three must agree")
    if check_permutation:
        _check_permutation(permutation)
    return _Unpermute.apply(y_sorted, weights, permutation)
