"""``kernels.MoE``: the mixture-of-experts layer on the package's kernels.

A subclass of :class:`~kernels.moe.reference.MoEReference` (through
:class:`~kernels.moe.layer_base.MoELayer`, the base it shares with the expert-parallel layer),
so parameters, their initialization and ``state_dict`` keys are the reference's own and a
checkpoint loads either way; only ``forward`` differs. It is the ``moe`` op's best rung (v3:
route, then two fused kernels, gather + gate/up + SwiGLU and down + weighted scatter, and a
backward of six grouped GEMMs on saved activations) plus the shared experts, run as one SwiGLU
MLP over their concatenated hidden units on torch's matmul
(:meth:`~kernels.moe.layer_base.MoELayer.shared_mlp` says why). The routing (softmax, top-k,
expert counts and the load-balancing loss) is two launches forward and one backward where the
router fits (at most 256 experts, top_k at most 8: :func:`kernels.moe.routing_fused.routed`),
else the torch functions :func:`~kernels.moe.route`, :func:`~kernels.moe.expert_counts` and
:func:`~kernels.moe.aux_loss`. The experts are one custom op with its backward
(``kernels::moe_fused``) under ``torch.compile`` and other tracing, where it stays one opaque
node and the layer compiles without graph breaks; an eager call that nothing traces runs the
same kernels without the op's dispatch (:func:`kernels.eager.path`: the forward alone where no
gradient is needed, else the rung's ``autograd.Function``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .. import autocast, plans
from .layer_base import MoELayer
from .layer_ladder.checks import moe_operands
from .layer_ladder.spec import DTYPES
from .layer_ladder.fused_op import fused_experts
from .reference import MoEReference
from .routing_fused import routed

if TYPE_CHECKING:
    from .ep_layer import ExpertParallelMoE


class MoE(MoELayer):
    """Takes ``(..., dim)``, returns ``(..., dim)``; differentiable in x and every parameter.

    After each call, ``aux_loss`` holds the load-balancing loss of that call's routing
    (:func:`kernels.moe.aux_loss`, differentiable in the router's weight: add
    ``coefficient * layer.aux_loss`` to the training loss) and ``expert_counts`` the
    token-slots each expert got (int64 ``(E,)``). Both are None before the first call.

    fp32, fp16 and bf16; the router runs in float32 whatever the dtype. Under
    ``torch.autocast`` the experts run in the autocast dtype, as the reference's matmuls
    do (autocast casts no operand of a custom op without an autocast rule, so the layer
    casts them itself, :func:`kernels.autocast.operands`), and the result is in x's dtype, as the
    reference's (its weighted sum is x's dtype; the shared experts' matmuls autocast).
    Expert weights the region casts (fp32 master weights under bf16) enter the experts' autograd
    node uncast (:data:`master_weights`): it casts them, and their gradients come in their own
    dtype, the dW launches' fp32 sums unrounded, with no cast back
    (:func:`~kernels.moe.layer_ladder.fused_op.fused_experts`).
    Forward and backward are bitwise reproducible run to run for a fixed grouped GEMM.

    ``MoE(..., ep_group=group)`` splits the experts over the group's ranks: it returns an
    :class:`kernels.moe.ep_layer.ExpertParallelMoE`, a sibling of this class on their shared
    base :class:`~kernels.moe.layer_base.MoELayer` (``isinstance(layer, MoELayer)`` holds for
    both); ``MoE.from_full(layer, group)`` is a rank's share of a full layer.
    """

    def __new__(cls, *args, ep_group=None, **kwargs):
        """With ``ep_group`` (a process group), the expert-parallel layer, built whole here
        (:class:`kernels.moe.ep_layer.ExpertParallelMoE`, which also takes ``ep_chunks``):
        it is not a ``MoE``, so Python does not run ``MoE.__init__`` on it."""
        if ep_group is not None and cls is MoE:
            from .ep_layer import ExpertParallelMoE   # on first use: it brings torch.distributed's layer

            return ExpertParallelMoE(*args, ep_group=ep_group, **kwargs)
        return super().__new__(cls)

    def __init__(self, *args, ep_group=None, **kwargs):
        # ep_group is None here: a group made __new__ build ExpertParallelMoE instead
        if "ep_chunks" in kwargs:
            raise ValueError("ep_chunks needs ep_group (the process group to split the experts over)")
        super().__init__(*args, **kwargs)

    @classmethod
    def from_full(cls, layer: MoEReference, ep_group, *, ep_chunks: int = 1) -> ExpertParallelMoE:
        """This rank's expert-parallel share of ``layer`` (a full ``kernels.MoE`` or
        ``MoEReference``): its router and shared experts, and its experts of ``ep_group``."""
        weight = layer.router.weight
        ep = MoE(layer.dim, layer.hidden, layer.num_experts, layer.top_k, layer.shared_experts,
                 ep_group=ep_group, ep_chunks=ep_chunks, normalize=layer.normalize,
                 device=weight.device, dtype=weight.dtype)
        ep.load_state_dict(layer.state_dict())
        return ep

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 1 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (..., dim={self.dim}), got {tuple(x.shape)}")
        rows = x.reshape(-1, self.dim)
        gate, up, down, cast = self.gate, self.up, self.down, None
        if autocast.active():
            if self.master_weights:
                (rows,), cast = autocast.master_operands(gate, rows)
            if cast is None or not gate.dtype == up.dtype == down.dtype:
                rows, gate, up, down, cast = *autocast.operands(rows, gate, up, down), None
        router, top_k = self.router.weight, self.top_k   # uncast: its logits are float32 (router_logits)
        _CHECKED(plans.meta(rows, router, gate, up, down, extra=(top_k, type(top_k), cast)), _check,
                 rows, router, gate, up, down, top_k, cast)
        weights, ids, self.expert_counts, self.aux_loss = routed(self.router_logits(rows), top_k, self.normalize)
        out = self.experts(rows, weights, ids, gate, up, down).to(x.dtype)
        if self.shared_experts:
            out = out + self.shared_mlp(rows)
        return out.reshape(x.shape)

    master_weights = True
    """Whether, under autocast, expert weights the region casts enter :meth:`experts` uncast: its
    node (:func:`~kernels.moe.layer_ladder.fused_op.fused_experts`) casts weights of another dtype
    than x's itself, so one call takes both. :class:`kernels.moe.fp8_layer.Float8MoE` keeps the
    cast weights (its experts quantize them to FP8), as does the expert-parallel layer
    (:mod:`kernels.moe.ep_layer`, whose owners' backward runs the same dW launches on received
    rows)."""

    def experts(self, rows, weights, ids, gate, up, down) -> torch.Tensor:
        """The routed experts' weighted sum (T, dim) for a routing (weights, ids (T, k)): the
        fused rung (``kernels::moe_fused``); :class:`kernels.moe.fp8_layer.Float8MoE` runs them in FP8."""
        return fused_experts(rows, weights, ids, gate, up, down)


_CHECKED = plans.PlanCache()   # operands' metadata and top_k -> True: moe_operands passed on them


def _check(rows, router, gate, up, down, top_k, cast) -> bool:
    """moe_operands; master weights (``cast``, the dtype the node casts them to) checked as their
    casts (:func:`kernels.autocast.stand_in`)."""
    if cast is not None:
        gate, up, down = (autocast.stand_in(w, cast) for w in (gate, up, down))
    moe_operands(rows, router, gate, up, down, top_k, DTYPES, router_dtypes=DTYPES)
    return True
