"""The public fused cross-entropy: ``kernels.cross_entropy(logits, targets)``, differentiable and
visible to ``torch.compile``.

It computes what the training model's ``F.cross_entropy(logits.float(), targets)`` does, from
the logits in their own dtype: read once forward, once backward, the gradient written once
(:mod:`.cross_entropy_kernels`: the kernels, and the traffic they save).

How it is wrapped, as the other public ops (:mod:`kernels.gemm.ops`): ``kernels::cross_entropy``
(forward: the mean loss and the fp32 state the backward reads, each row's loss, max and log of
its sum of exponentials and the rows counted, :mod:`.cross_entropy_kernels`) and
``kernels::cross_entropy_backward`` are custom ops with fakes, joined by ``register_autograd``,
so ``torch.compile(fullgraph=True)`` keeps one node each; an eager call that nothing watches
runs the implementation (:func:`kernels.eager.path`), through :class:`_CrossEntropy` where a
gradient is needed. A launch plan per metadata (:mod:`kernels.plans`) keeps the checks' verdict
and every launch argument after the tensors (:class:`.cross_entropy_kernels.Launches`), which
the custom ops' implementations find by shape, strides and ``ignore_index``. Autocast does not
cast the logits: no autocast rule is registered, and the op computes in fp32 from whatever dtype
it gets, as torch runs ``cross_entropy`` in fp32.
"""
from __future__ import annotations

import torch

from .. import eager, plans, validate
from . import cross_entropy_kernels
from .cross_entropy_kernels import DTYPES, Launches


def _launches(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> Launches:
    """The launches on these inputs (a plan's, where the custom ops' implementations hold none),
    kept per metadata and backend (:func:`kernels.plans.meta`): the interpreter's bf16 store
    differs from a GPU's, so a process that switches backends gets each one's own."""
    return _LAUNCHES(plans.meta(logits, targets, extra=(ignore_index,)), Launches, *logits.shape, logits.dtype,
                     logits.stride(0), targets.stride(0), ignore_index)


_LAUNCHES = plans.PlanCache()


def _forward_impl(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _launches(logits, targets, ignore_index).forward(logits, targets)


_forward = torch.library.custom_op("kernels::cross_entropy", _forward_impl, mutates_args=())


@_forward.register_fake
def _(logits, targets, ignore_index):
    return logits.new_empty((), dtype=torch.float32), logits.new_empty((3 * logits.shape[0] + 1,), dtype=torch.float32)


def _backward_impl(dloss: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor, state: torch.Tensor,
                   ignore_index: int) -> torch.Tensor:
    return _launches(logits, targets, ignore_index).backward(dloss, logits, targets, state)


_backward_op = torch.library.custom_op("kernels::cross_entropy_backward", _backward_impl, mutates_args=())


@_backward_op.register_fake
def _(dloss, logits, targets, state, ignore_index):
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


def _gradient(dloss, logits, targets, state, ignore_index, launches: Launches | None = None) -> torch.Tensor:
    """The backward custom op or, where nothing watches (:func:`kernels.eager.direct`), its launches:
    ``launches``, the forward's plan's, where :class:`_CrossEntropy` kept them (no lookup by shape
    and strides), else the implementation's."""
    if not eager.direct(dloss, logits, targets, state):
        return _backward_op(dloss, logits, targets, state, ignore_index)
    if launches is None:
        return _backward_impl(dloss, logits, targets, state, ignore_index)
    return launches.backward(dloss, logits, targets, state)


def _setup(ctx, inputs, output):
    logits, targets, ctx.ignore_index = inputs
    ctx.save_for_backward(logits, targets, output[1])


def _backward(ctx, dloss, _dstate=None):
    return _gradient(dloss, *ctx.saved_tensors, ctx.ignore_index), None, None


_forward.register_autograd(_backward, setup_context=_setup)


class _CrossEntropy(torch.autograd.Function):
    """The custom op's autograd formula for an eager call that needs a gradient and that nothing
    else watches (:data:`kernels.eager.AUTOGRAD`), running the plan's launches."""

    @staticmethod
    def forward(ctx, rows, targets, plan):
        loss, state = plan.call(rows, targets)
        ctx.save_for_backward(rows, targets, state)
        ctx.ignore_index, ctx.launches = plan.ignore_index, plan.launches
        return loss

    @staticmethod
    def backward(ctx, dloss):
        return _gradient(dloss, *ctx.saved_tensors, ctx.ignore_index, ctx.launches), None, None


_apply = eager.applier(_CrossEntropy, tensors=2)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100, *,
                  check_targets: bool = False) -> torch.Tensor:
    """``F.cross_entropy(logits.float(), targets, ignore_index=ignore_index)``: the mean over the
    rows whose target is not ``ignore_index`` of ``logsumexp(logits[r]) - logits[r, targets[r]]``,
    in fp32, as a 0-d float32 tensor; differentiable in ``logits``, whose gradient comes in
    their dtype, rounded once from fp32 (0 in ignored rows).

    ``logits`` (R, V): float32, bfloat16 or float16, any row stride; a view whose columns are
    not adjacent is copied first (one device op more; the kernels read rows). ``targets`` (R,):
    int64, any stride. R = 0, or every row ignored, gives nan, as torch. Deterministic: no
    atomics, the mean summed in a fixed order.

    A target outside [0, V) other than ``ignore_index`` makes the loss (and its row's gradient)
    NaN: refusing it needs its value on the host, a sync per step on a GPU (torch's CUDA kernel
    asserts on the device instead). ``check_targets=True`` reads the targets and raises torch's
    ``IndexError`` (:func:`.cross_entropy_kernels.check_targets`)."""
    plan = _PLANS(plans.meta(logits, targets, extra=(ignore_index, type(ignore_index))),
                  _Plan, logits, targets, ignore_index)
    if check_targets:   # the values: read on every call that asks
        cross_entropy_kernels.check_targets(targets, logits.shape[1], ignore_index)
    rows = logits.contiguous() if plan.copy else logits   # what the kernels read: rows of adjacent columns
    how = eager.path(known=plan.kind)
    if how == eager.PLAIN:
        return plan.call(rows, targets)[0]
    if how == eager.AUTOGRAD:
        return _apply(rows, targets, plan)
    return _forward(rows, targets, ignore_index)[0]


_PLANS = plans.PlanCache()


class _Plan(plans.Checked):
    """:func:`cross_entropy`'s checks for inputs of one metadata and ``ignore_index``: ``kind``,
    their :func:`kernels.eager.kind`; ``copy``, whether the logits' columns are not adjacent (every
    path then copies them, before its launches or custom op). The launches' arguments are worked out
    on the first eager call (:meth:`bind`), not by a traced one."""

    def __init__(self, logits, targets, ignore_index):
        if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
            raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")
        validate.tensor("logits", logits, ndim=2, allow_empty=True)
        validate.tensor("targets", targets, ndim=1, allow_empty=True)
        validate.same_device(logits=logits, targets=targets)
        validate.tensor("logits", logits, dtypes=DTYPES, allow_empty=True)
        if targets.dtype != torch.int64:
            raise TypeError(f"targets must be int64 class indices, got {str(targets.dtype).replace('torch.', '')}")
        if targets.shape[0] != logits.shape[0]:
            raise ValueError(f"targets has {targets.shape[0]} rows, logits {logits.shape[0]}: "
                             f"logits (R, V) take targets (R,)")
        self.copy = logits.shape[1] > 1 and logits.stride(1) != 1
        self.ignore_index = ignore_index
        self.kind = eager.kind(logits, targets)

    def bind(self, rows, targets):
        """The forward's launches on the logits as the kernels read them, (loss, state), called as
        they are: no frame of the plan's own between the op and :meth:`.Launches.forward`. Kept as
        ``launches`` too, for :class:`_CrossEntropy`'s backward."""
        self.launches = _launches(rows, targets, self.ignore_index)
        return self.launches.forward
