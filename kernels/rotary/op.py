"""The public rotary embedding: ``kernels.rope(x, cos, sin)``, differentiable in x and visible
to ``torch.compile``.

It computes what the training model's ``apply_rope`` (:mod:`.reference`) computes,
so it can take its place: eager PyTorch runs nine device ops for it (``x.float()``, four
products, a difference, a sum, a stack, a cast), most with an fp32 temporary over (B, H, S, D),
and twelve for the backward; here each direction is one launch of :mod:`.kernel`, x (or dy)
read once and the result written once, rounded once to x's dtype from fp32
(``tests/test_rope.py`` counts both).

How it is wrapped, as the other public ops are: ``kernels::rope`` and ``kernels::rope_backward``
are custom ops with fakes, joined by ``register_autograd``, so ``torch.compile(fullgraph=True)``
keeps them as two opaque nodes, without a graph break; an eager call that nothing else watches
(:func:`kernels.eager.path`) runs the launch plan itself, through :class:`_Rope` when x needs a
gradient. Checks and launch arguments are decided once per kind of input (:mod:`kernels.plans`).
Autocast does not apply: the result keeps x's dtype, as ``apply_rope``'s does.

cos and sin get no gradient, and a call where either needs one is refused: the tables are
constants of the positions (``rope_tables``), and ``apply_rope`` would give a learned table
its gradient, which this op, by leaving it out, would silently make zero.
"""
from __future__ import annotations

import torch

from .. import eager, plans, validate
from .kernel import DTYPES, launcher


def _forward_impl(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return _PLANS(plans.meta(x, cos, sin), _Checked, x, cos, sin).call(x, cos, sin)   # rope() checked them


_rope = torch.library.custom_op("kernels::rope", _forward_impl, mutates_args=())


@_rope.register_fake
def _(x, cos, sin):
    return torch.empty_like(x)


def _backward_impl(dy: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return _BACKWARD_PLANS(plans.meta(dy, cos, sin), launcher, dy, cos, sin, True)(dy, cos, sin)


_rope_backward = torch.library.custom_op("kernels::rope_backward", _backward_impl, mutates_args=())


@_rope_backward.register_fake
def _(dy, cos, sin):
    return torch.empty_like(dy)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[1:])


def _backward(ctx, dy):
    """dx, laid out as dy (x's layout where dy is the gradient of a result laid out as x), by the
    backward custom op or, where nothing watches, its implementation (:func:`kernels.eager.direct`)."""
    cos, sin = ctx.saved_tensors
    op = _backward_impl if eager.direct(dy, cos, sin) else _rope_backward
    return op(dy, cos, sin), None, None


_rope.register_autograd(_backward, setup_context=_setup)


class _Rope(torch.autograd.Function):
    """The custom op's autograd formula, for an eager call that needs a gradient and that nothing
    else watches (:data:`kernels.eager.AUTOGRAD`): ``forward`` runs the launch plan."""

    @staticmethod
    def forward(ctx, x, cos, sin, plan):
        ctx.save_for_backward(cos, sin)
        return plan.call(x, cos, sin)

    @staticmethod
    def backward(ctx, dy):
        return (*_backward(ctx, dy), None)


_apply_rope = eager.applier(_Rope, tensors=3)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, S, D) with each pair (x[..., 2i], x[..., 2i+1]) rotated by the angle whose cosine
    and sine are ``cos[s, i]`` and ``sin[s, i]`` (the interleaved pairing of RoFormer, as the
    training model's ``apply_rope``); differentiable in x, by the rotation by the negative angle.

    x float32, bfloat16 or float16, D even, any strides (the training step's
    ``linear(x).view(b, s, h, d).transpose(1, 2)`` as it is, with no copy); cos and sin (S, D/2)
    float32, any strides, needing no gradient (see the module's docstring). Computed in fp32 and
    rounded once to x's dtype, also under ``torch.autocast``. The result (and x's gradient) is
    laid out as ``torch.empty_like(x)`` (x's strides where x is dense). B, H, S or D may be 0
    (an empty result). Errors name the argument at fault."""
    plan = _PLANS(plans.meta(x, cos, sin), _Checked, x, cos, sin)
    how = eager.path(known=plan.kind)
    if how == eager.PLAIN:
        return plan.call(x, cos, sin)
    if how == eager.AUTOGRAD:
        return _apply_rope(x, cos, sin, plan)
    return _rope(x, cos, sin)


_PLANS = plans.PlanCache()
_BACKWARD_PLANS = plans.PlanCache()
_MAX_ROWS = 2 ** 31   # the kernel numbers the B·S·H rows in int32


class _Checked(plans.Checked):
    """:func:`rope`'s checks for inputs of one metadata; ``kind`` their :func:`kernels.eager.kind`."""

    def __init__(self, x, cos, sin):
        validate.tensor("x", x, ndim=4, dtypes=DTYPES, allow_empty=True)
        for name, table in (("cos", cos), ("sin", sin)):
            validate.tensor(name, table, ndim=2, dtypes=(torch.float32,), allow_empty=True)
        validate.same_device(x=x, cos=cos, sin=sin)
        b, h, s, d = x.shape
        if d % 2:
            raise ValueError(f"x's last dim D={d} must be even: rope rotates the pairs (x[..., 2i], x[..., 2i+1])")
        for name, table in (("cos", cos), ("sin", sin)):
            if table.shape != (s, d // 2):
                raise ValueError(f"{name} has shape {tuple(table.shape)}; it must be (S, D/2) = {(s, d // 2)} "
                                 f"for x of shape {tuple(x.shape)} (B, H, S, D)")
            if table.requires_grad:
                raise ValueError(f"{name} requires grad, but rope gives cos and sin no gradient: "
                                 f"pass {name}.detach() (the tables are constants of the positions)")
        if b * h * s >= _MAX_ROWS:
            raise ValueError(f"x has B·H·S = {b * h * s} rows; rope takes fewer than 2^31")
        self.kind = eager.kind(x, cos, sin)

    def bind(self, x, cos, sin):
        return launcher(x, cos, sin, False)
