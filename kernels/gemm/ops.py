"""The public GEMM: ``kernels.matmul(a, b)``, differentiable and visible to ``torch.compile``.

Which kernel runs: the highest-numbered Triton rung of op ``gemm`` that runs on this
backend and takes the dtype (:func:`best_rung`), read from the registry at call time,
so a new rung is picked up without editing this file: a ladder ends with its most
optimized rung. Should one backend ever want a lower rung, the registry is the place
to say so (a per-backend "best" flag), not this module.

How it is wrapped: a PyTorch custom op ``kernels::matmul`` (2-D only) with a fake
(meta) implementation and an autograd formula, so ``torch.compile(fullgraph=True)``
treats it as one opaque node instead of breaking the graph at the Triton launch, and
so the backward GEMMs run through the same kernels: ``grad_a = grad_c @ b.T`` and
``grad_b = a.T @ grad_c``, where the transposes are stride views that every rung
takes as they are. :func:`matmul` flattens leading batch dims of ``a`` around it, and
calls the op's implementation itself when nothing traces (:func:`kernels.eager.path`): directly
when no gradient is needed, else through an ``autograd.Function`` with the same formula.

Empty operands are legal, as in ``torch.matmul``: M = 0 or N = 0 (or an empty batch)
gives an empty result, K = 0 gives zeros, and the gradients have the operands'
shapes. A training step meets them (an expert that receives no tokens, a last
micro-batch); no rung is launched for them, since there is nothing to compute.
"""
from __future__ import annotations

import functools
import math

import torch

from .. import autocast
from .. import backend as _backend
from .. import eager, plans, validate
from ..registry import Rung, declared, variants
from .spec import DTYPES


# (op, dtype, backend) -> (the ladder list and its length when read, the best rung)
_BEST: dict[tuple, tuple[list, int, Rung]] = {}


def best_rung(op: str, dtype: torch.dtype) -> Rung:
    """The highest-numbered Triton rung of ``op`` that runs here and supports ``dtype``.

    Read from the registry once per (op, dtype, backend), not per call: a public op's
    host time matters (``workbench bench overhead``). The answer is kept with the ladder
    it came from and read again when that ladder is replaced or grows."""
    here = _backend.current()
    ladder = declared(op)
    hit = _BEST.get((op, dtype, here))
    if hit is not None and hit[0] is ladder and hit[1] == len(ladder):
        return hit[2]
    usable = [r for r in variants(op, include_ref=False)
              if r.kind == "triton" and r.runs_here() and r.supports(dtype)]
    if not usable:
        raise TypeError(f"no Triton rung of {op!r} takes {dtype} on the "
                        f"{here.name} backend")
    ladder = declared(op)
    _BEST[op, dtype, here] = (ladder, len(ladder), usable[-1])
    return usable[-1]


def _matmul_impl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _PLANS(plans.meta(a, b), _Plan, a, b).call(a, b)


def _zeros(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
           dtype: torch.dtype | None = None) -> torch.Tensor:
    """M, N or K is 0: what torch.matmul returns (torch.addmm's, ``bias`` in every row, with one),
    in ``dtype`` (a's where None)."""
    return _unfused(a.new_zeros((a.shape[0], b.shape[1]), dtype=dtype), bias)


def best_call(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype | None = None):
    """The call ``(a, b, bias=None)`` computing ``a @ b`` (``+ bias``) for 2-D operands of this
    metadata, C in ``dtype`` (the operands' where None): zeros for empty operands (K = 0: the sum
    of nothing); else the best rung's plan, writing ``dtype``
    (:meth:`~.v6_persistent.LaunchPlan.writing`); a rung without a plan is called as it is, a bias
    added to its rounded result, then cast. What :meth:`_Plan.bind` binds and the weight gradient
    of a master weight runs (:mod:`.wgrad`)."""
    if a.numel() == 0 or b.numel() == 0:
        return functools.partial(_zeros, dtype=dtype)
    rung = best_rung("gemm", a.dtype)
    if rung.plan is None:
        return lambda a, b, bias=None: _unfused(rung(a, b), bias).to(dtype)   # dtype None: no cast
    return rung.plan(a, b) if dtype is None else rung.plan(a, b).writing(dtype)


_matmul_2d = torch.library.custom_op("kernels::matmul", _matmul_impl, mutates_args=())


@_matmul_2d.register_fake
def _(a, b):
    return a.new_empty((a.shape[0], b.shape[1]))


def _save_operands(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _column_major(t: torch.Tensor) -> bool:
    """A 2-D tensor laid out column by column (a row-major tensor's ``.t()``, ``x @ w.t()``'s w)."""
    return t.stride(0) == 1 and t.stride(1) == t.shape[0]   # torch's mm backward's test


def _grads(a: torch.Tensor, b: torch.Tensor, grad_c: torch.Tensor, needs, flat: tuple | None = None) -> tuple:
    """``grad_a = grad_c @ b.T``, ``grad_b = a.T @ grad_c``, each only if needed; through
    :func:`matmul`, so an eager backward reuses launch plans and a traced one the custom op.
    ``a`` is 2-D, or of another rank with ``flat`` its 2-D shape (a plan's ``flat``). An operand
    laid out column by column gets its gradient so too, computed transposed (``(b @ grad_cᵀ)ᵀ``,
    ``(grad_cᵀ @ a)ᵀ``), as torch's ``mm`` backward does: ``matmul(x, w.t())``'s w receives a
    gradient in its own row-major layout, which autograd's gradient accumulation takes as it is
    instead of copying it into the parameter's layout."""
    if flat is not None:
        grad_a, grad_b = _grads(a.reshape(flat), b, grad_c.reshape(flat[0], b.shape[1]), needs)
        return (None if grad_a is None else grad_a.reshape(a.shape)), grad_b
    grad_a = grad_b = None
    if needs[0]:
        grad_a = matmul(b, grad_c.t()).t() if _column_major(a) else matmul(grad_c, b.t())
    if needs[1]:
        grad_b = matmul(grad_c.t(), a).t() if _column_major(b) else matmul(a.t(), grad_c)
    return grad_a, grad_b


def _backward(ctx, grad_c):
    return _grads(*ctx.saved_tensors, grad_c, ctx.needs_input_grad)


_matmul_2d.register_autograd(_backward, setup_context=_save_operands)
autocast.lower_precision("matmul")


class _Matmul(torch.autograd.Function):
    """The custom op's autograd formula, for an eager call that needs a gradient and that nothing
    else watches (:data:`kernels.eager.AUTOGRAD`): ``forward`` runs the launch plan on ``a`` of
    any rank, so no reshape is recorded on the way in or out."""

    @staticmethod
    def forward(ctx, a, b, plan):
        ctx.save_for_backward(a, b)
        ctx.flat = plan.flat
        return plan.call(a, b)

    @staticmethod
    def backward(ctx, grad_c):
        a, b = ctx.saved_tensors
        return (*_grads(a, b, grad_c, ctx.needs_input_grad, ctx.flat), None)


_apply_matmul = eager.applier(_Matmul, tensors=2)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a (..., K) @ b (K, N) -> (..., N)`` with the best GEMM kernel here; differentiable.

    fp32 (IEEE, no TF32), fp16 and bf16, with fp32 accumulation; ``a`` and ``b`` share
    one dtype and device. Under ``torch.autocast`` both are cast to its dtype, as for
    ``torch.matmul``. Any strides. Empty operands give torch's result (empty, or zeros
    for K = 0). Errors name the argument at fault.
    """
    if autocast.active():   # torch.matmul takes mixed dtypes there: cast before the checks
        a, b = autocast.operands(a, b)
    plan = _PLANS(plans.meta(a, b), _Plan, a, b)
    how = eager.path(known=plan.kind)
    if how == eager.PLAIN:
        return plan.call(a, b)
    if how == eager.AUTOGRAD:
        return _apply_matmul(a, b, plan)
    a2 = a if plan.flat is None else a.reshape(plan.flat)
    c = _matmul_2d(a2, b)
    return c if plan.flat is None else c.reshape(plan.out)


_PLANS = plans.PlanCache()


class _Plan(plans.Checked):
    """:func:`matmul`'s checks for operands of one metadata: ``flat``, the 2-D shape of ``a``
    (None if it is 2-D), ``out``, the result's shape, and ``kind``, their :func:`kernels.eager.kind`."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor):
        validate.tensor("a", a, allow_empty=True)
        validate.tensor("b", b, ndim=2, allow_empty=True)
        if a.dim() == 0:
            raise ValueError("a must have at least 1 dimension (..., K), got a 0-d tensor")
        if a.shape[-1] != b.shape[0]:
            raise ValueError(f"inner dimensions differ: a is {tuple(a.shape)} (..., K), "
                             f"b is {tuple(b.shape)} (K, N)")
        flat = (math.prod(a.shape[:-1]), a.shape[-1])   # not -1: ambiguous when K = 0
        a2 = a.reshape(flat)
        # what validate.matmul_operands adds to the checks above, in its order
        validate.same_device(a=a2, b=b)
        validate.same_dtype(a=a2, b=b)
        validate.tensor("a", a2, dtypes=DTYPES, allow_empty=True)
        self.flat = None if a.dim() == 2 else flat
        self.out = (*a.shape[:-1], b.shape[1])
        self.kind = eager.kind(a, b)

    def operands(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The GEMM's 2-D operands from a call's arguments: ``a`` flattened, ``b`` as it is."""
        return (a if self.flat is None else a.reshape(self.flat)), b

    def bind(self, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None):
        """``a @ b`` (``+ bias``, in the GEMM's fp32 epilogue: one rounding, as torch.addmm) for a call's
        arguments (``a`` of any rank), in the result's shape: for ``a`` of another rank than 2 C is
        made in that shape, not as a view of a 2-D C, which as an autograd Function's output could
        not be modified in place (``y.relu_()``).

        :func:`best_call`: the best rung's plan, or torch's result for empty operands. A plan with ``shaped`` and
        ``biased`` (v6's) allocates C so and keeps the bias's launch arguments; it takes the call's
        own tensors when they start where the 2-D operands start (``weight`` for ``weight.t()``;
        ``a`` when its flattening is a view, which follows from its sizes and strides, in the key),
        so a call makes no view. Any other result is reshaped in place (``resize_``, C is
        contiguous)."""
        a2, b2 = self.operands(a, b)
        operands, out = self.operands, self.out
        run = best_call(a2, b2)
        if hasattr(run, "shaped"):
            run = run.shaped(out) if bias is None else run.shaped(out).biased(bias)
            if a2.data_ptr() == a.data_ptr() and b2.data_ptr() == b.data_ptr():   # views (a copy: new memory)
                return run
            return lambda a, b, bias=None: run(*operands(a, b), bias)
        if self.flat is None:
            return lambda a, b, bias=None: run(*operands(a, b), bias)
        return lambda a, b, bias=None: run(*operands(a, b), bias).contiguous().resize_(out)


def _unfused(c: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return c if bias is None else c.add_(bias)
