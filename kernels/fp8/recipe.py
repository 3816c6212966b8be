"""What an FP8 training recipe is, and the one registry of them.

A linear layer ``y = x @ w.T`` runs three GEMMs per training step, and each one has a
reduction dimension along which a scale may be shared:

* forward ``y = x @ w.T``: reduces over K (in_features);
* dgrad ``dx = dy @ w``: reduces over N (out_features);
* wgrad ``dw = dy.T @ x``: reduces over M (tokens).

A recipe says, for each GEMM, how its two operands are quantized: one scale per tensor,
one per row/column, per block, and where that scale comes from (the tensor itself,
"current scaling", or earlier steps, "delayed"). A scale that varies along the
reduction dimension cannot be pulled out of the dot product, so a recipe with finer
scales needs a re-quantization of the same tensor for each orientation (rowwise: x is
scaled along K for the forward and along M for wgrad) or a GEMM that applies the scales
per K block inside its loop (blockwise, MXFP8).

The forward quantizes x and w once and keeps, for the backward, the FP8 copies the dgrad
and wgrad GEMMs read (:class:`Saved`: for a recipe whose backward needs x or w scaled
along another dimension, the transposed copy :func:`kernels.gemm_fp8.quantize` writes in
the forward's pass), so the backward quantizes only dy. :func:`saved_bytes` gives what
this keeps between forward and backward per layer, against saving high-precision x (the
weight is a Parameter, alive anyway): about ``M K + N K`` bytes against ``2 M K`` in bf16,
a saving when the tokens M outnumber the output features N (e.g. M = 16384, N = K = 4096:
80 MiB against 128 MiB), a cost when they do not (M = N = K: the same bytes plus scales).

Gradients: ``grad_format`` is ``"hybrid"`` (dy in e5m2, the forward's operands in e4m3)
or ``"e4m3"`` (everything in e4m3); each recipe states its default and why, and
``convert(..., grad_format=)`` overrides it. Transformer Engine's current and delayed
per-tensor recipes default to HYBRID (``Float8CurrentScaling`` and ``DelayedScaling``,
``fp8_format=Format.HYBRID``) and its block and MXFP8 recipes to E4M3
(``Float8BlockScaling``, ``MXFP8BlockScaling``; Transformer Engine 2.x "Common API");
DeepSeek-V3 uses e4m3 on all tensors, since its fine-grained scales already give each
small group its own range (technical report, arXiv 2412.19437, section 3.3.2).

:mod:`kernels.fp8.linear` calls ``forward`` from the custom op and ``backward`` from its
autograd formula. Recipes register themselves here by name (:func:`register`), one file
each in :mod:`kernels.fp8.recipes`.
"""
from __future__ import annotations

import copy

import torch

from typing import NamedTuple

from .. import gemm_fp8, validate
from ..gemm_fp8.formats import E5M2_OF, FP8_DTYPES
from ..gemm_fp8.quantize import X_DTYPES, check_scale
from ..gemm_fp8.quantize_ref import scale_shape

GRAD_FORMATS = ("hybrid", "e4m3")
RECIPES: dict[str, "Recipe"] = {}   # filled by kernels.fp8.recipes, in ladder order
_RULED: dict[tuple[str, str], "Recipe"] = {}   # (name, scale rule): a recipe's instance for a rule not its default


class Saved(NamedTuple):
    """What the forward keeps for the backward: x and w in FP8 with their scales, each in the
    orientation (and scaled along the dimension) the backward's GEMMs read."""

    x: torch.Tensor
    x_scale: torch.Tensor
    w: torch.Tensor
    w_scale: torch.Tensor


class Recipe:
    """Base class: a name, what it does in one line, its forward and its backward.

    ``grad_format``: the default FP8 format of the output gradient dy, ``"hybrid"`` (e5m2)
    or ``"e4m3"``; ``grad_formats``: those it takes; ``grad_dtype_note``: why the default.
    ``saved_layout``: how :class:`Saved` holds x and w, ``(transposed, granularity)`` each
    (granularity as :func:`kernels.gemm_fp8.quantize` names it, of the stored orientation).
    ``operand_groups``: per GEMM (``forward``, ``dgrad``, ``wgrad``), the granularity of A
    (rows x reduction) and of B taken as (columns x reduction), i.e. the groups its scales
    cover along the GEMM's reduction dimension (what the accuracy report counts overflow in).
    ``scale_rules``: the e8m0 rules its ``mx32`` groups take (:data:`kernels.microscaling.SCALE_RULES`),
    its default first; none for a recipe without ``mx32`` groups. The rule is chosen per
    conversion, not on this process-wide instance: ``convert(..., scale_rule=)`` and the layers
    keep it (:meth:`chosen_scale_rule`), and hand it to the ops, which quantize with
    ``get(name, scale_rule)``, the recipe's instance for that rule (:attr:`scale_rule`), so
    layers converted with different rules coexist in one process.
    ``kernels``: the functions of :mod:`kernels.gemm_fp8` it calls beyond ``matmul_fp8``;
    ``needs`` names those not in this installation (None when all are).
    """

    name = ""
    saved_layout: tuple[tuple[bool, str], tuple[bool, str]] = ((False, "tensor"), (False, "tensor"))
    operand_groups: dict[str, tuple[str, str]] = dict.fromkeys(("forward", "dgrad", "wgrad"),
                                                               ("tensor", "tensor"))
    summary = ""
    grad_format = "e4m3"
    grad_formats: tuple[str, ...] = GRAD_FORMATS
    grad_dtype_note = ""
    scale_rules: tuple[str, ...] = ()

    kernels: tuple[str, ...] = ()

    @property
    def scale_rule(self) -> str:
        """The e8m0 rule this instance quantizes its ``mx32`` groups by (:func:`kernels.gemm_fp8.quantize`'s
        keyword): its default, or the one :func:`get` made it for; ``"ocp"`` where it has none
        (the keyword's no-op for the fp32-scaled granularities). Read-only."""
        return getattr(self, "_scale_rule", None) or (self.scale_rules[0] if self.scale_rules else "ocp")

    @scale_rule.setter
    def scale_rule(self, value) -> None:
        raise AttributeError(f"FP8 recipe {self.name!r}: the scale rule is not set on the process-wide recipe "
                             f"but chosen per conversion: kernels.fp8.convert(model, {self.name!r}, "
                             f"scale_rule={value!r}), or the layers' and ops' scale_rule argument")

    def chosen_scale_rule(self, scale_rule: str | None) -> str | None:
        """The rule a layer keeps for ``scale_rule`` (None: the default), checked: one of
        :attr:`scale_rules`; None for a recipe without ``mx32`` groups, which is refused a rule."""
        if not self.scale_rules:
            if scale_rule is not None:
                raise ValueError(f"scale_rule chooses the e8m0 scales of mx32 groups; FP8 recipe {self.name!r} "
                                 f"has none (got scale_rule={scale_rule!r})")
            return None
        if scale_rule is None:
            return self.scale_rules[0]
        if scale_rule not in self.scale_rules:
            raise ValueError(f"FP8 recipe {self.name!r} takes scale_rule {' or '.join(map(repr, self.scale_rules))}, "
                             f"got {scale_rule!r}")
        return scale_rule

    def element_format(self, fp8: torch.dtype | None = None) -> torch.dtype:
        """The e4m3 format of this recipe's operands: ``fp8``, else this GPU's
        (:func:`kernels.gemm_fp8.fp8_dtype`: fnuz on gfx942, OCP elsewhere)."""
        return fp8 or gemm_fp8.fp8_dtype()

    def grad_dtype(self, fp8: torch.dtype, grad_format: str | None = None) -> torch.dtype:
        """dy's FP8 format beside forward operands in ``fp8`` (e4m3fn or e4m3fnuz): the e5m2
        format of the same family for ``"hybrid"``, ``fp8`` itself for ``"e4m3"``."""
        grad_format = grad_format or self.grad_format
        if grad_format not in self.grad_formats:
            why = f" ({self.grad_dtype_note})" if grad_format in GRAD_FORMATS else ""
            raise ValueError(f"FP8 recipe {self.name!r} takes grad_format {' or '.join(self.grad_formats)}, "
                             f"got {grad_format!r}{why}")
        return E5M2_OF[fp8] if grad_format == "hybrid" else fp8

    @property
    def needs(self) -> str | None:
        missing = [k for k in self.kernels if not hasattr(gemm_fp8, k)]
        return f"kernels.gemm_fp8.{' and '.join(missing)} (not in this installation)" if missing else None

    def state(self, device) -> dict[str, torch.Tensor]:
        """Buffers a layer keeps for this recipe (in its ``state_dict``); none by default."""
        return {}

    def reduced_buffers(self, layer) -> list[torch.Tensor]:
        """Buffers of ``layer`` that data-parallel ranks must agree on, all-reduced with MAX
        (:mod:`kernels.fp8.amax_sync`); none by default."""
        return []

    def scales(self, layer, x: torch.Tensor, w: torch.Tensor):
        """Scales for x and w decided outside the GEMM (delayed scaling), else (None, None)."""
        return None, None

    @property
    def layer_scales(self) -> bool:
        """Whether :meth:`scales` is the recipe's own, deciding scales from a layer's state (delayed
        scaling's amax histories): then a GEMM runs only as that layer's, never for weights joined
        across layers (:func:`kernels.fp8.side_by_side`) or held outside one (an FP8 MoE layer's
        shared experts)."""
        return type(self).scales is not Recipe.scales

    def record(self, layer, scales, maxima: tuple[torch.Tensor, torch.Tensor]) -> None:
        """After a forward with the scales :meth:`scales` decided: x's and w's amaxes, as the
        casts found them (``maxima``: their tile maxima, ``forward(..., amax=True)``), enter the
        layer's state; nothing by default."""

    def grad_state(self, layer) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The state of ``layer`` from which the backward takes dy's scale and into which it
        records dy's amax (delayed: dy's history, and in training mode the saturation counts),
        handed to :meth:`backward` after ``need_dw``; (None, None) by default: dy's scale is
        the backward's own."""
        return None, None

    def upgrade_state(self, layer: torch.nn.Module, state_dict: dict, prefix: str) -> None:
        """Make a checkpoint of ``layer``'s older state layout (the keys under ``prefix``) this
        recipe's, in place, before it is loaded; nothing by default."""

    def saved_like(self, x: torch.Tensor, w: torch.Tensor, fp8: torch.dtype) -> Saved:
        """Empty tensors shaped as the forward's :class:`Saved` (for fake implementations)."""
        out = []
        for t, (transposed, granularity) in zip((x, w), self.saved_layout):
            shape = tuple(t.shape[::-1]) if transposed else tuple(t.shape)
            scale = torch.uint8 if granularity == "mx32" else torch.float32
            out += [t.new_empty(shape, dtype=fp8), t.new_empty(scale_shape(granularity, *shape), dtype=scale)]
        return Saved(*out)

    def forward(self, x, w, fp8, out_dtype, scale_x=None, scale_w=None, amax=False) -> tuple[torch.Tensor, Saved]:
        """``y = x @ w.T`` in ``out_dtype`` and what the backward needs (x, w quantized once);
        ``amax`` (per-tensor recipes with given scales only): also the tile maxima of x's and w's
        casts, a pair (their maxes are x's and w's amaxes: :func:`kernels.gemm_fp8.quantize.quantize_checked`)."""
        raise NotImplementedError

    def backward(self, dy, saved: Saved, grad_fp8, dx_dtype, dw_dtype, need_dx=True,
                 need_dw=True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``(dx, dw)`` = ``(dy @ w, dy.T @ x)`` from dy (quantized here to ``grad_fp8``, once)
        and the forward's :class:`Saved`; None for a gradient not needed. A recipe whose
        :meth:`grad_state` is not (None, None) also takes that state, as two more arguments."""
        raise NotImplementedError

    def gemms(self, x, w, dy, fp8, out_dtype=torch.float32, scale_x=None, scale_w=None,
              grad_format: str | None = None, grad_state: tuple = ()) -> dict[str, torch.Tensor]:
        """The three GEMMs' results by name (``forward``, ``dgrad``, ``wgrad``): one forward and
        one backward, as a training step runs them (for accuracy reports and tests); ``scale_x``,
        ``scale_w`` and ``grad_state`` (dy's, as :meth:`grad_state` hands it to the backward) as
        a layer with delayed scaling passes them. Eager, and checked here as
        :func:`kernels.fp8.fp8_linear` checks its inputs: the recipes quantize without checks, and
        a forward without dispatch (:mod:`kernels.fp8.scaled_gemm`)."""
        fp8 = check_operands(self, x, w, fp8, "fp8")
        validate.tensor("dy", dy, ndim=2, dtypes=X_DTYPES, allow_empty=True)
        validate.same_device(x=x, dy=dy)
        if dy.shape != (x.shape[0], w.shape[0]):
            raise ValueError(f"dy is {tuple(dy.shape)}; x {tuple(x.shape)} and w {tuple(w.shape)} give "
                             f"(M, N) = {(x.shape[0], w.shape[0])}")
        check_given_scales(x, scale_x, scale_w)
        y, saved = self.forward(x, w, fp8, out_dtype, scale_x, scale_w)
        dx, dw = self.backward(dy, saved, self.grad_dtype(fp8, grad_format), out_dtype, out_dtype, True, True,
                               *grad_state)
        return {"forward": y, "dgrad": dx, "wgrad": dw}


def check_operands(rec: Recipe, x: torch.Tensor, w: torch.Tensor, fp8: torch.dtype | None,
                   name: str = "fp8_dtype") -> torch.dtype:
    """The e4m3 format ``rec`` quantizes x and w to (:meth:`Recipe.element_format` of ``fp8``, which
    refuses one the recipe does not take) and the checks of x (M, K) and w (N, K): what
    :func:`kernels.fp8.fp8_linear` and :meth:`Recipe.gemms` ask, since the recipes quantize unchecked.
    ``name``: the format's argument in the caller's signature."""
    fmt = rec.element_format(fp8)
    if fmt not in FP8_DTYPES:
        raise TypeError(f"{name} must be one of {FP8_DTYPES}, got {fmt}")
    validate.tensor("x", x, ndim=2, dtypes=X_DTYPES, allow_empty=True)
    validate.tensor("w", w, ndim=2, dtypes=X_DTYPES, allow_empty=True)
    validate.same_device(x=x, w=w)
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"x is {tuple(x.shape)} (M, K) and w {tuple(w.shape)} (N, K): K differs")
    return fmt


def check_given_scales(x: torch.Tensor, scale_x: torch.Tensor | None, scale_w: torch.Tensor | None) -> None:
    """The checks of per-tensor scales a caller passes (:func:`kernels.fp8.fp8_linear`,
    :meth:`Recipe.gemms`): the recipes quantize without checks, so a given scale is checked here."""
    for name, scale in (("scale_x", scale_x), ("scale_w", scale_w)):
        if scale is not None:
            check_scale(name, scale, x)


def saved_bytes(recipe: str, m: int, n: int, k: int, x_dtype: torch.dtype = torch.bfloat16) -> dict[str, int]:
    """Bytes a layer keeps from forward to backward under ``recipe`` (x: (m, k), w: (n, k)),
    against keeping x in ``x_dtype`` and re-quantizing in the backward (w is a Parameter
    either way, so it costs nothing there): ``{"fp8 saved", "high-precision x",
    "difference"}``; a negative difference is memory saved. FP8 payloads are one byte,
    scales four (fp32) or one (e8m0)."""
    with torch.device("meta"):
        saved = get(recipe).saved_like(torch.empty(m, k), torch.empty(n, k), torch.float8_e4m3fn)
    kept = sum(t.numel() * t.element_size() for t in saved)
    high = m * k * torch.empty((), dtype=x_dtype).element_size()
    return {"fp8 saved": kept, "high-precision x": high, "difference": kept - high}


def register(recipe: Recipe) -> Recipe:
    if recipe.name in RECIPES:
        raise ValueError(f"FP8 recipe {recipe.name!r} is registered twice")
    RECIPES[recipe.name] = recipe
    return recipe


def names() -> tuple[str, ...]:
    """Every recipe, in ladder order (also those whose kernels are not installed)."""
    return tuple(RECIPES)


def get(name: str, scale_rule: str | None = None) -> Recipe:
    """The recipe called ``name``; a clear error for an unknown one. ``scale_rule`` (None: its
    default): its instance quantizing by that e8m0 rule, made once per rule (a copy whose
    :attr:`~Recipe.scale_rule` is the rule); a rule the recipe does not take is refused."""
    if name not in RECIPES:
        raise ValueError(f"unknown FP8 recipe {name!r}; the recipes are {', '.join(RECIPES)}")
    recipe = RECIPES[name]
    if scale_rule is None or scale_rule == recipe.scale_rule:
        return recipe
    key = (name, recipe.chosen_scale_rule(scale_rule))
    if key not in _RULED:
        ruled = copy.copy(recipe)
        ruled._scale_rule = key[1]
        _RULED[key] = ruled
    return _RULED[key]
