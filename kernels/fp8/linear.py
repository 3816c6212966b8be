"""The FP8 linear layer: forward, dgrad and wgrad through a recipe's scaled GEMMs.

``kernels::fp8_linear(x, w, recipe, fp8_dtype, grad_dtype, out_dtype, scale_x, scale_w, history_dy,
counts, scale_rule)`` is a ``torch.library`` custom op with a fake implementation and an autograd formula, as
the other public ops are (:mod:`kernels.gemm.ops`): ``torch.compile(fullgraph=True)`` keeps
it as one node, and its backward runs the recipe's dgrad and wgrad GEMMs, which call
``kernels::matmul_fp8`` (another custom op) under tracing. An eager call runs it as the other
public ops do (:func:`kernels.eager.path`): with nothing watching, the implementation itself, and
where only autograd watches, the same implementation and formula as a ``forward(ctx, ...)``
``autograd.Function``, without the custom op's dispatch. The op returns ``y`` and the
FP8 operands the recipe's backward reads (:class:`~kernels.fp8.recipe.Saved`: x and w
quantized in the forward, transposed copies from the same pass where the backward needs
another orientation; an empty placeholder for a scale the caller gave, which the backward saves
itself), so the backward quantizes only dy; those extra outputs are not
differentiable and :func:`fp8_linear` returns ``y`` alone. ``grad_dtype`` is dy's FP8
format (e5m2 under a recipe's ``"hybrid"`` grad_format). With both scales given (delayed
scaling) the op's last two outputs are the tile maxima of x's and w's casts, whose maxes are
their amaxes (:func:`kernels.gemm_fp8.quantize.quantize_checked`; else both are empty), which
:class:`Float8Linear` hands to the recipe's history (:meth:`~kernels.fp8.recipe.Recipe.record`).
dy's amax is known only in the backward, so delayed scaling's dy state goes into the op:
``history_dy`` (dy's amax history), from which the backward takes dy's scale on the device,
and in training mode ``counts`` (the layer's ``fp8_saturated``), with which the backward also
records the amax dy's cast found into ``history_dy`` and counts a saturating step
(:meth:`kernels.fp8.recipes.delayed.Delayed.backward`); both None for the other recipes. The
op's forward does not touch them (its schema declares no mutated argument: the writes are
the backward's); those in-place writes to the layer's buffers are kept by ``torch.compile``,
which traces the backward into its backward graph (tested: a compiled step's histories equal
eager's, under ``aot_eager``). ``scale_rule`` is the e8m0 rule of an ``mx32`` recipe (mxfp8),
None for the recipe's default: the op quantizes with ``recipe.get(recipe, scale_rule)``, the
layer's own rule, not a process-wide one.

``dx`` comes back in x's dtype and ``dw`` in w's (fp32 master weights get an fp32
gradient, accumulated in fp32 by the GEMM).
"""
from __future__ import annotations

import functools
import math

import torch

from .. import autocast, eager, plans
from ..gemm_fp8.quantize_kernel import tile_maxima_shape
from ..joint_gemm import joint_gemm
from . import recipe as _recipes
from .saturation import TENSORS


def _impl(x: torch.Tensor, w: torch.Tensor, recipe: str, fp8_dtype: torch.dtype, grad_dtype: torch.dtype,
          out_dtype: torch.dtype, scale_x: torch.Tensor | None, scale_w: torch.Tensor | None,
          history_dy: torch.Tensor | None = None, counts: torch.Tensor | None = None,
          scale_rule: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                  torch.Tensor, torch.Tensor, torch.Tensor]:
    rec = _recipes.get(recipe, scale_rule)
    if scale_x is not None and scale_w is not None:   # a per-tensor recipe's given scales
        y, (x8, sx, w8, sw), maxima = rec.forward(x, w, fp8_dtype, out_dtype, scale_x, scale_w, amax=True)
    else:
        y, (x8, sx, w8, sw) = rec.forward(x, w, fp8_dtype, out_dtype, scale_x, scale_w)
        maxima = x.new_empty(0, dtype=torch.float32), x.new_empty(0, dtype=torch.float32)   # two: outputs may not alias
    # a custom op's outputs may not alias its inputs: a scale the caller gave (delayed scaling gives
    # both, a caller may give one) is an empty placeholder, and the backward saves the input itself
    # (_setup: no copy, no device op)
    if scale_x is not None:
        sx = x.new_empty(0, dtype=torch.float32)
    if scale_w is not None:
        sw = x.new_empty(0, dtype=torch.float32)
    # FP8 payloads travel as their bytes (uint8 views: integer outputs take no gradient, and
    # tools that reduce every output, such as opcheck's, have no FP8 sum on the CPU)
    return y, x8.view(torch.uint8), sx, w8.view(torch.uint8), sw, *maxima


_fp8_linear = torch.library.custom_op("kernels::fp8_linear", _impl, mutates_args=())


@_fp8_linear.register_fake
def _(x, w, recipe, fp8_dtype, grad_dtype, out_dtype, scale_x, scale_w, history_dy=None, counts=None,
      scale_rule=None):
    x8, sx, w8, sw = _recipes.get(recipe).saved_like(x, w, fp8_dtype)
    if scale_x is not None:   # a given scale's placeholder, as _impl returns it
        sx = x.new_empty(0, dtype=torch.float32)
    if scale_w is not None:
        sw = x.new_empty(0, dtype=torch.float32)
    if scale_x is not None and scale_w is not None:   # the casts' tile maxima
        maxima = [x.new_empty(tile_maxima_shape(*t.shape), dtype=torch.float32) for t in (x, w)]
    else:
        maxima = [x.new_empty(0, dtype=torch.float32) for _ in "xw"]
    return (x.new_empty((x.shape[0], w.shape[0]), dtype=out_dtype), x8.view(torch.uint8), sx,
            w8.view(torch.uint8), sw, *maxima)


def _setup(ctx, inputs, output):
    x, w, recipe, fp8_dtype, grad_dtype, _, scale_x, scale_w, history_dy, counts, scale_rule = inputs
    ctx.recipe, ctx.fp8_dtype, ctx.grad_dtype, ctx.dtypes = recipe, fp8_dtype, grad_dtype, (x.dtype, w.dtype)
    ctx.scale_rule = scale_rule
    ctx.mark_non_differentiable(*output[1:])
    # the backward reads dy alone: no zeros made for the outputs that take no gradient (the FP8
    # operands and the tile maxima, six device ops per backward)
    ctx.set_materialize_grads(False)
    x8, sx, w8, sw = output[1:5]
    # a given scale is saved itself, 0-d as the casts took it
    ctx.save_for_backward(x8, sx if scale_x is None else scale_x.reshape(()),
                          w8, sw if scale_w is None else scale_w.reshape(()))
    # dy's state, held as it is (not saved: the forward's own record of x and w writes the counts
    # after this op, which would trip a saved tensor's version check); the backward writes it
    ctx.grad_state = () if history_dy is None else (history_dy, counts)


def _backward(ctx, dy, *_):
    x8, sx, w8, sw = ctx.saved_tensors
    saved = _recipes.Saved(x8.view(ctx.fp8_dtype), sx, w8.view(ctx.fp8_dtype), sw)
    dx, dw = _recipes.get(ctx.recipe, ctx.scale_rule).backward(dy, saved, ctx.grad_dtype, *ctx.dtypes,
                                                               ctx.needs_input_grad[0], ctx.needs_input_grad[1],
                                                               *ctx.grad_state)
    return dx, dw, None, None, None, None, None, None, None, None, None


_fp8_linear.register_autograd(_backward, setup_context=_setup)


class _Fp8Linear(torch.autograd.Function):
    """The custom op's implementation and formula for an eager call that only autograd watches
    (:data:`kernels.eager.AUTOGRAD`): the same outputs and backward, without the custom op's
    dispatch (host time per call, ``workbench bench overhead``'s floors)."""

    @staticmethod
    def forward(ctx, *inputs):
        output = _impl(*inputs)
        _setup(ctx, inputs, output)
        return output

    backward = staticmethod(_backward)


_apply = eager.applier(_Fp8Linear, tensors=2)


def fp8_linear(x: torch.Tensor, w: torch.Tensor, recipe: str = "rowwise", fp8_dtype: torch.dtype | None = None,
               out_dtype: torch.dtype | None = None, scale_x: torch.Tensor | None = None,
               scale_w: torch.Tensor | None = None, grad_format: str | None = None,
               scale_rule: str | None = None) -> torch.Tensor:
    """``x (M, K) @ w (N, K).T`` with the GEMM and, under autograd, dgrad and wgrad in FP8.

    ``fp8_dtype``: the e4m3 format (default: the recipe's, :meth:`kernels.fp8.recipe.Recipe.element_format`:
    this GPU's, OCP e4m3fn for mxfp8);
    ``out_dtype``: default x's; ``scale_x``/``scale_w``: per-tensor scales decided by the
    caller (delayed scaling; dy's scale is then its current amax's: a history of dy is
    :class:`Float8Linear`'s), else each GEMM computes its own; ``grad_format``: dy's
    format, ``"hybrid"`` (e5m2) or ``"e4m3"``, default the recipe's; ``scale_rule``: the e8m0
    rule of a recipe with ``mx32`` groups (mxfp8: ``"round_up"``, its default, or ``"ocp"``),
    refused by the others (:meth:`kernels.fp8.recipe.Recipe.chosen_scale_rule`).
    """
    plan = _checked(x, w, recipe, fp8_dtype, out_dtype, grad_format, scale_rule)
    _recipes.check_given_scales(x, scale_x, scale_w)   # a caller's: a layer's own are not checked
    return plan.run(x, w, scale_x, scale_w)[0]


def _checked(x, w, recipe, fp8_dtype, out_dtype, grad_format, scale_rule) -> "_Checked":
    """:func:`fp8_linear`'s checks of x and w and its choices, made once per metadata of x and w and
    options (:class:`_Checked`, a launch plan's key: :mod:`kernels.plans`)."""
    return _PLANS(plans.meta(x, w, extra=(recipe, fp8_dtype, out_dtype, grad_format, scale_rule)), _Checked,
                  x, w, recipe, fp8_dtype, out_dtype, grad_format, scale_rule)


_PLANS = plans.PlanCache()


class _Checked:
    """:func:`fp8_linear`'s checks of x and w and its choices (the formats, dy's, the scale rule,
    the output dtype) for inputs of one metadata and options; ``kind``: :func:`kernels.eager.kind`;
    ``recipe``: the recipe (its default rule's instance: what a layer asks for its scales and state)."""

    def __init__(self, x, w, recipe, fp8_dtype, out_dtype, grad_format, scale_rule):
        self.recipe = rec = _recipes.get(recipe)
        self.fp8_dtype = _recipes.check_operands(rec, x, w, fp8_dtype)
        if rec.needs:
            raise NotImplementedError(f"FP8 recipe {recipe!r} needs {rec.needs}")
        self.grad_dtype = rec.grad_dtype(self.fp8_dtype, grad_format)
        self.scale_rule = rec.chosen_scale_rule(scale_rule)
        self.out_dtype = out_dtype or x.dtype
        self.kind = eager.kind(x, w)

    def run(self, x, w, scale_x, scale_w, grad_state=(None, None)) -> tuple[torch.Tensor, ...]:
        """All the op's outputs (y, the saved operands, the amaxes) on checked x and w and scales
        (a caller's, checked by :func:`fp8_linear`, or a layer's own), by the path an eager call
        takes (:func:`kernels.eager.path`); ``grad_state``: the layer's
        :meth:`~kernels.fp8.recipe.Recipe.grad_state`."""
        how = eager.path(known=self.kind)
        op = _impl if how == eager.PLAIN else _apply if how == eager.AUTOGRAD else _fp8_linear
        return op(x, w, self.recipe.name, self.fp8_dtype, self.grad_dtype, self.out_dtype, scale_x, scale_w,
                  *grad_state, self.scale_rule)


class Float8Linear(torch.nn.Linear):
    """``torch.nn.Linear`` whose three GEMMs run in FP8 by ``recipe``; same parameters and keys.

    Built by :func:`kernels.fp8.convert` from an existing layer, sharing its parameters
    (an optimizer made before the swap still updates them). A recipe with state (delayed
    scaling: the amax histories of x, w and dy, and their saturation counts) adds its buffers;
    a delayed checkpoint from before dy's history loads with it empty
    (:meth:`kernels.fp8.recipe.Recipe.upgrade_state`). ``grad_format``: the output gradient's
    FP8 format, ``"hybrid"`` (e5m2) or ``"e4m3"``, default the recipe's
    (:attr:`Recipe.grad_format`). ``scale_rule``: the e8m0 rule of an ``mx32`` recipe's scales
    (mxfp8), the layer's own (:meth:`Recipe.chosen_scale_rule`; None where the recipe has none).
    Under ``torch.autocast`` the input is cast to the autocast dtype and the output is in it;
    the weight is quantized from its own (master) dtype.
    """

    fp8_tensors = TENSORS
    """The tensors a delayed recipe keeps histories of, in ``fp8_saturated``'s order (a class
    attribute: found without ``Module.__getattr__``, a Python call per delayed record)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, recipe: str = "rowwise",
                 fp8_dtype: torch.dtype | None = None, grad_format: str | None = None, scale_rule: str | None = None,
                 device=None, dtype=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self._setup(recipe, fp8_dtype, grad_format, scale_rule)

    def _setup(self, recipe: str, fp8_dtype: torch.dtype | None, grad_format: str | None,
               scale_rule: str | None) -> None:
        self.recipe = _recipes.get(recipe).name
        self.scale_rule = _recipes.get(recipe).chosen_scale_rule(scale_rule)
        self.fp8_dtype = _recipes.get(recipe).element_format(fp8_dtype)
        self.grad_format = grad_format or _recipes.get(recipe).grad_format
        self.grad_fp8_dtype = _recipes.get(recipe).grad_dtype(self.fp8_dtype, self.grad_format)
        for name, buffer in _recipes.get(recipe).state(self.weight.device).items():
            self.register_buffer(name, buffer)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, recipe: str = "rowwise", fp8_dtype: torch.dtype | None = None,
                    grad_format: str | None = None, scale_rule: str | None = None) -> "Float8Linear":
        """A Float8Linear holding ``linear``'s own weight and bias Parameters."""
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight, new.bias = linear.weight, linear.bias
        new._setup(recipe, fp8_dtype, grad_format, scale_rule)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, bias = _forward(self, x, self.weight), self.bias
        return y if bias is None else y + bias.to(y.dtype)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        _recipes.get(self.recipe).upgrade_state(self, state_dict, prefix)   # an older checkpoint's layout
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        name = lambda dtype: str(dtype).replace("torch.float8_", "")   # noqa: E731
        rule = "" if self.scale_rule is None else f", scale_rule={self.scale_rule}"
        return (f"{super().extra_repr()}, recipe={self.recipe}{rule}, fp8={name(self.fp8_dtype)}, "
                f"grad={name(self.grad_fp8_dtype)}")


def _forward(layer: Float8Linear, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` by ``layer``'s settings and state (its recipe's scales and records), no bias."""
    if autocast.active():   # one C call; operands' own test is a Python call more
        x, = autocast.operands(x)
    flat = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])   # not -1: K may be 0
    # checked before the recipe reads them: delayed scaling's amax launches take x and w as checked
    plan = _checked(flat, w, layer.recipe, layer.fp8_dtype, x.dtype, layer.grad_format, layer.scale_rule)
    rec = plan.recipe
    scale_x, scale_w = rec.scales(layer, flat, w)
    y, *out = plan.run(flat, w, scale_x, scale_w, rec.grad_state(layer))
    if scale_x is not None:
        rec.record(layer, (scale_x, scale_w), out[-2:])
    return y.reshape(*x.shape[:-1], w.shape[0])


def _settings(layer: torch.nn.Module) -> tuple | None:
    """What decides a bias-free Float8Linear's GEMMs (None for anything else)."""
    if type(layer) is not Float8Linear or layer.bias is not None:
        return None
    return layer.recipe, layer.fp8_dtype, layer.grad_format, layer.scale_rule


def side_by_side(layers: tuple[torch.nn.Module, ...], x: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
    """The outputs of FP8 ``layers`` of one ``x`` (attention's q, k and v; an MLP's gate and up) as one
    FP8 linear on their weights side by side, as fused projections run: x quantized once and one
    GEMM forward, dy quantized once and one dgrad and one wgrad backward, where apart each layer
    would quantize x and dy and run its three GEMMs (and x's gradients be added). Returns None where
    they cannot: a layer of another class or with a bias, different settings (recipe, formats, scale
    rule), or a recipe whose scales are a layer's own (one that decides them outside the GEMM,
    :meth:`Recipe.scales`: delayed scaling, from the layer's amax histories).

    The weights are concatenated (:func:`kernels.joint_gemm.joint_gemm`: a copy per call; each one's
    gradient is a row view of the joint one). A recipe whose scales follow the weight's rows or K
    (rowwise, mxfp8) quantizes each weight as it would alone (the same FP8 values and scales), so
    the outputs are the separate layers' up to the GEMMs' summation order (bit for bit where the
    sums are exact: tests/test_fp8_side_by_side.py); one per tensor (tensorwise) or per 128 x 128
    block (blockwise, where an ``out_features`` is not a multiple of 128) spans the weights, as a
    fused QKV weight's does. The backward quantizes the joint dy, whose row scales (rowwise,
    blockwise, mxfp8) span the layers' gradients."""
    settings = _settings(layers[0])
    if (settings is None or any(_settings(layer) != settings for layer in layers[1:])
            or _recipes.get(settings[0]).layer_scales):
        return None
    return joint_gemm(functools.partial(_forward, layers[0]), x, [layer.weight for layer in layers])
