"""The FP8 grouped GEMM as a training op: ``grouped_gemm_fp8_train(x, w, offsets, recipe, ...)``.

High-precision x (T, K) and expert weights w (G, K, N) in, ``x_g @ w[g]`` per group out
(in x's dtype), with the forward and both gradients computed by FP8 grouped GEMMs under
an FP8 training recipe (:data:`.quantize.RECIPES`): the MoE experts' GEMMs of
:func:`kernels.fp8.convert`. Per expert GEMM a training step runs three grouped
launches, each on operands quantized along its own reduction dimension
(:mod:`.quantize`):

* forward: the FP8 grouped GEMM (``kernels::grouped_gemm_fp8``, its best rung);
* dx = dy @ w[g]ᵀ: the same kernel on w[g]ᵀ (a stride view of the dgrad copy of w);
* dw[g] = x_gᵀ · dy_g: the FP8 dW kernel (:mod:`.dw`, ``kernels::grouped_gemm_fp8_dw``),
  whose reduction runs over each group's tokens (zero for an empty group).

So one backward is two grouped launches. x and w are saved in high precision and quantized again
by the backward in the orientation its GEMMs need, except where their FP8 operands were made in the
forward. Under rowwise, when w's gradient is wanted, one fused quantization gives both of x's
operands (:func:`.quantize.token_operands`: x read twice where two quantizations read it four
times) and the op saves the wgrad operand (one byte an element) instead of x; when x's is wanted,
one gives both of w's (:func:`.quantize.weight_operands`) and the op holds the dgrad one (one byte a
weight) to the backward; dy's two come from one fused quantization in the backward. So a rowwise
step of the op is 15 launches, not 21. The per-tensor recipes do the same for x, w and dy with one
cast each that writes both layouts (each tensor read once after its amax pass, where two casts read it
twice). A caller that reads one x in several GEMMs (an MoE layer's gate and up) hands them x's
operands made once (``x_operands``; rowwise, tensorwise or delayed).
(The dense FP8 linear, :mod:`kernels.fp8.linear`, keeps the forward's FP8 operands and quantizes
only dy.) The output gradient dy goes into ``grad_dtype``: e4m3 like x and w, or the e5m2 of their
family (the hybrid format, the per-tensor recipes' default in :mod:`kernels.fp8.recipe`); both kernels multiply e4m3 by
e5m2 on the mixed-format FP8 MFMAs. Per-tensor recipes take x's and w's scales from the caller
(``scale_x``, ``scale_w``: delayed scaling's, from an amax history that
:class:`kernels.moe.fp8_layer.Float8MoE` keeps) or, tensorwise, find them in the forward's casts;
the backward quantizes x and w again with the same scales. dy's scale, one for its two casts, is its
current amax's, or under delayed scaling with ``history_dy`` given that history's, found on the
device; with ``counts`` the backward then records dy's amax, found by the cast, into the history in
place (:func:`gradients`: the layer's buffers, handed to the op and held on its ctx, not saved, as
:mod:`kernels.fp8.linear` holds a Linear's dy history; the op's schema declares no mutated argument,
the writes being the backward's, and ``torch.compile`` keeps them in its backward graph:
tests/test_fp8_moe_delayed_dy.py, under ``aot_eager``). The op is the custom op
``kernels::grouped_gemm_fp8_train`` (returning the output, for ``amax=True`` the tile maxima of x's
and w's casts, whose maxes are their amaxes, and under a per-tensor recipe the scales its casts
found where none was given, which the backward's casts of x and w take rather than finding x's and
w's amaxes again) with a fake implementation and an autograd formula whose backward calls the two
custom ops above, so ``torch.compile(fullgraph=True)`` keeps the forward as one node and traces the
backward without a graph break. dx comes back in x's dtype, dw in w's. No host sync when the offsets
are not checked.
"""
from __future__ import annotations

import torch

from ... import eager, validate
from ...fp8 import recipe as fp8_recipes
from ...fp8.recipes.delayed import HISTORY, history_scale, push_amax
from ...gemm_fp8.formats import E5M2_OF, FP8_DTYPES, OPERAND_DTYPES
from ...gemm_fp8.operands import OUT_DTYPES, SCALE_K, check_family
from ...gemm_fp8.quantize import check_scale
from ...gemm_fp8.quantize_kernel import tile_maxima_shape
from ...triton_support import cdiv
from . import dw as dw_kernel
from . import quantize
from .ops import _grouped_gemm_fp8_impl
from .quantize_kernel import tile_maxima_shape as grouped_tile_maxima_shape


def check_dw(xt, sx, dyt, sdy, offsets, out_dtype, scale_block: int = 0) -> None:
    """xt (K, R) and dyt (N, R) in FP8 formats of one family, float32 sx (G, K) and sdy (G, N)
    (or, for ``scale_block`` = 128, (ceil(R/128), K) and (ceil(R/128), N)), int32 offsets (G,)
    of token ends <= R."""
    validate.tensor("xt", xt, ndim=2, dtypes=OPERAND_DTYPES, allow_empty=True)
    validate.tensor("dyt", dyt, ndim=2, dtypes=OPERAND_DTYPES, allow_empty=True)
    check_family(xt=xt, dyt=dyt)
    offsets = validate.index("offsets", offsets, ndim=1, dtypes=(torch.int32,))
    (k, r), (n, r_dy), g = xt.shape, dyt.shape, offsets.shape[0]
    if r != r_dy:
        raise ValueError(f"xt is {tuple(xt.shape)} (K, tokens) and dyt {tuple(dyt.shape)} (N, tokens): "
                         "the token counts differ")
    if scale_block not in (0, SCALE_K):
        raise ValueError(f"scale_block must be 0 (scales per group) or {SCALE_K} (per {SCALE_K} tokens), "
                         f"got {scale_block}")
    outer, what = (cdiv(r, scale_block), f"{scale_block} tokens") if scale_block else (g, "group")
    for name, scale, shape in (("sx", sx, (outer, k)), ("sdy", sdy, (outer, n))):
        validate.tensor(name, scale, dtypes=(torch.float32,), allow_empty=True)
        if tuple(scale.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(scale.shape)}; expected {shape}, one per {what} "
                             "and feature")
    validate.same_device(xt=xt, sx=sx, dyt=dyt, sdy=sdy, offsets=offsets)
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be one of {OUT_DTYPES}, got {out_dtype}")


@torch.library.custom_op("kernels::grouped_gemm_fp8_dw", mutates_args=())
def _grouped_gemm_fp8_dw(xt: torch.Tensor, sx: torch.Tensor, dyt: torch.Tensor, sdy: torch.Tensor,
                         offsets: torch.Tensor, out_dtype: torch.dtype, scale_block: int = 0) -> torch.Tensor:
    if xt.numel() == 0 or dyt.numel() == 0 or offsets.numel() == 0:
        return torch.zeros((offsets.shape[0], xt.shape[0], dyt.shape[0]), dtype=out_dtype,
                           device=xt.device)
    return dw_kernel.grouped_dw_fp8(xt, sx, dyt, sdy, offsets.contiguous(), out_dtype, scale_block)


@_grouped_gemm_fp8_dw.register_fake
def _(xt, sx, dyt, sdy, offsets, out_dtype, scale_block=0):
    return xt.new_empty((offsets.shape[0], xt.shape[0], dyt.shape[0]), dtype=out_dtype)


def grouped_gemm_fp8_dw(xt: torch.Tensor, sx: torch.Tensor, dyt: torch.Tensor, sdy: torch.Tensor,
                        offsets: torch.Tensor, out_dtype: torch.dtype = torch.float32,
                        scale_block: int = 0) -> torch.Tensor:
    """dw (G, K, N) with dw[g] = (xt[:, tokens of g] * sx[g, :, None]) @ (dyt[:, tokens of g] * sdy[g, :, None])ᵀ,
    fp32 accumulation: the FP8 weight gradient of an expert GEMM (:mod:`.dw`).

    Operands as :func:`.quantize.wgrad_operand` writes them: xt (K, R) and dyt (N, R)
    feature-major, R >= offsets[-1] tokens (the columns past it are ignored), scales
    float32 (G, K) and (G, N). An empty group's dw is zero. ``scale_block`` = 128: the
    blockwise recipe's scales instead, sx (ceil(R/128), K) and sdy (ceil(R/128), N), one per
    128 tokens counted from token 0 (a block may straddle two groups) and feature, applied
    per block inside the reduction.
    """
    check_dw(xt, sx, dyt, sdy, offsets, out_dtype, scale_block)
    return _grouped_gemm_fp8_dw(xt, sx, dyt, sdy, offsets, out_dtype, scale_block)


def _mx():
    """The MXFP8 recipe's quantizer, forward and gradients (:mod:`kernels.moe.grouped_gemm_mxfp8.training`),
    imported on first use: that package imports this one's :mod:`.quantize`, so a module-level
    import would be a cycle."""
    from ..grouped_gemm_mxfp8 import training
    return training


def token_operand(x: torch.Tensor, recipe: str, fp8: torch.dtype, scale_x: torch.Tensor | None = None,
                  amax: bool = False, scale_rule: str | None = None) -> tuple[torch.Tensor, ...]:
    """The forward's x (T, K) as ``recipe`` quantizes it: (fp8, scales) (:func:`.quantize.tokens`,
    mxfp8's :func:`kernels.moe.grouped_gemm_mxfp8.training.tokens`, by the e8m0 ``scale_rule``,
    None for the recipe's default); ``amax`` (a given ``scale_x``): and the cast's tile maxima, whose
    max is x's amax."""
    if recipe == "mxfp8":
        return _mx().tokens(x, fp8, fp8_recipes.get(recipe).chosen_scale_rule(scale_rule))
    return quantize.tokens(x, recipe, fp8, scale_x, amax)


def forward_of_operand(x8: torch.Tensor, sx: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor,
                       recipe: str, fp8: torch.dtype, out_dtype: torch.dtype,
                       scale_w: torch.Tensor | None = None, amax: bool = False,
                       scale_rule: str | None = None) -> tuple[torch.Tensor | None, ...]:
    """``(y, w's scales)``, y = ``x_g @ w[g]`` in ``out_dtype``, from x already quantized by
    :func:`token_operand`: w quantized for the forward (by ``scale_rule`` as there; its scales as
    :func:`.quantize.forward_weight` gives them, None for mxfp8), one grouped launch; ``amax`` (a
    given ``scale_w``): and the cast's tile maxima, whose max is w's amax. Unchecked (the
    expert-parallel layer's owners, :mod:`kernels.moe.ep_fp8_layer`, receive x quantized by its sender)."""
    if recipe == "mxfp8":
        rule = fp8_recipes.get(recipe).chosen_scale_rule(scale_rule)
        return _mx().forward(x8, sx, w, offsets, fp8, out_dtype, rule), None
    w8, sw, *found = quantize.forward_weight(w, recipe, fp8, scale_w, amax)
    return _grouped_gemm_fp8_impl(x8, sx, w8, sw, offsets, out_dtype), sw, *found


def _train_impl(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, recipe: str,
                fp8_dtype: torch.dtype, grad_dtype: torch.dtype, scale_x: torch.Tensor | None,
                scale_w: torch.Tensor | None, x_operands: list[torch.Tensor], w_operands: list[torch.Tensor],
                amax_x: bool = False, amax_w: bool = False,
                history_dy: torch.Tensor | None = None, counts: torch.Tensor | None = None, count_index: int = 0,
                scale_rule: str | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # history_dy and counts are the backward's (:func:`gradients`); the forward does not touch them
    if x_operands:   # x quantized already, both ways (quantize.token_operands): the forward's
        (x8, sx, *_), found_x = x_operands, []
    else:
        x8, sx, *found_x = token_operand(x, recipe, fp8_dtype, scale_x, amax_x, scale_rule)
    if w_operands:   # w quantized already, both ways (quantize.weight_operands): the forward's
        (w8, sw, *_), found_w = w_operands, []
        y = _grouped_gemm_fp8_impl(x8, sx, w8, sw, offsets, x.dtype)
    else:
        y, sw, *found_w = forward_of_operand(x8, sx, w, offsets, recipe, fp8_dtype, x.dtype, scale_w, amax_w,
                                             scale_rule)
    maxima = (*(found_x or [_nothing(x)]), *(found_w or [_nothing(x)]))   # one each: outputs may not alias
    # the per-tensor scales the casts found, for the backward's casts of x and w; a given scale is an
    # empty placeholder (an output may not alias an input), which the backward takes from the inputs
    # (x's or w's that came with its operands: the backward takes its wgrad or dgrad operand, not a scale)
    return y, *maxima, *(_one_scale(s, x) if _finds(recipe, given) else _nothing(x)
                         for s, given in ((sx, scale_x if not x_operands else sx),
                                          (sw, scale_w if not w_operands else sw)))


def _finds(recipe: str, given: torch.Tensor | None) -> bool:
    """Whether the forward's cast of an operand finds a per-tensor scale the backward's can take."""
    return given is None and recipe in quantize.PER_TENSOR


def _nothing(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(0, dtype=torch.float32)


def _one_scale(scale: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The one number behind a per-tensor scale expanded over an operand's rows or columns, (1,) (a
    view of the cast's own scale), or nothing where the operand has no elements."""
    return scale.reshape(-1)[:1] if scale.numel() else _nothing(x)


_train = torch.library.custom_op("kernels::grouped_gemm_fp8_train", _train_impl, mutates_args=())


@_train.register_fake
def _(x, w, offsets, recipe, fp8_dtype, grad_dtype, scale_x, scale_w, x_operands, w_operands, amax_x=False,
      amax_w=False, history_dy=None, counts=None, count_index=0, scale_rule=None):
    (t, k), (g, _, n) = x.shape, w.shape
    # the tile maxima of the casts of x (dense, tile_maxima_shape) and of w (each expert a batch entry of one group)
    maxima = (tile_maxima_shape(t, k) if amax_x else (0,), grouped_tile_maxima_shape(g, k, n, 1) if amax_w else (0,))
    # the scales the casts found (_one_scale's): x's over its T rows, w's over its (G, N)
    scales = [(min(count, 1) if _finds(recipe, given) else 0,)
              for count, given in ((t, scale_x if not x_operands else x_operands[1]),
                                   (g * n, scale_w if not w_operands else w_operands[1]))]
    return x.new_empty((t, n)), *(x.new_empty(shape, dtype=torch.float32) for shape in (*maxima, *scales))


def _setup(ctx, inputs, output):
    (x, w, offsets, recipe, fp8_dtype, grad_dtype, scale_x, scale_w, x_operands, w_operands, _, _, history_dy, counts,
     count_index, rule) = inputs
    ctx.mark_non_differentiable(*output[1:])
    # the per-tensor scales the forward's casts found (none given): the backward's casts of x and w
    # take them instead of finding x's and w's amaxes again
    scale_x = output[3] if scale_x is None and output[3].numel() else scale_x
    scale_w = output[4] if scale_w is None and output[4].numel() else scale_w
    # the backward reads dy alone: no zeros made for the tile maxima, which take no gradient
    ctx.set_materialize_grads(False)
    ctx.recipe, ctx.fp8_dtype, ctx.grad_dtype, ctx.scale_rule = recipe, fp8_dtype, grad_dtype, rule
    # x's wgrad operand where it came quantized (one FP8 byte an element, shared by the GEMMs that read
    # x), else x itself, which the backward quantizes
    ctx.x_dtype, ctx.operands = x.dtype, (len(x_operands), len(w_operands))
    # and w's dgrad operand where it came quantized (one byte a weight, held to the backward)
    ctx.save_for_backward(*(x_operands[2:] if x_operands else (x,)), *w_operands[2:], w, offsets, scale_x, scale_w)
    # dy's delayed state, held as it is (not saved: the layer's forward records into the same
    # counts after this op, which would trip a saved tensor's version check); the backward writes it
    ctx.grad_state = (history_dy, counts, count_index)


def gradients(x, w, offsets, dy, recipe: str, fp8: torch.dtype, grad: torch.dtype, needs,
              scale_x: torch.Tensor | None = None, scale_w: torch.Tensor | None = None,
              history_dy: torch.Tensor | None = None, counts: torch.Tensor | None = None,
              count_index: int = 0, scale_rule: str | None = None, dx_dtype: torch.dtype | None = None,
              w_dgrad: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple:
    """(dx, dw) of ``x_g @ w[g]`` for the output gradient dy (quantized to ``grad``, x and w to
    ``fp8``, with the given per-tensor scales if any), each None where ``needs`` says False:
    one FP8 grouped launch each. ``x``: high-precision, or (not ``"mxfp8"``) its wgrad operand
    already, the pair :func:`.quantize.wgrad_operand` returns (what GEMMs that read one x share:
    gate's and up's), with ``dx_dtype`` dx's dtype, x's. Under rowwise, tensorwise and delayed, when
    both gradients are wanted, dy's two operands come from one fused quantization
    (:func:`.quantize.token_operands`). ``w_dgrad``: w's dgrad operand made already (the pair
    :func:`.quantize.dgrad_weight` returns). Under a per-tensor recipe dy's two operands (dgrad's
    token operand, wgrad's grouped one) take one per-tensor scale: dy's current amax's (one amax
    pass over dy, then one cast for both, or where only one is wanted that one's cast), or with
    ``history_dy`` (delayed) that history's (:func:`kernels.fp8.recipes.delayed.history_scale`, on
    the device), and then, with ``counts`` (training mode), the amax the first cast found enters
    ``history_dy`` and a saturating step adds 1 to ``counts[count_index]``
    (:func:`~kernels.fp8.recipes.delayed.push_amax`).
    ``scale_rule``: mxfp8's e8m0 rule, as :func:`token_operand` takes it."""
    if recipe == "mxfp8":
        return _mx().gradients(x, w, offsets, dy, fp8, needs, fp8_recipes.get(recipe).chosen_scale_rule(scale_rule))
    dx = dw = None
    scale_dy = None if history_dy is None else history_scale(history_dy, dy, grad)
    found = []   # dy's amax, from the first cast, where it is recorded (counts given)
    # both of dy's operands from one fused quantization where both are wanted (its tile maxima after them)
    fused = (quantize.token_operands(dy, offsets, recipe, grad, scale_dy, amax=counts is not None)
             if all(needs[:2]) and recipe in quantize.SHARED_OPERANDS else ())
    found = list(fused[4:])   # dy's tile maxima, from its first cast, where they are recorded (counts given)
    if needs[0]:
        dy8, sdy, *more = fused[:2] or quantize.tokens(dy, recipe, grad, scale_dy, amax=counts is not None)
        found += more
        if _finds(recipe, scale_dy) and sdy.numel():
            scale_dy = _one_scale(sdy, dy)   # its current scale, for the wgrad cast too: one amax pass over dy
        wt8, swt = w_dgrad or quantize.dgrad_weight(w, recipe, fp8, scale_w)
        dx = torch.ops.kernels.grouped_gemm_fp8(dy8, sdy, wt8, swt, offsets, dx_dtype or x.dtype)
    if needs[1]:
        xt8, sxt = x if isinstance(x, tuple) else quantize.wgrad_operand(x, offsets, recipe, fp8, scale_x)
        dyt8, sdyt, *more = fused[2:4] or quantize.wgrad_operand(dy, offsets, recipe, grad, scale_dy,
                                                                  amax=counts is not None and not found)
        found += more
        dw = torch.ops.kernels.grouped_gemm_fp8_dw(xt8, sxt, dyt8, sdyt, offsets, w.dtype,
                                                   SCALE_K if recipe == "blockwise" else 0)
    if counts is not None and found:
        push_amax(history_dy, counts, count_index, found[0], scale_dy, grad)
    return dx, dw


def _backward(ctx, dy, *_):
    *saved, w, offsets, scale_x, scale_w = ctx.saved_tensors
    n_x, n_w = ctx.operands
    x, w_dgrad = (tuple(saved[:2]), saved[2:]) if n_x else (saved[0], saved[1:])
    dx, dw = gradients(x, w, offsets, dy, ctx.recipe, ctx.fp8_dtype, ctx.grad_dtype, ctx.needs_input_grad, scale_x,
                       scale_w, *ctx.grad_state, ctx.scale_rule, ctx.x_dtype, tuple(w_dgrad) or None)
    # none for offsets .. scale_w, x_operands and w_operands (lists of as many) and the arguments after them
    # that the call passed (the dispatcher drops trailing ones equal to their defaults; needs_input_grad has
    # one per argument passed, a list's a list): torch checks that the structure matches
    return dx, dw, *[None] * 6, [None] * n_x, [None] * n_w, *[None] * (len(ctx.needs_input_grad) - 10)


_train.register_autograd(_backward, setup_context=_setup)

IN_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_scale(name: str, scale: torch.Tensor | None, recipe: str, x: torch.Tensor) -> None:
    if scale is None:
        if recipe == "delayed":
            raise ValueError(f"recipe 'delayed' takes x's and w's scales from an amax history: pass "
                             f"{name} (kernels.moe.fp8_layer.Float8MoE keeps the histories)")
        return
    if recipe not in quantize.PER_TENSOR:
        raise ValueError(f"{name} is a per-tensor scale, for the recipes {', '.join(quantize.PER_TENSOR)}; "
                         f"recipe {recipe!r} computes its own")
    check_scale(name, scale, x)


def _check_grad_state(history_dy, counts, count_index: int, recipe: str, x: torch.Tensor) -> None:
    """``history_dy`` a float32 (HISTORY,) amax history under ``"delayed"`` (or None); ``counts``
    only with it, int64 (n,), n > ``count_index`` >= 0; both on x's device."""
    if history_dy is None:
        if counts is not None:
            raise ValueError("counts are where the backward counts dy's saturation against history_dy: pass both")
        return
    if recipe != "delayed":
        raise ValueError(f"history_dy is delayed scaling's amax history of dy; recipe {recipe!r} keeps none")
    validate.tensor("history_dy", history_dy, ndim=1, dtypes=(torch.float32,))
    if history_dy.shape[0] != HISTORY:
        raise ValueError(f"history_dy has {history_dy.shape[0]} entries; expected {HISTORY}")
    validate.same_device(x=x, history_dy=history_dy)
    if counts is not None:
        validate.tensor("counts", counts, ndim=1, dtypes=(torch.int64,))
        validate.same_device(x=x, counts=counts)
        if not 0 <= count_index < counts.shape[0]:
            raise ValueError(f"count_index {count_index} is not an index of counts {tuple(counts.shape)}")


def _check_x_operands(x_operands, x: torch.Tensor, offsets: torch.Tensor, recipe: str, fp8: torch.dtype,
                      amax_x: bool) -> None:
    """``x_operands`` is what :func:`.quantize.token_operands` returns for x: four tensors, the token
    operand of x's shape in ``fp8`` and its scales (T,), the wgrad operand (K, R), R = T padded to a
    multiple of 16, and its scales (G, K), on x's device, under a recipe that shares them (and no x
    amax wanted: the casts that return it are the op's own)."""
    if recipe not in quantize.SHARED_OPERANDS:
        raise ValueError(f"x_operands are x quantized under {', '.join(quantize.SHARED_OPERANDS)}, "
                         f"not {recipe!r}")
    if amax_x:
        raise ValueError("amax for x returns the maxima of the op's own cast of x: not with x_operands")
    if not (isinstance(x_operands, (tuple, list)) and len(x_operands) == 4
            and all(isinstance(t, torch.Tensor) for t in x_operands)):
        raise TypeError("x_operands must be the four tensors quantize.token_operands returns "
                        "(x8, sx, xt8, sxt)")
    (t, k), g = x.shape, offsets.shape[0]
    want = ((t, k), (t,), (k, cdiv(t, dw_kernel.ALIGN) * dw_kernel.ALIGN), (g, k))
    if [tuple(o.shape) for o in x_operands] != list(want) or {x_operands[0].dtype, x_operands[2].dtype} != {fp8}:
        raise ValueError(f"x_operands do not quantize this x: shapes {[tuple(o.shape) for o in x_operands]} "
                         f"(x8 {x_operands[0].dtype}, xt8 {x_operands[2].dtype}) for x {tuple(x.shape)} in {fp8} "
                         f"and {g} groups: expected {list(want)}")
    validate.same_device(x=x, **{f"x_operands[{i}]": t for i, t in enumerate(x_operands)})


def _amax_flags(amax) -> tuple[bool, bool]:
    """:func:`grouped_gemm_fp8_train`'s ``amax`` as (x's, w's): a bool for both, or a pair of bools."""
    if isinstance(amax, bool):
        return amax, amax
    if not (isinstance(amax, tuple) and len(amax) == 2 and all(isinstance(a, bool) for a in amax)):
        raise TypeError(f"amax must be a bool or a pair of bools (x's, w's), got {amax!r}")
    return amax


def check_formats(recipe: str, fp8_dtype: torch.dtype | None, grad_dtype: torch.dtype | None
                  ) -> tuple[torch.dtype, torch.dtype]:
    """``(fp8_dtype, grad_dtype)`` of :func:`grouped_gemm_fp8_train`, defaults filled in, or a
    clear error for a recipe, format or family it does not take (also where a layer is built,
    :meth:`kernels.moe.fp8_experts.Float8Experts._adopt`, whose expert-parallel owners launch
    the op's parts unchecked)."""
    quantize.check_recipe(recipe)
    fp8_dtype = fp8_recipes.get(recipe).element_format(fp8_dtype)
    if fp8_dtype not in FP8_DTYPES:
        raise TypeError(f"fp8_dtype must be one of {FP8_DTYPES}, got {fp8_dtype}")
    grad_dtype = grad_dtype or fp8_dtype
    if grad_dtype not in (fp8_dtype, E5M2_OF[fp8_dtype]):
        raise TypeError(f"grad_dtype must be {fp8_dtype} or {E5M2_OF[fp8_dtype]} (the formats of "
                        f"fp8_dtype's family), got {grad_dtype}")
    if recipe == "mxfp8" and grad_dtype != fp8_dtype:   # its elements were checked by element_format
        raise TypeError(f"the mxfp8 recipe's output gradients are {fp8_dtype} like its operands, "
                        f"got grad_dtype {grad_dtype}")
    return fp8_dtype, grad_dtype


def grouped_gemm_fp8_train(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, recipe: str = "rowwise",
                           fp8_dtype: torch.dtype | None = None, grad_dtype: torch.dtype | None = None,
                           scale_x: torch.Tensor | None = None, scale_w: torch.Tensor | None = None, *,
                           check_offsets: bool = True, amax: bool | tuple[bool, bool] = False,
                           history_dy: torch.Tensor | None = None,
                           counts: torch.Tensor | None = None, count_index: int = 0,
                           scale_rule: str | None = None, x_operands: tuple[torch.Tensor, ...] | None = None
                           ) -> torch.Tensor:
    """``x (T, K)`` rows grouped by expert, ``w (G, K, N)``, int32 ``offsets (G,)`` of row ends
    -> ``(T, N)`` in x's dtype, differentiable in x and w, every GEMM in FP8 by ``recipe``
    (one of :data:`.quantize.RECIPES`; ``"mxfp8"``: MXFP8 operands and kernels,
    :mod:`kernels.moe.grouped_gemm_mxfp8.training`).

    x and w share one of float32, bfloat16, float16; ``fp8_dtype`` is the e4m3 format of x
    and w (default this GPU's, :func:`kernels.gemm_fp8.fp8_dtype`; for ``"mxfp8"`` OCP
    float8_e4m3fn, the only one it takes), ``grad_dtype`` the output gradient's: ``fp8_dtype``
    (the default) or the e5m2 of its family (hybrid; not for ``"mxfp8"``); a format of
    another family is refused. ``scale_x``, ``scale_w``: float32 per-tensor scales (one
    number each, dequantization scales as :func:`kernels.gemm_fp8.quantize_fp8` returns)
    for a per-tensor recipe; ``"delayed"`` requires them, ``"tensorwise"`` computes its own
    when they are None. ``check_offsets`` as in :func:`kernels.grouped_gemm`. Empty operands
    and empty groups are legal (zeros, and zero gradients for an empty group's expert).
    ``amax`` (both scales given): returns ``(out, (x_maxima, w_maxima))``, the tile maxima the
    forward's casts of x and w found (float32; no other pass reads x or w), whose maxes are their
    amaxes (:func:`kernels.gemm_fp8.quantize.reduce_maxima`): what delayed scaling records
    (:class:`kernels.moe.fp8_layer.Float8MoE`), reducing them in its own launch
    (:func:`kernels.fp8.history_ops.record`) rather than in torch ops. A pair of bools (x's, w's)
    instead of True: only the casts it names write them, the other's maxima empty (up's GEMM casts
    the x gate's recorded; the expert-parallel owner's chunks after the first cast weights the first
    recorded); (False, False) is False, ``out`` alone.
    ``history_dy`` (``"delayed"`` only; float32 (HISTORY,), on x's device): the output gradient's
    amax history, from which the backward takes dy's scale for both its casts, on the device
    (its current amax while the history is empty); with ``counts`` (int64, one per tensor of the
    layer, None in eval mode) the backward also records the amax dy's cast found into
    ``history_dy`` and counts a saturating step in ``counts[count_index]``, in place
    (:func:`gradients`). Without it dy takes its current per-tensor scale. ``scale_rule``
    (``"mxfp8"`` only): the e8m0 rule of every operand's scales, ``"round_up"`` (the default) or
    ``"ocp"`` (:meth:`kernels.fp8.recipe.Recipe.chosen_scale_rule`; the FP8 MoE layers pass their own).
    ``x_operands``: x already quantized both ways, what :func:`.quantize.token_operands` returns for
    this x, offsets, recipe and ``fp8_dtype`` (a recipe of :data:`.quantize.SHARED_OPERANDS`): the
    forward reads the token operand and the backward the wgrad operand, which is saved instead of x,
    so GEMMs that read one x (an MoE layer's gate and up) quantize it once between them. Under
    ``"rowwise"``, where w's gradient is wanted, the op makes them itself otherwise (one fused
    quantization of x where two took twice the reads: :func:`.quantize.token_operands`).
    """
    fp8_dtype, grad_dtype = check_formats(recipe, fp8_dtype, grad_dtype)
    offsets = validate.grouped_gemm_operands(x, w, offsets, IN_DTYPES, allow_empty=True,
                                             check_values=check_offsets)
    _check_scale("scale_x", scale_x, recipe, x)
    _check_scale("scale_w", scale_w, recipe, x)
    amax_x, amax_w = _amax_flags(amax)
    if (amax_x or amax_w) and (scale_x is None or scale_w is None):
        raise ValueError(f"amax={amax!r} returns the tile maxima the casts with given scales find: "
                         "pass scale_x and scale_w")
    _check_grad_state(history_dy, counts, count_index, recipe, x)
    scale_rule = fp8_recipes.get(recipe).chosen_scale_rule(scale_rule)
    direct = eager.direct(x, w, offsets)
    # where w's gradient is wanted, both of x's operands from one fused quantization, and where x's is, both
    # of w's, its dgrad one held; under delayed with the casts' tile maxima after them, which the op,
    # casting neither, does not return
    training = not direct and torch.is_grad_enabled()
    made_x = (x_operands is None and training and w.requires_grad and offsets.shape[0] > 0
              and recipe in quantize.SHARED_OPERANDS)
    if x_operands is not None:
        _check_x_operands(x_operands, x, offsets, recipe, fp8_dtype, amax_x)
    elif made_x:
        x_operands = quantize.token_operands(x, offsets, recipe, fp8_dtype, scale_x, amax_x)
    made_w = training and x.requires_grad and recipe in quantize.SHARED_WEIGHTS
    w_operands = quantize.weight_operands(w, recipe, fp8_dtype, scale_w, amax_w) if made_w else ()
    op = _train_impl if direct else _train
    out, *maxima, _, _ = op(x, w, offsets, recipe, fp8_dtype, grad_dtype, scale_x, scale_w,
                            list(x_operands[:4] if x_operands else ()), list(w_operands[:4]),
                            amax_x and not made_x, amax_w and not made_w, history_dy, counts, count_index, scale_rule)
    if not (amax_x or amax_w):   # False, or a pair naming no cast
        return out
    x_found = x_operands[4:] if made_x else ()
    return out, (*(x_found or maxima[:1]), *(w_operands[4:] or maxima[1:]))
