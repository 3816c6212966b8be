"""``Float8MoE``: :class:`kernels.MoE` whose experts' three GEMMs and their gradients run in FP8.

What :func:`kernels.fp8.convert` makes of a ``kernels.MoE``: the same parameters (shared,
not copied: an optimizer made before the swap still updates them), the same routing,
and the experts as v2 of the ``moe`` ladder runs them (:mod:`.layer_ladder.v2_grouped`:
permute by expert, gate and up, SwiGLU, down, the weighted combine) with each of the three grouped
GEMMs on :func:`kernels.moe.grouped_gemm_fp8.grouped_gemm_fp8_train`: forward, dX and dW
as FP8 grouped GEMMs with fp32 accumulation, operands quantized by ``recipe`` along each
GEMM's reduction dimension (:mod:`.grouped_gemm_fp8.quantize`), the output gradients in
``grad_fp8_dtype`` (e4m3, or its family's e5m2: hybrid). Not v3's fused kernels: they
take bf16/fp32 operands and have no FP8 path.

Under ``"delayed"`` the layer keeps an amax history per operand of its GEMMs
(:data:`kernels.moe.fp8_experts.FP8_TENSORS`: the routed rows x, which gate and up share,
SwiGLU's output hidden, and the three expert weights) as buffers, and takes each
per-tensor scale from it by the dense delayed recipe's rule
(:func:`kernels.fp8.recipes.delayed.cast_scales`); what enters each history is the amax the
forward's fused casts find (x's from its one cast for gate and up in training, or gate's GEMM's
without gradients, up's cast of x then writing no tile maxima; gate's from gate's GEMM, up's from
up's, hidden's and down's from down's: ``grouped_gemm_fp8_train(..., amax=...)``), so no torch
pass reads an operand for its amax. Under ``"tensorwise"`` without
gradients x's scale is found once for gate's and up's casts (:meth:`~kernels.moe.fp8_experts.Float8Experts._cast_scale`:
one amax pass over the rows, not two, in the same launches; the bits of casts that find their own).
Under ``"rowwise"``, ``"tensorwise"`` and ``"delayed"``, in training, x is quantized once for gate
and up, both ways (:meth:`~kernels.moe.fp8_experts.Float8Experts._shared_operands`: rowwise's one
fused quantization, the per-tensor recipes' one cast with one scale writing both layouts), and its
FP8 wgrad operand is what their backward reads, one copy saved between them instead of x. Each
GEMM's output gradient has a history too (:data:`kernels.moe.fp8_experts.GRAD_TENSORS`: down's dy,
gate's dg and up's du), which the
layer hands to the training op (``history_dy=``, and ``counts=`` in training mode): its
backward casts the gradient with the history's scale for both dX and dW and records the
amax the cast found, as a ``Float8Linear``'s backward does for its dy (also under
``torch.compile``, tested with ``aot_eager``). Those buffers are in ``state_dict`` (a checkpoint from before the
gradients' histories loads with them empty), counted by :func:`kernels.fp8.warn_saturation`
and all-reduced across ranks with the Linears' (:mod:`kernels.fp8.amax_sync`). What it
shares with the expert-parallel FP8 layer (construction, the GEMM call, the histories and their cast-time scales) is
:mod:`.fp8_experts`; that layer records the same forward amaxes, its chunks' largest once a
step, and the output gradients' in its owner's merged backward, each once a step over all
chunks' rows.

What stays in high precision: the router (its logits in float32 unless ``convert`` was
told to make it FP8 too), the routing weights and the weighted sum over a token's
experts (float32 in registers, rounded once: :mod:`.combine_op`), SwiGLU, and the shared experts
unless :func:`kernels.fp8.convert` was told otherwise (parameters that no Linear holds: kept, they
run as the ``MoE`` layer runs them; in FP8, as FP8 Linears of the recipe would,
:attr:`~kernels.moe.fp8_experts.Float8Experts.fp8_shared_experts`). SwiGLU and its
derivative are one Triton pass each (:mod:`.swiglu_op`), not torch's elementwise chains over
(T·k, hidden): h computed in fp32 from g and u and rounded once, which can differ from
torch's ``F.silu(g) * u`` (two roundings) in the last bit; down quantizes, and delayed
records the amax of, these bits. The backward reads the saved g, u and h. The permutation
and the combine are :mod:`.combine_op`'s custom ops, not v2's torch ``permute``/``unpermute``:
the k-sums (the combine's forward, permute's backward) and the combine's backward are Triton
passes, so nothing of (T·k, dim) is written in float32.
"""
from __future__ import annotations

import functools

import torch

from ..fp8.recipes.delayed import record_amax
from .fp8_experts import FP8_TENSORS, GRAD_TENSORS, Float8Experts
from .layer import MoE
from .combine_op import combine, permute_rows
from .permutation import _inverse, sort_slots
from .swiglu_op import swiglu


class Float8MoE(Float8Experts, MoE):
    """A ``kernels.MoE`` with FP8 experts under ``recipe`` (one of
    :data:`kernels.moe.grouped_gemm_fp8.quantize.RECIPES`); built by :meth:`from_moe` (or
    :func:`kernels.fp8.convert`)."""

    fp8_tensors = FP8_TENSORS + GRAD_TENSORS
    master_weights = False   # under autocast its routed experts take the cast weights, which they quantize
    #                          (FP8 shared experts quantize their master weights, as Float8Linear does)

    @classmethod
    def from_moe(cls, layer: MoE, recipe: str = "rowwise", fp8_dtype: torch.dtype | None = None,
                 grad_dtype: torch.dtype | None = None, scale_rule: str | None = None) -> "Float8MoE":
        """A Float8MoE holding ``layer``'s own Parameters and submodules (its router); formats
        as :meth:`kernels.moe.fp8_experts.Float8Experts._adopt` takes them. The
        expert-parallel layer's FP8 form is :class:`kernels.moe.ep_fp8_layer.Float8ExpertParallelMoE`."""
        if type(layer) is not MoE:
            raise TypeError(f"Float8MoE.from_moe takes a kernels.MoE, got {type(layer).__name__} "
                            "(the expert-parallel layer's FP8 form: Float8ExpertParallelMoE.from_ep)")
        return cls._adopt(layer, recipe, fp8_dtype, grad_dtype, scale_rule)

    def experts(self, rows, weights, ids, gate, up, down) -> torch.Tensor:
        offsets, permutation = sort_slots(ids, gate.shape[0])
        inverse = _inverse(permutation)
        x_sorted = permute_rows(rows, permutation, inverse, ids.shape[1], check_permutation=False)
        record = functools.partial(record_amax, self)   # each GEMM's amaxes enter the histories at once
        # x quantized once for gate and up in training (rowwise; tensorwise: its scale found there, one amax
        # pass over the rows; delayed: its history's scale, its amax recorded there); else its scale found
        # once (delayed: one history entry a step; tensorwise without gradients)
        scale_x = self._cast_scale("x", x_sorted) if self.recipe == "delayed" else None
        shared = self._shared_operands(x_sorted, offsets, scale_x, record, gate, up)
        if shared is None and scale_x is None:
            scale_x = self._cast_scale("x", x_sorted)
        g = self._mm(x_sorted, scale_x, gate, self._cast_scale("gate", gate), offsets, record, "gate",
                     None if shared else "x", a_operands=shared)
        u = self._mm(x_sorted, scale_x, up, self._cast_scale("up", up), offsets, record, "up", a_operands=shared)
        hidden = swiglu(g, u)
        out = self._mm(hidden, self._cast_scale("hidden", hidden), down, self._cast_scale("down", down), offsets,
                       record, "down", "hidden")
        return combine(out, weights, permutation, inverse, check_permutation=False)
