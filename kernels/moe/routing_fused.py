"""``route_fused``: what an MoE layer asks of its router per call, :func:`.routing.route`,
:func:`.routing.expert_counts` and :func:`.routing.aux_loss`, in two Triton launches forward and
one backward (:mod:`.routing_fused_kernels`), without a host sync.

The three torch functions are 18 device ops forward and 15 backward per layer call (counted in
``tests/test_moe_routing_fused.py``); they stay as
they are, the reference and the tests' oracle, and for what this op refuses: more than
:data:`~.routing_fused_kernels.MAX_EXPERTS` experts (a row lives in one program's registers) or
top_k above :data:`~.routing_fused_kernels.MAX_TOP_K` (one pass over the row per chosen expert).
The layers (:class:`kernels.MoE`, the expert-parallel layer) take this op where it fits and
those three otherwise (:func:`routed`).

How it is wrapped, as :mod:`kernels.loss.ops`: ``kernels::moe_route`` (weights, ids, counts, aux)
and ``kernels::moe_route_backward`` (dlogits from dweights and daux) are custom ops with fakes,
joined by ``register_autograd``, so ``torch.compile(fullgraph=True)`` keeps one node each; an
eager call that nothing watches runs the launches (:func:`kernels.eager.path`), through
:class:`_Route` where a gradient is needed. A plan per metadata (:mod:`kernels.plans`) keeps the
checks' verdict and the launches' arguments.
"""
from __future__ import annotations

import torch

from .. import eager, plans, validate
from .routing import _checked_bias, aux_loss, checked_top_k, expert_counts, route
from .routing_fused_kernels import MAX_EXPERTS, MAX_TOP_K, Launches


def routed(logits: torch.Tensor, top_k: int, normalize: bool
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A layer's routing of its float32 ``logits`` (T, E): :func:`route_fused` where it takes them (E <= 256, top_k <= 8, float32), else
    :func:`.routing.route`, :func:`.routing.expert_counts` and :func:`.routing.aux_loss`, the same
    four results (to the weights' and aux's rounding)."""
    if logits.shape[1] <= MAX_EXPERTS and top_k <= MAX_TOP_K and logits.dtype == torch.float32:
        return route_fused(logits, top_k, normalize)
    weights, ids = route(logits, top_k, normalize)
    counts = expert_counts(ids, logits.shape[1], checked=True)   # route checked logits and made ids
    return weights, ids, counts, aux_loss(logits, ids, counts, checked=True)


def _launches(logits: torch.Tensor, bias: torch.Tensor | None, top_k: int, normalize: bool) -> Launches:
    """The launches on these inputs (the plan's, where the custom ops' implementations hold none),
    kept per metadata and backend (:func:`kernels.plans.meta`)."""
    return _LAUNCHES(plans.meta(logits, bias, extra=(top_k, normalize)), Launches, *logits.shape, top_k,
                     *logits.stride(), None if bias is None else bias.stride(0), normalize)


_LAUNCHES = plans.PlanCache()


def _forward_impl(logits: torch.Tensor, bias: torch.Tensor | None, top_k: int,
                  normalize: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _launches(logits, bias, top_k, normalize).forward(logits, bias)


_forward = torch.library.custom_op("kernels::moe_route", _forward_impl, mutates_args=())


@_forward.register_fake
def _(logits, bias, top_k, normalize):
    tokens, experts = logits.shape
    return (logits.new_empty((tokens, top_k), dtype=torch.float32), logits.new_empty((tokens, top_k), dtype=torch.int32),
            logits.new_empty((experts,), dtype=torch.int64), logits.new_empty((), dtype=torch.float32))


def _backward_impl(dweights: torch.Tensor, daux: torch.Tensor, logits: torch.Tensor, ids: torch.Tensor,
                   counts: torch.Tensor, top_k: int, normalize: bool) -> torch.Tensor:
    return _launches(logits, None, top_k, normalize).backward(dweights, daux, logits, ids, counts)


_backward_op = torch.library.custom_op("kernels::moe_route_backward", _backward_impl, mutates_args=())


@_backward_op.register_fake
def _(dweights, daux, logits, ids, counts, top_k, normalize):
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


def _gradient(dweights, daux, logits, ids, counts, top_k, normalize, launches: Launches | None = None):
    """The backward custom op or, where nothing watches (:func:`kernels.eager.direct`), its launches:
    ``launches``, the forward's plan's, where :class:`_Route` kept them, else the implementation's."""
    if not eager.direct(dweights, daux, logits, ids, counts):
        return _backward_op(dweights, daux, logits, ids, counts, top_k, normalize)
    if launches is None:
        return _backward_impl(dweights, daux, logits, ids, counts, top_k, normalize)
    return launches.backward(dweights, daux, logits, ids, counts)


def _setup(ctx, inputs, output):
    logits, _, ctx.top_k, ctx.normalize = inputs
    ctx.save_for_backward(logits, output[1], output[2])


def _backward(ctx, dweights, _dids, _dcounts, daux):
    logits, ids, counts = ctx.saved_tensors
    return _gradient(dweights, daux, logits, ids, counts, ctx.top_k, ctx.normalize), None, None, None


_forward.register_autograd(_backward, setup_context=_setup)


class _Route(torch.autograd.Function):
    """The custom op's autograd formula for an eager call that needs a gradient and that nothing
    else watches (:data:`kernels.eager.AUTOGRAD`), running the plan's launches."""

    @staticmethod
    def forward(ctx, logits, bias, plan):
        weights, ids, counts, aux = plan.call(logits, bias)
        # ids and counts are integers, so no gradient is theirs; none is made up as zeros for them
        # (two device ops): ctx.set_materialize_grads(False), without the call's Python frame
        ctx.materialize_grads = False
        ctx.save_for_backward(logits, ids, counts)
        ctx.top_k, ctx.normalize, ctx.launches = plan.top_k, plan.normalize, plan.launches
        return weights, ids, counts, aux

    @staticmethod
    def backward(ctx, dweights, _dids, _dcounts, daux):
        logits, ids, counts = ctx.saved_tensors
        if dweights is None:   # the weights or the aux loss unused: its part is 0
            dweights = logits.new_zeros(ids.shape)
        if daux is None:
            daux = logits.new_zeros(())
        return _gradient(dweights, daux, logits, ids, counts, ctx.top_k, ctx.normalize, ctx.launches), None, None


_apply = eager.applier(_Route, tensors=1)   # bias may be None, which unwrap refuses


def route_fused(logits: torch.Tensor, top_k: int, normalize: bool = True, bias: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weights (T, top_k) float32, ids (T, top_k) int32, counts (E,) int64, aux () float32) of
    router logits (T, E): ``route(logits, top_k, normalize, bias)``, ``expert_counts`` of its ids
    and ``aux_loss`` of both, as a layer calls them. The ids and counts are theirs exactly (ties to
    the lowest id, in the same order); the weights and aux within fp32 rounding of theirs (the
    softmax's exp and the sums' order are the kernel's); differentiable in the logits through the
    weights and aux, the gradient float32. Deterministic: no atomics, the sums over tokens in a
    fixed order.

    ``logits``: float32 (the layers' :func:`.routing.router_logits`), any strides, T >= 0;
    1 <= E <= :data:`~.routing_fused_kernels.MAX_EXPERTS`; ``top_k`` an int in [1, min(E,
    :data:`~.routing_fused_kernels.MAX_TOP_K`)]; ``bias`` (E,) or None, as :func:`.routing.route`'s.
    Anything else is refused with an error that names it (:func:`routed` says what the layers may
    pass; they route with the torch functions otherwise)."""
    plan = _PLANS(plans.meta(logits, bias, extra=(top_k, type(top_k), normalize, type(normalize))),
                  _Plan, logits, top_k, normalize, bias)
    how = eager.path(known=plan.kind)
    if how == eager.PLAIN:
        return plan.call(logits, bias)
    if how == eager.AUTOGRAD:
        return _apply(logits, bias, plan)
    return _forward(logits, bias, top_k, normalize)


_PLANS = plans.PlanCache()


class _Plan(plans.Checked):
    """:func:`route_fused`'s checks for inputs of one metadata, ``top_k`` and ``normalize``; ``kind``,
    their :func:`kernels.eager.kind`. The launches are bound on the first eager call (:meth:`bind`),
    not by a traced one."""

    def __init__(self, logits, top_k, normalize, bias):
        validate.tensor("logits", logits, ndim=2, dtypes=(torch.float32,), allow_empty=True)
        experts = logits.shape[1]
        if experts > MAX_EXPERTS:
            raise ValueError(f"logits has {experts} experts; route_fused holds a token's experts in one program, "
                             f"at most {MAX_EXPERTS} (kernels.moe.route takes more)")
        self.top_k = checked_top_k(top_k, experts)
        if top_k > MAX_TOP_K:
            raise ValueError(f"top_k={top_k}: route_fused chooses at most {MAX_TOP_K} experts per token "
                             f"(kernels.moe.route takes more)")
        if not isinstance(normalize, bool):
            raise TypeError(f"normalize must be a bool, got {type(normalize).__name__}")
        if bias is not None:
            _checked_bias(bias, logits)
        self.normalize = normalize
        self.kind = eager.kind(logits) if bias is None else eager.kind(logits, bias)

    def bind(self, logits, bias):
        """The forward's launches on these inputs, called as they are; kept as ``launches`` too,
        for :class:`_Route`'s backward."""
        self.launches = _launches(logits, bias, self.top_k, self.normalize)
        return self.launches.forward
