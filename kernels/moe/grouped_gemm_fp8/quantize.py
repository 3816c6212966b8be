"""The FP8 operands of an MoE expert GEMM's three GEMMs, per recipe.

``y[rows of g] = x_g @ w[g]`` (x (T, K), w (G, K, N)) runs three grouped GEMMs in a
training step, each with its own reduction dimension, and a row-wise scale must be
constant along it (it multiplies the fp32 accumulator once, in the epilogue):

========  ======================  ==============================  ===========================
GEMM      reduces over            x-side operand, scale           w-side operand, scale
========  ======================  ==============================  ===========================
forward   K                       x: per token                    w[g]: per (g, output col)
dgrad     N (dx = dy @ w[g]ᵀ)     dy: per token                   w[g]ᵀ: per (g, input row)
wgrad     the group's tokens      xᵀ: per (g, input feature)      dyᵀ: per (g, output feature)
========  ======================  ==============================  ===========================

so w and the output gradient are each quantized twice per step and x twice (the dense
row-wise recipe quantizes x and w once each, with the fused kernel's transposed copy:
:mod:`kernels.fp8.recipes.rowwise`). A token tensor's two (x's forward and wgrad operands, dy's
dgrad and wgrad ones) are made at once where the recipe allows (:func:`token_operands`:
rowwise's in one fused quantization that reads the tensor twice, not four times; the per-tensor
recipes' in one cast with one scale that writes both layouts), and an MoE layer's gate and up share x's; the
two operands of the weights, the forward's and dgrad's, likewise (:func:`weight_operands`). The wgrad scales are
amaxes over each group's tokens only: an expert's gradient is not scaled by another
expert's outliers. ``tensorwise`` takes one scale per tensor (all experts' weights
share one), handed to the kernels broadcast (stride 0); each GEMM still gets its own
copy of the operand in the layout it reads (the same scale), both written by one cast where
the training op makes them together (x, w and dy in a training step), and within one
training op only the first cast of each tensor finds its scale: the op hands the forward's
scales of x and w, and dgrad's of dy, to the backward's other casts (:mod:`.training`; a layer
that calls the op twice on one x, gate and up, hands both x's operands made once). ``delayed``
is tensorwise with the scales of x and w given (``scale``: from an amax history,
:mod:`kernels.fp8.recipes.delayed`, which :class:`kernels.moe.fp8_layer.Float8MoE`
keeps); the output gradient's, whose amax is known only in the backward, is the history's
of dy that the training op's backward reads when the layer hands it one (one scale for both
casts of dy, dgrad's and wgrad's, the first of which returns dy's amax for the history), else
dy's own (current scaling: the training op without a history).

Every function takes the FP8 format to write: e4m3 for x and w, and for the output
gradient dy e4m3 too or, in the hybrid format, the e5m2 of the same family
(:data:`kernels.gemm_fp8.formats.E5M2_OF`; the kernels multiply e4m3 by e5m2). The
operand builders (:func:`tokens`, :func:`forward_weight`, :func:`dgrad_weight`,
:func:`wgrad_operand`) take arguments their caller checked: the training op
(:func:`kernels.moe.grouped_gemm_fp8.grouped_gemm_fp8_train`) validates x, w, the offsets and
a given scale once, at its entry, and they call the dense op's unchecked form
(:func:`kernels.gemm_fp8.quantize.quantize_checked`); :func:`quantize_groups` is this module's
checked entry.

Each operand is written in the layout its GEMM reads fastest: the reduction dimension
contiguous, as FP8 matrix cores take both operands (w (G, N, K)-contiguous for the
forward, (G, K, N) for dgrad; xᵀ and dyᵀ feature-major, token-contiguous, their token
count padded to a multiple of 16 so every feature's row starts 16-byte aligned).
Quantization is memory-bound and runs on every operand of every step, so it runs on fused
kernels where one fits, on the device with no host sync:

* the token operands (the forward's x, dgrad's dy) and dgrad's weight (w as G·K rows of
  N) are dense quantizations, row-wise along their last dimension or per tensor: the
  dense op :func:`kernels.gemm_fp8.quantize` (``row``, ``tensor``; ``delayed``'s given
  scale goes in as ``scale=``, which skips its amax launch), whose rounding gives the
  bits :func:`kernels.gemm_fp8.formats.cast` gives;
* the row-wise wgrad operands, scaled per (group, feature) over each group's tokens, are
  no dense granularity: the grouped kernels of :mod:`.quantize_kernel` (amax launches,
  then one cast and transposed copy; :func:`quantize_groups`), bit for bit the plain
  passes they replaced (:mod:`.quantize_ref`);
* the forward's weight (per expert and output column along K, or per tensor, written
  K-contiguous: each expert's transposed copy, which no 2-D view of w gives the dense
  op) is the same kernels' problem with each expert a batch entry of one group of K
  tokens;
* the per-tensor recipes' wgrad operands and forward weight (the padded token-contiguous
  copy, each expert's transposed copy) take the grouped cast with one scale: the dense
  op's per-tensor amax launch first where no earlier cast found it (``tensorwise``'s forward
  weight), or nothing before it (a scale an earlier cast of the tensor found, or ``delayed``'s
  given scale; the forward's casts of x, hidden and the weights, and the backward's first
  cast of each output gradient, then also return their tiles' maxima, whose max
  :class:`kernels.moe.fp8_layer.Float8MoE` records in the amax history: no torch pass reads
  an operand for it, and the record's launch reduces the maxima); where both of a tensor's
  operands are made at once (:func:`token_operands`, :func:`weight_operands`), that one cast
  also stores its tile row-major: the token operand, or dgrad's weight.

So no operand of the four recipes quantized here is left to plain PyTorch passes: each is
an amax launch (none for a given scale) and one cast launch that writes its layout, on
the device, with no host sync (:mod:`.quantize_ref` keeps the passes they replaced).
``mxfp8``'s operands are :mod:`kernels.moe.grouped_gemm_mxfp8.quantize`'s: its token
operands and dgrad's weight on the dense op's ``mx32``, its forward weight and wgrad
operands (per-expert and per-group-padded copies) on one fused launch each of
:mod:`kernels.moe.grouped_gemm_mxfp8.quantize_kernel` (scales found in the tile, so no amax
launch), so none of its operands is left to plain PyTorch passes either.

``blockwise`` (DeepSeek-V3: 1 x 128 tiles of x and dy, 128 x 128 blocks of w, e4m3) runs
on that fused kernel, :func:`kernels.gemm_fp8.quantize`, in its layouts: scales change
along each reduction, and the kernels apply them per 128-block inside their loops.

========  ==========================================  ======================================
GEMM      x-side operand, scale                       w-side operand, scale
========  ==========================================  ======================================
forward   x: (T, K/128), per token and 128 of K       w[g]: (G, K/128, N/128) per block
dgrad     dy: (T, N/128)                              w[g]ᵀ: (G, N/128, K/128), w's transposed
wgrad     xᵀ: per (128 tokens, input feature)         dyᵀ: per (128 tokens, output feature)
========  ==========================================  ======================================

Each expert's weight is padded with zeros to a multiple of 128 rows (K) before it is cut
into blocks, so no block holds two experts' weights (zeros change no amax); the wgrad
operands' tokens are padded with zeros to a multiple of 16. Each pad is a bf16 copy of the
operand, made only where the size is not a multiple already (a K of 128·n, the usual
model dims, and a T·k of 16·n read the operand in place). The wgrad's
token blocks are counted from token 0, not from each group's start: a block may hold the
tail of one group and the head of the next (or all of a small group), and takes its scale
over all of them (a valid scale for every element in it, so nothing saturates; an outlier of
one expert coarsens its neighbours' tokens only in the blocks that straddle a group
boundary, at most G - 1 of the ceil(T/128)). The alternative, blocks restarting at every
group, would need a per-group quantization pass; counted from 0 they are the layout the
dense transposed quantization writes, and the dW kernel starts each group's reduction at
the 128-aligned token at or below it, masking the other group's tokens (:mod:`.dw`).
"""
from __future__ import annotations

import torch

import torch.nn.functional as F

from ... import eager, validate
from ...gemm_fp8.formats import OPERAND_DTYPES
from ...gemm_fp8.operands import SCALE_K
from ...gemm_fp8.quantize import X_DTYPES, check_scale, quantize as quantize_fused, quantize_checked
from ...triton_support import cdiv
from . import quantize_kernel
from .dw import ALIGN

RECIPES = ("tensorwise", "delayed", "rowwise", "blockwise", "mxfp8")
"""The recipes the FP8 grouped GEMM trains with; ``mxfp8``'s operands and GEMMs are
:mod:`kernels.moe.grouped_gemm_mxfp8`'s (:mod:`.training`)."""
PER_TENSOR = ("tensorwise", "delayed")
"""Recipes of one scale per tensor, which may be given (``scale``) rather than computed."""
TOKEN_GRANULARITY = {"tensorwise": "tensor", "delayed": "tensor", "rowwise": "row", "blockwise": "block1x128",
                     "mxfp8": "mx32"}
"""Each recipe's scale of a token operand (the forward's x and dgrad's dy, along C:
:func:`tokens`; mxfp8's :func:`kernels.moe.grouped_gemm_mxfp8.quantize.tokens`) as a
granularity of the dense fused op :func:`kernels.gemm_fp8.quantize` (and of
:func:`kernels.gemm_fp8.quantize_ref.quantize_one`); for the per-tensor recipes and rowwise
also dgrad's weight's (w as G·K rows, along N: :func:`dgrad_weight`)."""
ROW_LOCAL = {recipe: granularity for recipe, granularity in TOKEN_GRANULARITY.items() if recipe not in PER_TENSOR}
"""The recipes whose token operand is scaled from each token's own elements only, with its
granularity: a token quantizes to the same bytes whichever rows surround it, so it may be
quantized before it is sent (:mod:`kernels.moe.ep_fp8_layer`). The per-tensor recipes' scale
depends on every row."""


def check_recipe(recipe: str) -> None:
    if recipe not in RECIPES:
        raise ValueError(f"the FP8 grouped GEMM trains with the recipes {', '.join(RECIPES)}; "
                         f"got {recipe!r}")


def _quantize_groups_impl(t: torch.Tensor, offsets: torch.Tensor, fp8: torch.dtype,
                          scale: torch.Tensor | None = None, per_tensor: bool = False,
                          amax: bool = False, rows: bool = False) -> list[torch.Tensor]:
    # t (B, T, C): B problems, grouped alike
    return list(quantize_kernel.launch(t, offsets, fp8, scale, per_tensor, amax, rows))


_quantize_groups = torch.library.custom_op("kernels::grouped_quantize_fp8", _quantize_groups_impl,
                                           mutates_args=())


@_quantize_groups.register_fake
def _(t, offsets, fp8, scale=None, per_tensor=False, amax=False, rows=False):
    batch, tokens, cols = t.shape
    q = t.new_empty((batch, cols, cdiv(tokens, ALIGN) * ALIGN), dtype=fp8)
    # and the row-wise quantization: its scales per token, or none with one scale
    row_wise = [t.new_empty((batch, tokens, cols), dtype=fp8)] if rows else []
    if scale is not None:   # a given scale is not returned; with amax, the cast's tile maxima are
        return [q, t.new_empty(quantize_kernel.tile_maxima_shape(batch, tokens, cols, offsets.shape[0]),
                               dtype=torch.float32), *row_wise] if amax else [q, *row_wise]
    if rows and not per_tensor:
        row_wise.append(t.new_empty((batch, tokens), dtype=torch.float32))
    return [q, t.new_empty(() if per_tensor else (batch, offsets.shape[0], cols), dtype=torch.float32), *row_wise]


def _grouped(t: torch.Tensor, offsets: torch.Tensor, fp8: torch.dtype, scale: torch.Tensor | None = None,
             per_tensor: bool = False, amax: bool = False, rows: bool = False) -> tuple[torch.Tensor, ...]:
    """The grouped kernels on t (B, T, C), through the custom op wherever anything traces:
    (q (B, C, R), scale (B, G, C); per-tensor: 0-d, the given one if given, checked by the
    caller's public entry; with a given scale and ``amax``, the cast's tile maxima after them,
    whose max is t's amax; ``rows``: t's row-wise quantization after them, q_rows (B, T, C) and
    (per group) row scales (B, T); with one scale, q_rows alone, the same bytes row-major)."""
    t, offsets = t.detach(), offsets.contiguous()   # the kernels read offsets as a flat array
    impl = _quantize_groups_impl if eager.direct(t, offsets) else _quantize_groups
    if scale is None:
        return tuple(impl(t, offsets, fp8, None, per_tensor, False, rows))
    scale = scale.reshape(())
    q, *found = impl(t, offsets, fp8, scale, True, amax, rows)
    return (q, scale, *found)


def tokens(x: torch.Tensor, recipe: str, fp8: torch.dtype, scale: torch.Tensor | None = None,
           amax: bool = False) -> tuple[torch.Tensor, ...]:
    """The forward's x or dgrad's dy (T, C): (fp8 (T, C), scale (T,)), scaled along C;
    blockwise: scale (T, ceil(C/128)), per token and 128 of C. ``amax`` (a given scale):
    the cast's tile maxima after them, whose max is x's amax
    (:func:`kernels.gemm_fp8.quantize.quantize_checked`)."""
    q, scale, *found = quantize_checked(x.detach(), TOKEN_GRANULARITY[recipe], fp8, scale=scale, amax=amax)
    if recipe == "blockwise":
        return q, scale
    return q, scale.expand(x.shape[0], 1).reshape(x.shape[0]), *found   # (T, 1) or () to (T,)


def _zero_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` (..., R, C) with zero rows appended up to ``rows``: a copy, or ``t`` itself when it
    has them all (``F.pad`` copies even with nothing to add: a pass over the tensor for nothing)."""
    return t if t.shape[-2] == rows else F.pad(t, (0, 0, 0, rows - t.shape[-2]))


def _expert_blocks(w: torch.Tensor, fp8: torch.dtype, k_contiguous: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Each expert's w[g] (K, N) in 128 x 128 blocks: (fp8 (G, K, N), K- or N-contiguous;
    scale (G, ceil(K/128), ceil(N/128))). The experts are stacked into one (G Kp, N) matrix,
    each padded with zeros to Kp = a multiple of 128 rows so no block holds two experts
    (a view of a contiguous w where K is one already), and quantized in one pass (its
    transpose, for the K-contiguous copy)."""
    g, k, n = w.shape
    kp = cdiv(k, SCALE_K) * SCALE_K
    stacked = _zero_rows(w.detach(), kp).reshape(g * kp, n)
    if k_contiguous:
        q, scale = quantize_fused(stacked.t(), "block128x128", fp8)          # (N, G Kp)
        return (q.view(n, g, kp).permute(1, 2, 0)[:, :k],
                scale.view(scale.shape[0], g, kp // SCALE_K).permute(1, 2, 0))
    q, scale = quantize_fused(stacked, "block128x128", fp8)                   # (G Kp, N)
    return q.view(g, kp, n)[:, :k], scale.view(g, kp // SCALE_K, scale.shape[1])


def forward_weight(w: torch.Tensor, recipe: str, fp8: torch.dtype, scale: torch.Tensor | None = None,
                   amax: bool = False) -> tuple[torch.Tensor, ...]:
    """w (G, K, N) for the forward: (fp8 (G, K, N) stored K-contiguous, scale (G, N)), along K
    (per tensor: the one scale, expanded), each column's K run padded to a multiple of 16 so
    it starts 16-byte aligned; blockwise: scale (G, ceil(K/128), ceil(N/128)), unpadded.
    ``amax`` (a given scale): the cast's tile maxima after them, whose max is w's amax."""
    if recipe == "blockwise":
        return _expert_blocks(w, fp8, k_contiguous=True)
    # each expert one group of K tokens: the grouped kernels' transposed copy (G, N, K padded to 16)
    g, k, n = w.shape
    one_group = torch.full((1,), k, dtype=torch.int32, device=w.device)
    q, scale, *found = _grouped(w, one_group, fp8, scale, recipe in PER_TENSOR, amax)
    return q[:, :, :k].transpose(1, 2), scale.expand(g, 1, n)[:, 0], *found     # scale (G, 1, N) or ()


def dgrad_weight(w: torch.Tensor, recipe: str, fp8: torch.dtype, scale: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """w (G, K, N) for dx = dy @ w[g]ᵀ: (w[g]ᵀ as fp8 (G, N, K), a view of a contiguous
    (G, K, N), so N-contiguous; scale (G, K)), along N; blockwise: the scales of w[g]'s
    128 x 128 blocks, transposed with it: (G, ceil(N/128), ceil(K/128))."""
    if recipe == "blockwise":
        q, scale = _expert_blocks(w, fp8, k_contiguous=False)
        return q.transpose(1, 2), scale.transpose(1, 2)
    g, k, n = w.shape   # w as G·K rows of N: row-wise along N is the dense op's "row"
    q, scale = quantize_checked(w.detach().reshape(g * k, n), TOKEN_GRANULARITY[recipe], fp8, scale=scale)
    return q.view(g, k, n).transpose(1, 2), scale.expand(g * k, 1).reshape(g, k)


SHARED_WEIGHTS = ("rowwise", *PER_TENSOR)
"""The recipes whose weight operands :func:`weight_operands` makes at once."""


def weight_operands(w: torch.Tensor, recipe: str, fp8: torch.dtype, scale: torch.Tensor | None = None,
                    amax: bool = False) -> tuple[torch.Tensor, ...]:
    """Both FP8 operands of the experts' weights w (G, K, N) under a recipe of :data:`SHARED_WEIGHTS`:
    (w8, sw: :func:`forward_weight`'s; wt8, swt: :func:`dgrad_weight`'s), bit for bit theirs, from one
    fused quantization, each expert a problem of K tokens in one group (the grouped kernels with
    ``rows``). rowwise: per (expert, column) along K for the forward, per (expert, row) along N for
    dgrad (w read twice, in four launches, where the two took four reads and six launches); the
    per-tensor recipes: one cast with ``scale`` (delayed's, from its history; or tensorwise's, found
    first by the dense op's amax pass where none is given) writes both layouts (w read once where
    the two casts read it twice; ``amax``, a given scale: the cast's tile maxima after them). What
    the training op makes in the forward where dx is wanted, keeping wt8 (one byte a weight) for the
    backward (:func:`.training.grouped_gemm_fp8_train`)."""
    g, k, n = w.shape
    one_group = torch.full((1,), k, dtype=torch.int32, device=w.device)
    if recipe == "rowwise":
        q, scale, q_rows, row_scales = _grouped(w, one_group, fp8, rows=True)
        return q[:, :, :k].transpose(1, 2), scale[:, 0], q_rows.transpose(1, 2), row_scales
    if recipe not in PER_TENSOR:
        raise ValueError(f"weight_operands makes both operands at once under {', '.join(SHARED_WEIGHTS)}, "
                         f"not {recipe!r}")
    q, one, *found, q_rows = _grouped(w, one_group, fp8, scale, True, amax, rows=True)
    return q[:, :, :k].transpose(1, 2), one.expand(g, n), q_rows.transpose(1, 2), one.expand(g, k), *found


def group_of_rows(offsets: torch.Tensor, rows: int) -> torch.Tensor:
    """The group of each of ``rows`` rows (int64, on the device); rows past the last end
    count to the last group (no kernel reads them)."""
    ids = torch.searchsorted(offsets, torch.arange(rows, dtype=offsets.dtype, device=offsets.device),
                             right=True)
    return ids.clamp_(max=max(offsets.shape[0] - 1, 0))


def quantize_groups(t: torch.Tensor, offsets: torch.Tensor, fp8: torch.dtype, scale: torch.Tensor | None = None,
                    per_tensor: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The row-wise wgrad operand of t (T, C), tokens grouped by int32 ``offsets`` (G,) of
    group ends: (fp8 (C, R) token-contiguous, R = T padded with zeros to a multiple of 16;
    scale (G, C), per group and feature), by the kernels of :mod:`.quantize_kernel` (no
    host sync). ``per_tensor``: one scale for all of t (0-d), or ``scale`` if given (float32,
    one number), with the same cast and transposed copy. A custom op with a fake
    (``kernels::grouped_quantize_fp8``), so the training op's backward traces under
    ``torch.compile`` without a graph break."""
    validate.tensor("t", t, ndim=2, dtypes=X_DTYPES, allow_empty=True)
    offsets = validate.index("offsets", offsets, ndim=1, dtypes=(torch.int32,))
    validate.same_device(t=t, offsets=offsets)
    if fp8 not in OPERAND_DTYPES:
        raise TypeError(f"fp8 must be one of {OPERAND_DTYPES}, got {fp8}")
    if t.shape[0] and not offsets.shape[0]:
        raise ValueError(f"t has {t.shape[0]} tokens but offsets no groups to put them in")
    if scale is not None:
        check_scale("scale", scale, t)
    return _groups(t, offsets, fp8, scale, per_tensor)


def _groups(t, offsets, fp8, scale, per_tensor, amax: bool = False) -> tuple[torch.Tensor, ...]:
    """:func:`quantize_groups` on checked arguments (``amax``: and the tile maxima of the cast
    with the given ``scale``, whose max is t's amax)."""
    q, scale, *found = _grouped(t[None], offsets, fp8, scale, per_tensor, amax)
    return q[0], scale if scale.dim() == 0 else scale[0], *found


SHARED_OPERANDS = ("rowwise", "tensorwise", "delayed")
"""The recipes whose token operands :func:`token_operands` makes at once: the forward's or dgrad's
and wgrad's of one tensor (x, or an output gradient), which the expert GEMMs that read it share."""


def token_operands(t: torch.Tensor, offsets: torch.Tensor, recipe: str, fp8: torch.dtype,
                   scale: torch.Tensor | None = None, amax: bool = False) -> tuple[torch.Tensor, ...]:
    """Both FP8 operands of t (T, C), the routed rows x or an output gradient dy, that a training
    step's GEMMs read: (t8 (T, C), st (T,): :func:`tokens`'s, the forward's or dgrad's; tt8 (C, R),
    stt (G, C): :func:`wgrad_operand`'s), bit for bit theirs, for a recipe of
    :data:`SHARED_OPERANDS`. rowwise: one fused quantization (the grouped kernels with ``rows``:
    t read twice, in four launches, where the two took four reads and six launches); the
    per-tensor recipes: one cast with one scale that writes both layouts (the grouped cast with
    ``rows``), ``scale`` (delayed's, from its history: t read once, where two casts read it
    twice) or tensorwise's, found by the dense op's amax pass first (two reads, not three);
    ``amax`` (a given scale): and the cast's tile maxima after them, whose max is t's amax (what
    delayed records).
    So gate's and up's GEMMs, which read the same x, quantize it once between them and save its
    wgrad operand for the backward instead of x (:func:`.training.grouped_gemm_fp8_train`'s
    ``x_operands``)."""
    if recipe not in SHARED_OPERANDS:
        raise ValueError(f"token_operands makes both operands at once under {', '.join(SHARED_OPERANDS)}, "
                         f"not {recipe!r}")
    if t.shape[0] and not offsets.shape[0]:
        raise ValueError(f"t has {t.shape[0]} tokens but offsets no groups to put them in")
    if amax and scale is None:
        raise ValueError("amax returns the tile maxima of a cast with a given per-tensor scale: pass scale")
    if recipe in PER_TENSOR:   # one problem; both layouts of one cast
        tt8, one, *found, t8 = _grouped(t[None], offsets, fp8, scale, True, amax, rows=True)
        tt8, t8 = (a.view(a.shape[1:]) for a in (tt8, t8))
        return t8, one.expand(t.shape[0]), tt8, one.expand(offsets.shape[0], t.shape[1]), *found
    tt8, stt, t8, st = (a.view(a.shape[1:]) for a in _grouped(t[None], offsets, fp8, rows=True))   # one problem
    return t8, st, tt8, stt


def wgrad_operand(t: torch.Tensor, offsets: torch.Tensor, recipe: str, fp8: torch.dtype,
                  scale: torch.Tensor | None = None, amax: bool = False) -> tuple[torch.Tensor, ...]:
    """x or dy (T, C) for dw[g] = x_gᵀ · dy_g, tokens grouped by int32 ``offsets`` (G,):
    (fp8 (C, R) token-contiguous, R = T padded to a multiple of 16 with zeros, scale (G, C));
    rowwise scales each feature by its amax over the group's tokens (:func:`quantize_groups`).
    blockwise: scale (ceil(R/128), C), per 128 tokens counted from token 0 and feature (the
    dW kernel's ``scale_block``), groups ignored. ``amax`` (a given per-tensor scale): the cast's
    tile maxima after them, whose max is t's amax (delayed's dy, when dgrad's cast does not run)."""
    rows, cols = t.shape
    if recipe == "blockwise":
        padded = _zero_rows(t.detach(), cdiv(rows, ALIGN) * ALIGN)
        q, scale = quantize_fused(padded.t(), "block1x128", fp8)    # (C, R), (C, R/128)
        return q, scale.t().contiguous()   # feature-contiguous: a tile's scales load as vectors
    q, scale, *found = _groups(t, offsets, fp8, scale, recipe in PER_TENSOR, amax)
    return q, scale.expand(offsets.shape[0], cols), *found
