"""``Float8ExpertParallelMoE``: the expert-parallel MoE layer whose owners run their experts in FP8.

What :func:`kernels.fp8.convert` makes of a :class:`kernels.moe.ep_layer.ExpertParallelMoE`:
the same parameters (shared), routing, plans, chunks, capacity and all-to-alls, and at each
owner, instead of v3's kernels, its local experts' three GEMMs on the FP8 grouped GEMM of
``recipe`` (:func:`kernels.moe.grouped_gemm_fp8.grouped_gemm_fp8_train`, quantized as
:class:`kernels.moe.fp8_layer.Float8MoE` quantizes them): gate and up, SwiGLU, down per
chunk in the forward (SwiGLU as ``Float8MoE`` runs it: one Triton pass,
:func:`kernels.moe.layer_ladder.swiglu_forward.swiglu_forward`, h computed in fp32 and
rounded once, which can differ from torch's ``F.silu(g) * u`` and its two roundings in the
last bit; delayed records h's amax from these bits), keeping the rows, g, u and h as v3
does; in the backward, on all chunks' rows merged in the single-process layer's order
(:mod:`.ep_layer`), dX and dW of each expert GEMM as FP8 grouped launches (:func:`kernels.moe.grouped_gemm_fp8.training.gradients`,
the output gradients in ``grad_fp8_dtype``): six launches, no forward GEMM, and between
down's and the others SwiGLU's derivative as v3's elementwise kernel computes it
(:func:`kernels.moe.layer_ladder.swiglu_backward.swiglu_backward`: one pass, no torch
elementwise pass or fp32 temporary over the rows), no host read of its own, so with
``ep_capacity`` the layer still reads nothing on the host.

FP8 dispatch (``fp8_dispatch``, default True for the row-local recipes rowwise, blockwise
and mxfp8, :data:`kernels.moe.grouped_gemm_fp8.quantize.ROW_LOCAL`; ``kernels.fp8.convert``'s
keyword of that name sets it), as DeepSeek-V3 does
(arXiv 2412.19437, section 3.3: activations quantized to FP8 before the dispatch, the
combine in BF16): each rank quantizes its T tokens once, before the k-fold gather of their
slots, with the recipe's own token quantizer (one scale per token, per 128 elements, or an
e8m0 byte per 32), and the dispatch's all-to-all carries each row's FP8 bytes with its
scales beside them (:mod:`kernels.comm.row_bytes`: one collective per chunk, as before,
rather than a second one for the scales). A row of ``dim`` elements is ``dim`` + 4 bytes
(rowwise), ``dim`` + 4·ceil(dim/128) (blockwise) or ``dim`` + ceil(dim/32) (mxfp8) instead
of 2·``dim`` in bf16: at DeepSeek-V3's dim 7168, 50.0 %, 51.6 % and 51.6 % of the bf16
bytes. The owner feeds the received operand straight to the gate and up GEMMs: a token's
quantization reads that token only, so it gives the bytes the owner would have computed,
and the forward is the high-precision dispatch's bit for bit (tested). The combine and
the backward's two exchanges stay in the activation dtype.

The owner keeps the received FP8 rows for the backward instead of the high-precision ones:
``dim`` + the scales' bytes per row instead of ``dim`` times the dtype's size, so an owner
that received R rows keeps R·(dim − 4) bytes less in bf16 under rowwise. The cost is in the
weight gradients of gate and up: their operand x, scaled per (expert, feature) over the
expert's tokens, is requantized from the FP8 rows dequantized to x's dtype (DeepSeek-V3's
approach), so it carries the forward's per-token rounding (up to 2^-4 relative, more for
values in the subnormal range of their scale), the dequantization's rounding to x's dtype
(2^-9 in bf16) and its own; measured on the test's layer, their error against float64 is
within twice ``Float8MoE``'s (tests/test_ep_fp8.py). The input
gradient, the down GEMM's weight gradient (of h, computed from the same operand) and the
router's are unchanged.

Tensorwise and delayed keep the high-precision dispatch: their x scale is one per tensor,
an amax over the rows an owner receives from every rank (tensorwise) or a history synced
across the ranks (delayed), which a sender cannot apply to its own rows alone. Capacity
padding rows travel as zero bytes (a zero row with a zero scale) and are bounded on the
device in SwiGLU's forward and gradient (``rows_end``: neither kernel reads a padding row
of g, u or dh, which the GEMMs leave unwritten, and they write its h, dg and du as 0), so
no unwritten GEMM output reaches a scale's amax. The casts that read all of an owner's rows
(the per-tensor recipes' x and h in the forward; in the backward dy, dg, du and the wgrad
operands x and h, under every recipe) are not bounded themselves: they rely on the padding rows
being exactly 0, which they are by construction, x's and dy's the sender's zero row copied by
an all-to-all that writes every row it delivers, h's, dg's and du's SwiGLU's bounded writes
(tests/test_ep_fp8_padding.py, with every kernel output and every all-to-all buffer poisoned
before it is written).

An owner quantizes a chunk's rows once for gate and up (the token operand, as the training op's
forward casts them; with FP8 dispatch the sender did), and its merged backward makes the rows'
wgrad operand once for both (mxfp8's gradients make their own). Under every recipe but mxfp8
(whose GEMM quantizes its weight itself) each weight is cast for the forward once, by the first
chunk, the later chunks reading that cast; under rowwise and the per-tensor recipes with its dgrad
operand from the same fused quantization, which the backward takes (it casts no weight).

Against the single-process ``Float8MoE`` of the same recipe and weights: rowwise and mxfp8
quantize each token and each expert's weight on their own, so an owner quantizes its rows
as the single-process layer does, and each expert's wgrad scales are over that expert's
rows in the same order (the merged backward): output and gradients equal up to the order
of fp32 sums, as for the high-precision EP layer (tests/test_ep_fp8.py), but with FP8
dispatch for gate's and up's weight gradients (above). Blockwise's are
too but for its wgrad scales, per 128 rows counted from the first row of all experts
(:mod:`kernels.moe.grouped_gemm_fp8.quantize`): an owner's blocks hold other rows. The
sender's k-sums and the combine's backward are ``Float8MoE``'s kernels in its order
(:mod:`.ep_layer`), so on a one-rank group, where the owner's rows are ``Float8MoE``'s,
rowwise gives its output and every gradient bit for bit, but for FP8 dispatch's gate and up
weight gradients (tests/test_ep_moe_k_sum.py). The
per-tensor recipes see a rank's part. Tensorwise takes the amaxes of a chunk's rows, of
the local experts' weights and of the owner's output gradients: the owner finds each weight's
scale once a forward and each chunk's rows' once, and its merged
backward takes them rather than finding them again (no amax pass over x, h or a weight there):
a weight's as the forward found it, the rows' from the largest of the chunks' amaxes (their
amax passes' partial maxima, kept), which is the scale one cast over all the rows finds, so the
gradients are bit for bit those of casts that find their own (tests/test_ep_fp8_found_scales.py,
with a chunk whose rows are all 0, whose scale of 1 is no amax, and a chunk with no rows).
Delayed keeps this rank's histories (:data:`kernels.moe.fp8_experts.FP8_TENSORS` and :data:`~kernels.moe.fp8_experts.GRAD_TENSORS`,
as ``Float8MoE``): of its owner's rows and SwiGLU outputs, of its local experts' weights and of
its owner's three output gradients (down's dy, gate's dg, up's du), which the amax sync's MAX
all-reduce (over the data-parallel group, which must span the expert-parallel one) turns
into the amaxes over all ranks, the single-process layer's. What enters them is what
``Float8MoE`` records, the amaxes the fused casts with the given scales find
(the training op's forward casts with ``amax``, a weight's by its one cast a forward; in the backward
:func:`kernels.moe.grouped_gemm_fp8.training.gradients` with the gradient's history: no torch
pass reads the rows, SwiGLU's output, a weight or a gradient for its amax). The merged backward
(all chunks' rows at once) hands each GEMM's history, and when the forward ran in training mode
its counts, to ``gradients``: each gradient's two casts (dgrad's, wgrad's) take one scale, the
history's, found on the device, for all of this owner's rows, and the amax the first cast
found enters the history once a step (nothing in eval mode); no host read, no collective of
its own. That cast's amax covers all of the gradient's rows, capacity padding included; they
are 0 there (dy's from the exchange's zero row, dg's and du's written 0 by SwiGLU's
derivative), so the amax is the real rows' (tested with dh's padding rows poisoned). The
owner's dy rows are ``w·dy`` from the single-process layer's combine backward kernel
(:func:`.layer_ladder.combine_backward.combine_backward`: the same product in the same
precision, rounded once), so the max over the ranks of the owners'
amaxes is its amax bit for bit; dg and du come from dh, whose dgrad
GEMM sums in another order than the single-process layer's tiles, so theirs can differ in the
last bits. So after the sync the histories are the single-process layer's (dg's and du's to
the fp32 reassociation of dh; tested), and from equal histories forward and gradients are
the single-process layer's up to the order of fp32 sums. In its first step (empty histories)
each rank takes its own current amaxes. A forward records one history entry per tensor, the
largest amax of its chunks; while the history is empty each chunk takes its own amax, and
the backward the largest.
"""
from __future__ import annotations

import torch

from ..comm import row_bytes
from ..fp8.recipes.delayed import joined_scale, record_parts
from ..gemm_fp8.quantize_ref import dequantize
from .ep_layer import ExpertParallelMoE
from .fp8_experts import FP8_TENSORS, GRAD_TENSORS, Float8Experts
from .grouped_gemm_fp8.ops import _grouped_gemm_fp8_impl
from .grouped_gemm_fp8.quantize import (ROW_LOCAL, SHARED_WEIGHTS, forward_weight, weight_operands,
                                        wgrad_operand)
from .grouped_gemm_fp8.training import forward_of_operand, gradients, token_operand
from .layer_ladder.slot_sum import slot_sum
from .layer_ladder.swiglu_backward import swiglu_backward
from .layer_ladder.swiglu_forward import swiglu_forward


class _Float8Owner:
    """One forward's expert computation at this owner in FP8 (the two methods of
    :class:`kernels.moe.ep_layer.V3Experts`), and under the per-tensor recipes the scales it took:
    the weights' once, the rows' and SwiGLU output's per chunk; under delayed scaling the tile
    maxima the chunks' fused casts wrote, which :meth:`record` enters in the histories once per
    forward, under tensorwise the rows' amax passes' partial maxima, from which the backward
    takes the scale of all chunks' rows (:meth:`_rows_scale`); and the output gradients'
    histories (with the counts in a training-mode forward), which its merged backward hands to
    the gradient launches, each recording once."""

    def __init__(self, layer: "Float8ExpertParallelMoE"):
        self.layer, self.padded = layer, layer.ep_capacity is not None
        self.weight_scales: dict | None = None
        self.grad_state: dict = {}   # per weight: its GEMM's output gradient's (Float8Experts._grad_state)
        # delayed: the tile maxima of the rows' and hidden's casts per chunk, of a weight's one cast
        self.maxima: dict[str, list] = {name: [] for name in FP8_TENSORS}
        self.scales: dict = {"x": None, "hidden": None}   # delayed: the backward's, for all chunks' rows
        # tensorwise: the (scale, amax partials) Float8Experts._cast_scale found for the rows, per chunk
        self.current: dict[str, list] = {"x": [], "hidden": []}
        self.fp8_dispatch = layer.fp8_dispatch
        self.dtype, self.parts = None, None   # with FP8 dispatch: x's dtype and the wire's layout
        # per weight (not under mxfp8): its forward operand (w8, sw), cast by the first chunk
        # and read by every chunk, dropped after the last (:meth:`record`); its dgrad operand (wt8, swt)
        # for the backward, made with it where the recipe shares them (:meth:`_weight`)
        self.forward_weights: dict[str, tuple] = {}
        self.dgrad_weights: dict[str, tuple] = {}

    def wire(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's tokens as the dispatch sends them: x, or with FP8 dispatch the recipe's
        token operand of x (quantized once, T rows) as bytes, each row's scales beside it."""
        if not self.fp8_dispatch:
            return x
        x8, sx = token_operand(x, self.layer.recipe, self.layer.fp8_dtype, scale_rule=self.layer.scale_rule)
        self.dtype, self.parts = x.dtype, row_bytes.layout(x8, sx)   # every rank's: same dim, recipe
        return row_bytes.pack(x8, sx)

    def dequantized(self, rows: torch.Tensor) -> torch.Tensor:
        """Wire rows (:meth:`wire`) back in x's dtype: each element times its scale, rounded to
        float32, then to x's dtype (what the backward's wgrad operand quantizes again)."""
        return dequantize(*row_bytes.views(rows, self.parts), ROW_LOCAL[self.layer.recipe], self.dtype)

    def _rows_scale(self, name: str) -> torch.Tensor | None:
        """The scale of all chunks' rows of ``name`` (x or hidden) for the backward's casts: delayed's,
        which :meth:`record` took; tensorwise's, the one a cast over all of them would find: of the
        largest of the chunks' amaxes (their amax passes' partials joined, one torch op, and one
        launch), or the one chunk's own scale; None under the other recipes."""
        if self.layer.recipe != "tensorwise":
            return self.scales[name]
        (scale, partials), *more = self.current[name]
        if not more:
            return scale
        return joined_scale(partials.new_empty(0), [p for _, p in self.current[name]], self.layer.fp8_dtype)[0]

    def _cast(self, name: str, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A chunk's rows (``name`` x) or SwiGLU output (hidden) as the training op's forward casts
        them, with the scale the layer takes (tensorwise's found here, kept for the backward;
        delayed's, the cast's tile maxima kept for :meth:`record`)."""
        layer, delayed = self.layer, self.layer.recipe == "delayed"
        scale = layer._cast_scale(name, t, self.current[name])
        t8, st, *found = token_operand(t, layer.recipe, layer.fp8_dtype, scale, delayed, layer.scale_rule)
        self.maxima[name] += found   # delayed's one tensor, else none
        return t8, st

    def _weight(self, name: str, w: torch.Tensor, save: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """w's forward operand (w8, sw): every chunk multiplies the same weight with the same scale,
        so the first chunk casts it and the later ones read that cast (each weight cast once per
        forward, not once per chunk; delayed's tile maxima written once). With a backward to come
        (``save``), under rowwise and the per-tensor recipes, from one fused quantization with its
        dgrad operand (:func:`.grouped_gemm_fp8.quantize.weight_operands`: rowwise's four launches
        and two reads of w where the two casts took six and four; the per-tensor recipes' one cast
        with the weight's scale, writing both layouts, where two read w twice), kept for
        :meth:`backward`, which then casts no weight."""
        if name not in self.forward_weights:
            layer, delayed = self.layer, self.layer.recipe == "delayed"
            scale = self.weight_scales[name]
            if save and layer.recipe in SHARED_WEIGHTS:
                w8, sw, wt8, swt, *found = weight_operands(w, layer.recipe, layer.fp8_dtype, scale, delayed)
                self.dgrad_weights[name] = (wt8, swt)
            else:
                w8, sw, *found = forward_weight(w, layer.recipe, layer.fp8_dtype, scale, delayed)
            self.maxima[name] += found
            self.forward_weights[name] = (w8, sw)
        return self.forward_weights[name]

    def _gemm(self, a8, sa, name: str, w, offsets, out_dtype: torch.dtype, save: bool) -> torch.Tensor:
        """``a_g @ w[g]`` from a's FP8 operand: with the kept cast of w (:meth:`_weight`), or under
        mxfp8 by its own launch, which quantizes w itself."""
        layer = self.layer
        if layer.recipe == "mxfp8":
            return forward_of_operand(a8, sa, w, offsets, layer.recipe, layer.fp8_dtype, out_dtype,
                                      scale_rule=layer.scale_rule)[0]
        return _grouped_gemm_fp8_impl(a8, sa, *self._weight(name, w, save), offsets, out_dtype)

    def forward(self, rows, offsets, gate, up, down, save: bool):
        """(the unweighted expert outputs, g, u, h) of one chunk's expert-major rows, g and u
        empty unless ``save``."""
        layer = self.layer
        if self.weight_scales is None:   # the first chunk: one scale per weight and forward
            # (a list given: tensorwise finds a weight's scale here too; its partials are not needed)
            self.weight_scales = {n: layer._cast_scale(n, w, [])
                                  for n, w in (("gate", gate), ("up", up), ("down", down))}
            # the output gradients' histories, and their counts in training mode (the forward's mode)
            self.grad_state = {n: layer._grad_state(n) for n in self.weight_scales}
        # the rows quantized once for gate and up: the sender's FP8 operand with FP8 dispatch
        x8, sx = row_bytes.unpack(rows, self.parts) if self.fp8_dispatch else self._cast("x", rows)
        g, u = (self._gemm(x8, sx, name, w, offsets, self.dtype or rows.dtype, save)
                for name, w in (("gate", gate), ("up", up)))
        # capacity padding (rows past the last expert's end, which gate and up left unwritten):
        # not read, and 0 in h, which down's quantization reads
        h = swiglu_forward(g, u, rows_end=offsets[-1:] if self.padded else None)
        y = self._gemm(*self._cast("hidden", h), "down", down, offsets, h.dtype, save)
        if not save:
            g = u = h.new_zeros((0, g.shape[1]))
        return y, g, u, h

    def record(self) -> None:
        """After the last chunk: the weights' forward operands are dropped (the backward reads the
        weights, or their dgrad operands made with them). Under delayed each tensor enters its history once,
        with the largest amax the chunks' casts found (the max of their tile maxima; a weight's from
        its one cast a forward, :meth:`_weight`); the scale of x's and hidden's (the history's, or
        that amax's while it was empty) is the backward's."""
        self.forward_weights.clear()
        for name, maxima in self.maxima.items():
            if maxima:
                scale = record_parts(self.layer, name, maxima)
                if name in self.scales:   # the weights' are weight_scales, taken before the first chunk
                    self.scales[name] = scale

    def backward(self, rows, grad_y, g, u, h, offsets, gate, up, down, needs):
        """(d rows, d gate, d up, d down) as :func:`kernels.moe.ep_layer._experts_backward`
        returns them, from FP8 dX and dW launches; SwiGLU's derivative by the kernel
        ``Float8MoE``'s backward runs (:func:`.layer_ladder.swiglu_backward.swiglu_backward`,
        weight 1), its capacity padding rows bounded on the device: dh's there are unwritten,
        their dg and du 0 (and dy's 0 from the exchange), so each gradient's casts, over all its
        rows, find the real rows' amax, which under delayed enters its history once for all
        chunks. With FP8 dispatch the rows are the received FP8 bytes: dequantized to x's
        dtype for the wgrad operand of gate and up, which quantizes them again per (expert,
        feature)."""
        layer, w = self.layer, self.weight_scales
        if self.fp8_dispatch:
            rows = self.dequantized(rows)

        def grads(x, weight, dy, name, need_w, scale_x, dx_dtype=None):
            return gradients(x, weight, offsets, dy, layer.recipe, layer.fp8_dtype, layer.grad_fp8_dtype,
                             (True, need_w), scale_x, w[name], **self.grad_state[name], scale_rule=layer.scale_rule,
                             dx_dtype=dx_dtype, w_dgrad=self.dgrad_weights.get(name))

        dh, ddown = grads(h, down, grad_y, "down", needs[2], self._rows_scale("hidden"))
        dg, du, _, _ = swiglu_backward(dh, g, u, h, None, swiglu=True, dw_rows=False, weighted_h=False,
                                       rows_end=offsets[-1:] if self.padded else None)
        scale_x = self._rows_scale("x")
        x = rows   # gate's and up's wgrad operand of the rows: quantized once between them (not mxfp8's, its own)
        if layer.recipe != "mxfp8" and (needs[0] or needs[1]):
            x = wgrad_operand(rows, offsets, layer.recipe, layer.fp8_dtype, scale_x)
        dx_gate, dgate = grads(x, gate, dg, "gate", needs[0], scale_x, rows.dtype)
        dx_up, dup = grads(x, up, du, "up", needs[1], scale_x, rows.dtype)
        return slot_sum(dx_gate, 1, dx_up), dgate, dup, ddown


def check_fp8_dispatch(recipe: str, value: bool) -> None:
    """``fp8_dispatch`` = ``value`` is legal under ``recipe``: a bool, True only for a row-local
    recipe (the property's setter and :func:`kernels.fp8.convert`'s keyword, before it swaps
    anything)."""
    if not isinstance(value, bool):
        raise TypeError(f"fp8_dispatch must be a bool, got {type(value).__name__}")
    if value and recipe not in ROW_LOCAL:
        raise ValueError(f"fp8_dispatch needs a recipe that scales each token on its own "
                         f"({', '.join(ROW_LOCAL)}); {recipe!r} takes one scale per tensor, "
                         "so its rows travel in the activation dtype")


class Float8ExpertParallelMoE(Float8Experts, ExpertParallelMoE):
    """An :class:`~kernels.moe.ep_layer.ExpertParallelMoE` whose owners run their experts in FP8
    under ``recipe`` (one of :data:`kernels.moe.grouped_gemm_fp8.quantize.RECIPES`); built
    by :meth:`from_ep` (or :func:`kernels.fp8.convert`)."""

    fp8_tensors = FP8_TENSORS + GRAD_TENSORS

    @classmethod
    def from_ep(cls, layer: ExpertParallelMoE, recipe: str = "rowwise", fp8_dtype: torch.dtype | None = None,
                grad_dtype: torch.dtype | None = None, scale_rule: str | None = None) -> "Float8ExpertParallelMoE":
        """The FP8 layer holding ``layer``'s own Parameters and submodules, on its group, chunks
        and capacity; formats as :class:`kernels.moe.fp8_layer.Float8MoE` takes them. FP8
        dispatch is on for the row-local recipes (the ``fp8_dispatch`` property turns it off)."""
        if type(layer) is not ExpertParallelMoE:
            raise TypeError(f"Float8ExpertParallelMoE.from_ep takes an ExpertParallelMoE, got "
                            f"{type(layer).__name__}")
        new = cls._adopt(layer, recipe, fp8_dtype, grad_dtype, scale_rule)
        new.ep_capacity = layer.ep_capacity   # a property: its value is private
        new.fp8_dispatch = recipe in ROW_LOCAL
        return new

    @property
    def fp8_dispatch(self) -> bool:
        """Whether the tokens travel to their owners as FP8 bytes with their scales (the
        module docstring); settable, True only for a row-local recipe."""
        return self._fp8_dispatch

    @fp8_dispatch.setter
    def fp8_dispatch(self, value: bool) -> None:
        check_fp8_dispatch(self.recipe, value)
        self._fp8_dispatch = value

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, fp8_dispatch={self.fp8_dispatch}"

    def _owner_experts(self) -> _Float8Owner:
        """A fresh owner for this forward, kept so that :meth:`forward` records its amaxes once
        all chunks ran (its backward reads the scales it took from the run, not from here)."""
        self._owner = _Float8Owner(self)
        return self._owner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The expert-parallel layer's forward, then delayed's history entries of the step."""
        out = super().forward(x)
        self._owner.record()
        return out
