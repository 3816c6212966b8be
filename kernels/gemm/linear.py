"""``linear(x, weight, bias)``: ``nn.Linear``'s ``x @ weight.T + bias``, the bias added in the GEMM's
epilogue, one autograd node where only autograd watches.

Where the bias is added: to the GEMM's fp32 accumulator, before the one rounding to the output
dtype (v6's ``HAS_BIAS``), as torch's ``addmm`` and the BLAS bias epilogues it calls do. Added to
the GEMM's rounded output (``matmul(x, weight.t()) + bias``), a bf16 result is rounded twice, and
where the bias cancels most of the product the product's rounding error becomes a large share of
the result (``tests/test_gemm_ops.py``). In the epilogue the bias also costs no pass of its own
over the output.

How a call runs (:func:`kernels.eager.path`): an eager call that needs a gradient runs
:class:`_Linear`, one autograd node as torch's ``nn.Linear`` records one (``addmm``; each node is
host time, ``workbench bench overhead``); one without runs the launch plan directly; under
autocast x, weight and bias are first cast to the region's dtype, as torch's autocast does for
``linear`` (a master weight excepted: below); a traced or transformed call runs the custom op
``kernels::linear`` (2-D ``x``; fake, autograd formula, the same autocast rule), so
``torch.compile`` sees one opaque node with the same epilogue. The gradients are x's,
``grad_y @ weight``, the weight's, ``grad_yᵀ @ x``, made in the weight's own (N, K) layout
(:func:`_grads` says why), and the bias's, ``grad_y`` summed to the bias's shape.

Under autocast, a weight the region casts (an fp32 master weight under bf16) enters the autograd
node itself: :class:`_Linear` (eager) or the custom op ``kernels::linear_master_weight`` (traced)
casts it (one cast op, as autocast's, but not recorded by autograd), and the backward makes the
weight's gradient in the weight's dtype with the GEMM's fp32 sum stored as it is
(:func:`.wgrad.matmul_to`), where autograd's backward of a recorded cast would get a bf16 GEMM
result and cast it back: one device op per weight per step fewer, and the gradient is not rounded
to bf16 (Megatron's gradient-accumulation fusion also writes the fp32 gradient from the GEMM,
and adds it into ``main_grad`` there too, which autograd does here). x and the bias are cast as
before; x's gradient comes in x's cast dtype. An eager call without a gradient casts the weight as
before (nothing to gain). ``kernels::linear`` itself keeps one dtype: its autocast rule
(:func:`kernels.autocast.lower_precision`) casts every floating argument, as torch's ops do; the
master-weight op has no autocast rule, and :func:`linear` casts x and the bias before calling it.

A bias of another dtype than ``x``, or of more than one dimension, is added by torch after the GEMM
(``matmul(x, weight.t()) + bias``: the add casts the bias, or broadcasts the result to more
dimensions).
"""
from __future__ import annotations

from typing import Optional

import torch

from .. import autocast, eager, plans, validate
from . import ops, wgrad


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x (..., K) @ weight (N, K).T + bias`` (bias (N,), (1,) or ()) with :func:`kernels.matmul`'s
    checks and errors, the bias added before the result's one rounding."""
    if autocast.active():   # F.linear takes mixed dtypes there: cast before the checks
        (x, bias), dtype = autocast.master_operands(weight, x, bias)
        if dtype is not None:
            plan = _PLANS(plans.meta(x, weight, bias, extra=(dtype,)), _MasterWeight, x, weight, bias, dtype)
            how = eager.path(known=plan.kind)
            if how != eager.PLAIN and not plan.unfused:   # the master weight enters the node, which casts it
                if how == eager.AUTOGRAD:
                    return _apply_linear(_unwrap(x), _unwrap(weight), bias if bias is None else _unwrap(bias), plan)
                y = _master_linear_2d(x if plan.flat is None else x.reshape(plan.flat), weight, bias)[0]
                return y if plan.flat is None else y.reshape(plan.out)
            # no gradient, or a bias torch adds: the weight cast as before, whose checks the plan holds
            weight = weight.to(dtype)
            return _unfused(x, weight, bias) if plan.unfused else plan.call(x, weight, bias)
    plan = _PLANS(plans.meta(x, weight, bias), _Checked, x, weight, bias)
    if plan.unfused:
        return _unfused(x, weight, bias)
    how = eager.path(known=plan.kind)
    if how == eager.AUTOGRAD:   # eager.applier's call, inline: one Python frame less per call
        return _apply_linear(_unwrap(x), _unwrap(weight), bias if bias is None else _unwrap(bias), plan)
    if how == eager.PLAIN:
        return plan.call(x, weight, bias)
    y = _linear_2d(x if plan.flat is None else x.reshape(plan.flat), weight, bias)
    return y if plan.flat is None else y.reshape(plan.out)


def _unfused(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A bias of another dtype than ``x``'s, or of more than one dimension: added by torch."""
    y = ops.matmul(x, weight.t())
    return y + (bias if bias.dtype == y.dtype else bias.to(y.dtype))


_PLANS = plans.PlanCache()


class _Checked(ops._Plan):
    """:func:`kernels.matmul`'s checks of ``x`` and ``weight.t()`` (the transpose's metadata follows
    from the weight's), and the bias's: a shape the (M, N) result broadcasts, on x's device. A
    call passes ``weight`` itself (:meth:`operands`). ``unfused``: the bias is not added in the
    epilogue (:func:`_unfused`, which checks through :func:`kernels.matmul`), from the bias's
    dtype and rank, in the key. ``bias_shape``: what the bias's gradient is summed to.
    ``wgrad_dtype``: the weight gradient's dtype where it is not the operands' (:class:`_MasterWeight`)."""

    wgrad_dtype = None

    def __init__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
        self.unfused = (isinstance(bias, torch.Tensor) and isinstance(x, torch.Tensor)
                        and (bias.dim() > 1 or bias.dtype != x.dtype))
        if self.unfused:
            return
        super().__init__(x, weight.t())
        self.bias_shape = None if bias is None else bias.shape
        if bias is not None:
            validate.tensor("bias", bias, allow_empty=True)
            validate.same_device(x=x, bias=bias)
            n = weight.shape[0]
            if bias.shape not in ((), (1,), (n,)):
                raise ValueError(f"bias must have shape ({n},) (out_features), (1,) or (), "
                                 f"got {tuple(bias.shape)}")
            self.kind = eager.kind(x, weight, bias)

    def operands(self, x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return super().operands(x, weight.t())


class _MasterWeight(_Checked):
    """The checks of a call under autocast whose weight the region casts to ``dtype`` (an fp32 master
    weight), made on a stand-in with the cast's metadata (:func:`kernels.autocast.stand_in`);
    ``kind`` from the weight itself, which the call passes (:class:`_Linear` casts it).
    ``wgrad_dtype``: the weight's."""

    def __init__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype):
        super().__init__(x, autocast.stand_in(weight, dtype), bias)
        self.wgrad_dtype = weight.dtype
        self.kind = eager.kind(x, weight) if bias is None else eager.kind(x, weight, bias)


def _linear_impl(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    plan = _PLANS(plans.meta(x, weight, bias), _Checked, x, weight, bias)
    return (_unfused if plan.unfused else plan.call)(x, weight, bias)


_linear_2d = torch.library.custom_op("kernels::linear", _linear_impl, mutates_args=())


@_linear_2d.register_fake
def _(x, weight, bias):
    return x.new_empty((x.shape[0], weight.shape[0]))


def _grads(x, weight, bias_shape, grad_y, needs, flat=None, wgrad_dtype=None) -> tuple:
    """The gradients of x, weight and bias (each only if needed); ``flat``, x's 2-D shape (a plan's).
    The weight's is ``grad_yᵀ @ x``, made (N, K) row-major as the weight is stored: the
    transpose of ``xᵀ @ grad_y`` would arrive as a strided view, which autograd's gradient
    accumulation copies into the parameter's layout (one more pass over every weight
    gradient of every step). With ``wgrad_dtype`` (a master weight's dtype, fp32) the GEMM
    stores its fp32 sum in that dtype (:func:`.wgrad.matmul_to`)."""
    grad_x = ops.matmul(grad_y, weight) if needs[0] else None   # in x's shape: matmul takes any rank
    grad_w = None
    if needs[1]:
        x2, grad_y2 = (x, grad_y) if flat is None else (x.reshape(flat), grad_y.reshape(flat[0], weight.shape[0]))
        grad_w = (ops.matmul(grad_y2.t(), x2) if wgrad_dtype is None
                  else wgrad.matmul_to(grad_y2.t(), x2, wgrad_dtype))
    grad_bias = grad_y.sum_to_size(bias_shape) if needs[2] else None
    return grad_x, grad_w, grad_bias


def _save(ctx, inputs, output):
    """``kernels::linear``'s and ``kernels::linear_master_weight``'s: x and the weight the GEMM read,
    for the master-weight op (two outputs) its cast, which no gradient reaches, with the master
    weight's dtype for its gradient (``wgrad_dtype``)."""
    x, weight, bias = inputs
    ctx.bias_shape = None if bias is None else bias.shape
    ctx.wgrad_dtype = None
    if isinstance(output, tuple):   # (y, the weight cast to x's dtype)
        ctx.mark_non_differentiable(output[1])
        weight, ctx.wgrad_dtype = output[1], weight.dtype
    ctx.save_for_backward(x, weight)


def _backward(ctx, grad_y, _grad_cast=None):
    x, weight = ctx.saved_tensors
    return _grads(x, weight, ctx.bias_shape, grad_y, ctx.needs_input_grad, wgrad_dtype=ctx.wgrad_dtype)


_linear_2d.register_autograd(_backward, setup_context=_save)
autocast.lower_precision("linear")


def _master_linear_impl(x: torch.Tensor, weight: torch.Tensor,
                        bias: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``kernels::linear``'s result for a weight of another dtype than x's (a master weight), and the
    weight cast to x's dtype (a new tensor: an output may not alias an input), which the backward's
    ``grad_y @ weight`` reads."""
    cast = weight.to(x.dtype, copy=True)
    return _linear_impl(x, cast, bias), cast


_master_linear_2d = torch.library.custom_op("kernels::linear_master_weight", _master_linear_impl, mutates_args=())


@_master_linear_2d.register_fake
def _(x, weight, bias):
    return x.new_empty((x.shape[0], weight.shape[0])), torch.empty_like(weight, dtype=x.dtype)


_master_linear_2d.register_autograd(_backward, setup_context=_save)


class _Linear(torch.autograd.Function):
    """The custom op's formula for an eager call that only autograd watches, on ``x`` of any rank
    (no reshape recorded on the way in or out). A master weight (``plan.wgrad_dtype``) is cast
    here, where autograd records no cast, and gets its gradient in its own dtype."""

    @staticmethod
    def forward(ctx, x, weight, bias, plan):
        if plan.wgrad_dtype is not None:
            weight = weight.to(x.dtype)
        ctx.save_for_backward(x, weight)
        ctx.plan = plan
        return plan.call(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        plan = ctx.plan
        return (*_grads(x, weight, plan.bias_shape, grad_y, ctx.needs_input_grad, plan.flat, plan.wgrad_dtype), None)


_apply_linear = eager.function_apply(_Linear)
_unwrap = eager.unwrap
