"""``kernels.rms_norm(x, weight, eps)``: the training model's RMSNorm as one forward launch and a
two-launch backward; ``kernels.add_rms_norm(x, residual, weight, eps)``: the residual add before
it in the same launches.

The model's eager formula, ``(x32 * rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) *
w32).to(x.dtype)``, is 8 device ops forward and 16 backward for bf16 x with an fp32 weight, most of
them fp32 passes over the activations, per norm (``tests/test_rms_norm.py`` counts both). Here the
forward reads x once and writes y (and rstd, one fp32 per row, for the backward) once; the backward
reads dy and x once, writes dx once and per-program fp32 partial sums of the weight's gradient,
which a second launch adds in a fixed order (:mod:`.rms_norm_kernels`). Same semantics, so it can
replace the model's: computed in fp32, y rounded once to x's dtype (or ``out_dtype``: the dtype its
consumers read), dx to x's, dweight to the weight's (which may differ: an fp32 master weight beside
bf16 activations); dy comes in y's dtype.

Not cast under ``torch.autocast``: the model's norm computes in fp32 and keeps x's dtype there
too, so the custom op has no autocast rule and the eager path ignores the region. A caller that
wants the region's dtype asks for it (``out_dtype``), as the training model's norm does
(:class:`workbench.train.layers.RMSNorm`).

How a call runs (:func:`kernels.eager.path`), as :func:`kernels.flash_attention` does: an eager
call that nothing watches runs the launch plan; one that needs a gradient, :class:`_RMSNorm`
(:class:`_AddRMSNorm`); a traced or transformed one the custom ops ``kernels::rms_norm`` (returns
y and rstd) or ``kernels::add_rms_norm`` (h, y and rstd) and ``kernels::rms_norm_backward`` (dx
and dweight, and with a residual's dtype db; its optional dh is h's other gradient), with
fakes, joined by ``register_autograd``, so ``torch.compile(fullgraph=True)`` keeps them as nodes
without a graph break. The checks and launch settings of one kind of input are kept
(:mod:`kernels.plans`); the residual add's plan is the norm's, given the residual (a 16-bit x's:
the norm of torch's sum, so its call looks up one plan).

The residual add is fused where x is float32, the training model's residual stream
(:meth:`workbench.train.layers.RMSNorm.add`): a 16-bit x's sum is rounded by torch to the
promoted dtype (x's, unless the residual is wider) before the norm reads it, so
:func:`add_rms_norm` leaves that to torch's add and :func:`rms_norm`, the formula's two steps.

Layouts: the rows of x, dy, the residual and dh are read through their row stride where each
viewed as (rows, N) has unit column stride (a contiguous tensor, a slice of rows or of a wider
buffer's columns); any other layout (a transposed or expanded one) is copied once by
``reshape``/``contiguous``. y, h, dx and db are contiguous, dweight is (N,) contiguous.
"""
from __future__ import annotations

import math

import torch

from .. import eager, plans, validate
from ..outputs import new_output
from . import rms_norm_kernels as k

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _rows(t: torch.Tensor, rows: int, n: int) -> torch.Tensor:
    """``t`` as (rows, n) with unit column stride: a view where one exists, else a copy."""
    flat = t.reshape(rows, n)
    return flat if n <= 1 or flat.stride(1) == 1 else flat.contiguous()


def _out_dtype(out_dtype, normed: torch.dtype) -> torch.dtype:
    """y's dtype: ``out_dtype``, or that of the rows normed (``normed``) where it is None."""
    validate.dtype_choice("out_dtype", out_dtype, DTYPES, optional=True)
    return normed if out_dtype is None else out_dtype


class _Plan:
    """:func:`rms_norm`'s (and :func:`add_rms_norm`'s) checks for inputs of one metadata, y's dtype
    (and ``eps``, for the forward), and what follows from them: rows, N, the three launches'
    settings, the inputs' eager kind. ``residual``: :func:`add_rms_norm`'s, added to x before the
    norm, a float tensor of x's shape on its device; ``fused``: whether the kernel adds it (x fp32,
    so h = x + residual is fp32 whatever the residual's dtype, as torch promotes: the sum of the two
    in fp32, rounded once, which the kernel computes too), else the plan is the one
    :func:`rms_norm` makes for h = x + residual, which :func:`add_rms_norm` adds with torch (h in
    their promoted dtype; its kind theirs and the weight's, as h needs a gradient where one of
    them does). ``residual_dtype``: a backward's, the dtype of the residual its forward added
    (None: none)."""

    def __init__(self, x, weight, eps=None, out_dtype=None, residual=None, residual_dtype=None):
        if residual is not None:
            validate.tensor("residual", residual, dtypes=DTYPES, allow_empty=True)
        validate.tensor("x", x, dtypes=DTYPES, allow_empty=True)
        validate.tensor("weight", weight, dtypes=DTYPES, allow_empty=True)
        if x.dim() < 1:
            raise ValueError("x must have at least 1 dimension (..., N), got a 0-d tensor")
        if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
            raise ValueError(f"weight has shape {tuple(weight.shape)}; it must be ({x.shape[-1]},), "
                             f"x's last dimension (x is {tuple(x.shape)})")
        validate.same_device(x=x, weight=weight)
        self.n = x.shape[-1]
        if self.n > k.MAX_N:
            raise ValueError(f"x's rows have N={self.n} elements; rms_norm holds a row in one program, "
                             f"at most N={k.MAX_N}")
        if eps is not None:
            if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
                raise ValueError(f"eps must be a float >= 0, got {eps!r}")
            self.eps = validate.fp32_argument("eps", float(eps))
        normed = x.dtype
        if residual is not None:
            if residual.shape != x.shape:
                raise ValueError(f"residual has shape {tuple(residual.shape)}; it must have x's {tuple(x.shape)}")
            validate.same_device(x=x, residual=residual)
            residual_dtype = residual.dtype
        self.fused = residual is not None and x.dtype == torch.float32
        if residual is not None and not self.fused:   # 16-bit x: the norm of h, torch's sum
            normed, residual_dtype = torch.promote_types(x.dtype, residual.dtype), None
        self.out_dtype = _out_dtype(out_dtype, normed)
        self.shape = x.shape
        self.rows = math.prod(x.shape[:-1])
        self.residual_dtype = residual_dtype
        self.launch = k.launches(self.rows, self.n, normed, weight.dtype, self.out_dtype, residual_dtype)
        self.kind = eager.kind(x, weight) if residual is None else eager.kind(x, residual, weight)

    def forward(self, x: torch.Tensor, weight: torch.Tensor,
                residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """h, the rows normed (x + residual in fp32, x itself without a residual), y in x's shape
        and :attr:`out_dtype`, and rstd (rows,) fp32; one launch (none when empty)."""
        rows, n = self.rows, self.n
        y = new_output(self.shape, self.out_dtype, x.device)
        rstd = new_output((rows,), torch.float32, x.device)
        h = x if residual is None else new_output(self.shape, x.dtype, x.device)
        if rows * n:
            x2 = _rows(x, rows, n)
            b2 = x2 if residual is None else _rows(residual, rows, n)   # no residual: x, never read
            k._forward_kernel.run(x2, b2, weight, y, h, rstd, rows, n, x2.stride(0), b2.stride(0), weight.stride(0),
                                  self.eps, **self.launch["forward"])
        elif rows:   # N = 0: the mean of no squares is NaN, as in torch
            rstd.fill_(float("nan"))
        return h, y, rstd

    def backward(self, dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
                 dh: torch.Tensor | None = None) -> list[torch.Tensor]:
        """dx in x's shape and dtype and dweight in the weight's, from dy in y's dtype
        (:attr:`out_dtype`) plus ``dh``, x's gradient from elsewhere (h's, after a residual add),
        where one comes; after a residual add of another dtype than x's, db, the same sum in the
        residual's dtype (else dx is the residual's gradient too). Two launches (none when empty)."""
        if dy.shape != x.shape:   # its dtype is y's: the backward's plan is made for it (_backward_plan)
            raise ValueError(f"dy must have x's shape {tuple(x.shape)}, got {tuple(dy.shape)}")
        if dh is not None and (dh.shape != x.shape or dh.dtype != x.dtype or dh.device != x.device):
            raise ValueError(f"dh must have x's shape {tuple(x.shape)}, dtype and device, got {tuple(dh.shape)} "
                             f"{dh.dtype} on {dh.device}")
        rows, n, launch = self.rows, self.n, self.launch
        dx = new_output(self.shape, x.dtype, x.device)
        dw = new_output((n,), weight.dtype, weight.device)
        db = [new_output(self.shape, self.residual_dtype, x.device)] if launch["backward"][0]["STORE_DB"] else []
        if not rows * n:
            return [dx, dw.zero_(), *db]   # no rows: y did not depend on the weight (and N = 0: dx is empty)
        partial = new_output((launch["programs"], n), torch.float32, x.device)
        x2, dy2 = _rows(x, rows, n), _rows(dy, rows, n)
        dh2 = x2 if dh is None else _rows(dh, rows, n)   # none: x, never read
        k._backward_kernel.run(dy2, x2, weight, rstd, dh2, dx, *db or (dx,), partial, rows, n, dy2.stride(0),
                               x2.stride(0), dh2.stride(0), weight.stride(0), **launch["backward"][dh is not None])
        k._dweight_kernel.run(partial, dw, launch["programs"], n, **launch["dweight"])
        return [dx, dw, *db]


_PLANS = plans.PlanCache()
_ADD_PLANS = plans.PlanCache()
_BACKWARD_PLANS = plans.PlanCache()


def _forward_impl(x: torch.Tensor, weight: torch.Tensor, eps: float,
                  out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return _PLANS(plans.meta(x, weight, extra=(eps, type(eps), out_dtype)), _Plan, x, weight, eps, out_dtype
                  ).forward(x, weight)[1:]


_rms_norm = torch.library.custom_op("kernels::rms_norm", _forward_impl, mutates_args=())


def _forward_fake(x, weight, eps, out_dtype=None):
    return (torch.empty_like(x, dtype=out_dtype or x.dtype, memory_format=torch.contiguous_format),
            x.new_empty((math.prod(x.shape[:-1]),), dtype=torch.float32))


_rms_norm.register_fake(_forward_fake)


def _add_forward_impl(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                      out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    plan = _ADD_PLANS(plans.meta(x, residual, weight, extra=(eps, type(eps), out_dtype)), _Plan,
                      x, weight, eps, out_dtype, residual)
    if not plan.fused:
        raise TypeError(f"kernels::add_rms_norm adds into float32 x only, got {x.dtype} "
                        f"(kernels.add_rms_norm adds 16-bit x with torch)")
    return plan.forward(x, weight, residual)


_add_rms_norm = torch.library.custom_op("kernels::add_rms_norm", _add_forward_impl, mutates_args=())


@_add_rms_norm.register_fake
def _(x, residual, weight, eps, out_dtype=None):
    return torch.empty_like(x, memory_format=torch.contiguous_format), *_forward_fake(x, weight, eps, out_dtype)


def _backward_plan(dy, x, weight, residual_dtype=None) -> _Plan:
    """The plan of x and weight whose y has dy's dtype (named dy's where it is wrong), after a
    residual of ``residual_dtype`` (None: none)."""
    validate.tensor("dy", dy, dtypes=DTYPES, allow_empty=True)
    validate.dtype_choice("residual_dtype", residual_dtype, DTYPES, optional=True)
    return _Plan(x, weight, out_dtype=dy.dtype, residual_dtype=residual_dtype)


def _backward_impl(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
                   dh: torch.Tensor | None = None, residual_dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    return _BACKWARD_PLANS(plans.meta(x, weight, extra=(dy.dtype, residual_dtype)), _backward_plan,
                           dy, x, weight, residual_dtype).backward(dy, x, weight, rstd, dh)


_rms_norm_backward = torch.library.custom_op("kernels::rms_norm_backward", _backward_impl, mutates_args=())


@_rms_norm_backward.register_fake
def _(dy, x, weight, rstd, dh=None, residual_dtype=None):
    grads = [torch.empty_like(x, memory_format=torch.contiguous_format),
             torch.empty_like(weight, memory_format=torch.contiguous_format)]
    if k.stores_db(x.dtype, residual_dtype):
        grads.append(torch.empty_like(x, dtype=residual_dtype, memory_format=torch.contiguous_format))
    return grads


def _save(ctx, inputs, output):
    x, weight, *_ = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.plan = ctx.residual_dtype = None   # a traced forward binds no plan: the implementation finds the backward's


def _add_save(ctx, inputs, output):
    x, residual, weight, *_ = inputs
    ctx.save_for_backward(output[0], weight, output[2])
    ctx.plan, ctx.residual_dtype = None, residual.dtype
    ctx.set_materialize_grads(False)   # an h used nowhere else (the final norm's) has no gradient to read


def _gradients(ctx, dy, dh=None) -> list[torch.Tensor]:
    """The backward custom op or, where nothing watches (:func:`kernels.eager.direct`), its launches:
    the forward's plan's, where :class:`_RMSNorm` or :class:`_AddRMSNorm` kept it (``ctx.plan``: no
    lookup by metadata; dy comes in y's dtype, which autograd casts it to), else the
    implementation's. dx, dweight, and db where a residual's dtype is not x's."""
    x, weight, rstd = ctx.saved_tensors
    if not eager.direct(dy, x, weight, rstd, *(() if dh is None else (dh,))):
        return _rms_norm_backward(dy, x, weight, rstd, dh, ctx.residual_dtype)
    if ctx.plan is None:
        return _backward_impl(dy, x, weight, rstd, dh, ctx.residual_dtype)
    return ctx.plan.backward(dy, x, weight, rstd, dh)


def _backward(ctx, dy, _drstd=None):
    dx, dw = _gradients(ctx, dy)
    needs = ctx.needs_input_grad
    return dx if needs[0] else None, dw if needs[1] else None, *(None,) * (len(needs) - 2)


def _add_backward(ctx, dh, dy, _drstd=None):
    """x's and the residual's gradient, h's: dh (where h has another consumer) plus the norm's;
    the weight's. Without dy (y used nowhere) h's gradient passes on as the add's would."""
    if dy is None:
        dx, dw, db = dh, None, dh if dh is None else dh.to(ctx.residual_dtype)
    else:
        dx, dw, *db = _gradients(ctx, dy, dh)
        db = db[0] if db else dx
    needs = ctx.needs_input_grad
    return (dx if needs[0] else None, db if needs[1] else None, dw if needs[2] else None,
            *(None,) * (len(needs) - 3))


_rms_norm.register_autograd(_backward, setup_context=_save)
_add_rms_norm.register_autograd(_add_backward, setup_context=_add_save)


class _RMSNorm(torch.autograd.Function):
    """The custom op's autograd formula, for an eager call that needs a gradient and that nothing
    else watches (:data:`kernels.eager.AUTOGRAD`): ``forward`` runs the launch plan."""

    @staticmethod
    def forward(ctx, x, weight, plan):
        _, y, rstd = plan.forward(x, weight)
        ctx.save_for_backward(x, weight, rstd)
        ctx.plan, ctx.residual_dtype = plan, None
        return y

    @staticmethod
    def backward(ctx, dy):
        return _backward(ctx, dy)


class _AddRMSNorm(torch.autograd.Function):
    """``kernels::add_rms_norm``'s autograd formula, as :class:`_RMSNorm` is ``kernels::rms_norm``'s."""

    @staticmethod
    def forward(ctx, x, residual, weight, plan):
        h, y, rstd = plan.forward(x, weight, residual)
        ctx.save_for_backward(h, weight, rstd)
        ctx.plan, ctx.residual_dtype = plan, residual.dtype
        ctx.set_materialize_grads(False)
        return h, y

    @staticmethod
    def backward(ctx, dh, dy):
        return _add_backward(ctx, dh, dy)


_apply_rms_norm = eager.applier(_RMSNorm, tensors=2)
_apply_add_rms_norm = eager.applier(_AddRMSNorm, tensors=3)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *,
             out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x / sqrt(mean(x², -1) + eps) * weight`` for x (..., N) and weight (N,), computed in fp32,
    rounded once to ``out_dtype`` (x's dtype where None); differentiable in both (dy in y's
    dtype, dx in x's, dweight in the weight's, accumulated in fp32 over all rows, the same bits
    on every run).

    ``out_dtype`` is the dtype y's consumers read: an fp32 residual stream normed for bf16
    matmuls under autocast writes bf16 y in the same launch, where a cast of fp32 y would be a
    device op more forward, and its gradient's cast back one more backward, per consumer.

    x and weight: float32, float16 or bfloat16, each its own (an fp32 weight with bf16 x is the
    training model's); 1 <= N <= :data:`.rms_norm_kernels.MAX_N` (a row lives in one program) or
    N = 0 (empty y, as in torch); any number of rows (0 too) in any leading dimensions; ``eps`` a
    float >= 0, taken as float32 as the kernel computes (:func:`kernels.validate.fp32_argument`);
    ``out_dtype`` float32, float16, bfloat16 or None. Errors name the argument at fault."""
    # the key built here, not by a helper: a Python call more per call (workbench bench overhead)
    plan = _PLANS(plans.meta(x, weight, extra=(eps, type(eps), out_dtype)), _Plan, x, weight, eps, out_dtype)
    how = eager.path(known=plan.kind)
    if how == eager.PLAIN:
        return plan.forward(x, weight)[1]
    if how == eager.AUTOGRAD:
        return _apply_rms_norm(x, weight, plan)
    return _rms_norm(x, weight, plan.eps, out_dtype)[0]   # as given: the key the public call used


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, *,
                 out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(h, rms_norm(h, weight, eps, out_dtype=out_dtype))`` for ``h = x + residual``: a
    pre-norm transformer's residual add and the next norm, which reads h, in one launch, and
    their backward in two (the norm's), where torch's add, and in the backward the sum of h's
    two gradients and the residual's cast, are passes of their own over the rows.

    Fused where x is float32 (a residual stream in fp32, as the training model's under
    autocast): h = x + residual in fp32, torch's promotion and rounding, stored once; the
    residual any float dtype (the bf16 output of a block's branch). Backward: h's gradient, the
    norm's dx plus h's gradient from its other consumer (none where h is used nowhere else: the
    final norm's), in fp32 once: x's, and the residual's rounded once to its dtype.
    16-bit x is not fused: torch's ``x + residual`` rounds h to the promoted dtype before the
    norm reads it, so this calls torch's add and norms h as :func:`rms_norm` would, as the formula does.

    x and residual of one shape (no broadcasting), float32, float16 or bfloat16, on one device;
    the rest as :func:`rms_norm`'s, y's dtype by default h's. Errors name the argument at fault."""
    plan = _ADD_PLANS(plans.meta(x, residual, weight, extra=(eps, type(eps), out_dtype)), _Plan,
                      x, weight, eps, out_dtype, residual)
    how = eager.path(known=plan.kind)
    if not plan.fused:   # the plan norms h as rms_norm's would: no lookup of that one
        h = x + residual
        if how == eager.PLAIN:
            return plan.forward(h, weight)[:2]
        if how == eager.AUTOGRAD:
            return h, _apply_rms_norm(h, weight, plan)
        return h, _rms_norm(h, weight, plan.eps, out_dtype)[0]
    if how == eager.PLAIN:
        return plan.forward(x, weight, residual)[:2]
    if how == eager.AUTOGRAD:
        return _apply_add_rms_norm(x, residual, weight, plan)
    return _add_rms_norm(x, residual, weight, plan.eps, out_dtype)[:2]
