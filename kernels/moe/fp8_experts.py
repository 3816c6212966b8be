"""What the two FP8 MoE layers share: how a high-precision layer becomes FP8, and the GEMM.

:class:`kernels.moe.fp8_layer.Float8MoE` (from a ``kernels.MoE``) and
:class:`kernels.moe.ep_fp8_layer.Float8ExpertParallelMoE` (from the expert-parallel layer)
run their experts' grouped GEMMs on :func:`kernels.moe.grouped_gemm_fp8.grouped_gemm_fp8_train`
under one recipe, and are built the same way: a new module of the FP8 class that holds
the high-precision layer's own Parameters, buffers and submodules (shared, not copied:
an optimizer made before the swap still updates them) and, under ``"delayed"``, an amax
history per tensor of the class's ``fp8_tensors`` as buffers (:mod:`kernels.fp8.recipes.delayed`:
the forward's operands, :data:`FP8_TENSORS`, and the output gradients, :data:`GRAD_TENSORS`),
which ``state_dict`` saves, :func:`kernels.fp8.warn_saturation` counts and
:mod:`kernels.fp8.amax_sync` all-reduces with the Linears'.
"""
from __future__ import annotations

import functools

import torch

from ..fp8 import recipe as fp8_recipes
from ..fp8.linear import fp8_linear
from ..fp8.recipes.delayed import PREFIX, cast_scales, history_scale, history_state
from ..joint_gemm import joint_gemm
from .grouped_gemm_fp8.quantize import SHARED_OPERANDS, token_operands
from .grouped_gemm_fp8.training import check_formats, grouped_gemm_fp8_train
from .swiglu_op import swiglu

FP8_TENSORS = ("x", "hidden", "gate", "up", "down")
"""The forward's operands whose scales delayed scaling keeps a history of, in ``fp8_saturated``'s
order: the routed rows x (which gate and up share), SwiGLU's output hidden, the three expert weights."""
GRAD_TENSORS = ("dy_gate", "dy_up", "dy_down")
"""The output gradients of the three grouped GEMMs (``dy_<weight>``: gate's dg and up's du from
SwiGLU's derivative, down's dy), whose delayed histories both FP8 MoE layers keep after
:data:`FP8_TENSORS` (the expert-parallel one's merged backward records its owner's rows'
amaxes, :mod:`kernels.moe.ep_fp8_layer`)."""


def current_scale(t: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Tensorwise's scale of ``t`` (2-D, or an expert stack read as its rows), the one a cast that
    finds its own would take, and the amax pass's partial maxima behind it: delayed's
    :func:`~kernels.fp8.recipes.delayed.history_scale` (its partials kept) with a history of no
    entries (nothing to skip the pass for, no earlier amax), two launches as that cast's own, no
    host sync."""
    rows = t.detach().reshape(-1, t.shape[-1])
    return history_scale(rows.new_empty(0, dtype=torch.float32), rows, fp8, keep_partials=True)


class Float8Experts:
    """Mixin of the FP8 MoE layers (before the high-precision layer's class in the bases):
    ``recipe``, ``scale_rule`` (mxfp8's e8m0 rule, None for the other recipes), ``fp8_dtype``,
    ``grad_fp8_dtype``, the delayed histories, and whether the shared experts run in FP8 too
    (:attr:`fp8_shared_experts`)."""

    fp8_tensors = FP8_TENSORS
    """The tensors with delayed histories, in ``fp8_saturated``'s order (a class's own)."""
    _fp8_shared_experts = False   # :attr:`fp8_shared_experts`'s

    @classmethod
    def _adopt(cls, layer: torch.nn.Module, recipe: str, fp8_dtype: torch.dtype | None,
               grad_dtype: torch.dtype | None, scale_rule: str | None = None):
        """A ``cls`` holding ``layer``'s own Parameters, buffers, submodules and public
        attributes (its sizes, mode, expert-parallel group), with hooks of its own. ``fp8_dtype``
        defaults to the recipe's e4m3 format (:meth:`kernels.fp8.recipe.Recipe.element_format`:
        this GPU's, OCP float8_e4m3fn for "mxfp8"); ``grad_dtype``: the output gradients' FP8
        format, default ``fp8_dtype``; ``scale_rule``: mxfp8's e8m0 rule, default its own
        (:meth:`kernels.fp8.recipe.Recipe.chosen_scale_rule`: refused by the other recipes)."""
        fp8_dtype, grad_dtype = check_formats(recipe, fp8_dtype, grad_dtype)
        scale_rule = fp8_recipes.get(recipe).chosen_scale_rule(scale_rule)
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)   # hooks of its own; the sizes, mode and registered state shared
        new.__dict__.update({key: value for key, value in vars(layer).items() if not key.startswith("_")})
        for own, theirs in ((new._parameters, layer._parameters), (new._buffers, layer._buffers),
                            (new._modules, layer._modules)):
            own.update(theirs)
        new.recipe, new.fp8_dtype, new.grad_fp8_dtype, new.scale_rule = recipe, fp8_dtype, grad_dtype, scale_rule
        if recipe == "delayed":
            for name, buffer in history_state(cls.fp8_tensors, layer.gate.device).items():
                new.register_buffer(name, buffer)
        return new

    def _cast_scale(self, name: str, t: torch.Tensor, found: list | None = None) -> torch.Tensor | None:
        """``t``'s per-tensor scale for its fused casts: delayed's, for a cast that returns the amax
        to record (``t`` read only while its history is empty); tensorwise's current one
        (:func:`current_scale`, the one a cast that finds its own would take) for x where gate's and
        up's GEMMs both cast it (without gradients, where :meth:`_shared_operands` makes none; one amax
        pass over the rows, not two; the same launches: each cast finding its own adds one), and where
        ``found`` is given (the expert-parallel owner, whose merged backward takes every scale its
        forward used), appended there with its amax partials;
        otherwise None, as under the other recipes: the casts find their own (a GEMM's backward
        takes what its forward found)."""
        if self.recipe == "delayed":
            return cast_scales(self, {name: t})[name]
        if self.recipe != "tensorwise" or (name != "x" and found is None):
            return None
        scale, partials = current_scale(t, self.fp8_dtype)
        if found is not None:
            found.append((scale, partials))
        return scale

    def _grad_state(self, name_w: str) -> dict:
        """The delayed state of the output gradient of ``name_w``'s GEMM for the training op's
        backward, if this layer keeps its history: the history and, in training mode only, the
        counts and its index in them (:func:`kernels.moe.grouped_gemm_fp8.training.gradients`)."""
        name = "dy_" + name_w
        if self.recipe != "delayed" or name not in self.fp8_tensors:
            return {}
        return {"history_dy": getattr(self, PREFIX + name), "counts": self.fp8_saturated if self.training else None,
                "count_index": self.fp8_tensors.index(name)}

    def _grouped(self, a, scale_a, w, scale_w, offsets, amax: bool = False, a_operands=None,
                 **grad_state) -> torch.Tensor:
        """``a_g @ w[g]`` by the FP8 grouped GEMM of this layer's recipe, offsets unchecked
        (``amax``: and the tile maxima of a's and w's casts, a pair, whose maxes are their amaxes;
        ``a_operands``: :meth:`_shared_operands`'s; ``grad_state``: :meth:`_grad_state`'s)."""
        return grouped_gemm_fp8_train(a, w, offsets, self.recipe, self.fp8_dtype, self.grad_fp8_dtype,
                                      scale_a, scale_w, check_offsets=False, amax=amax, scale_rule=self.scale_rule,
                                      x_operands=a_operands, **grad_state)

    def _shared_operands(self, x, offsets, scale_x, record, *weights) -> tuple | None:
        """x's FP8 operands for the GEMMs of ``weights`` (gate's and up's), which read the same rows: made
        once (:func:`~kernels.moe.grouped_gemm_fp8.quantize.token_operands`: rowwise's fused quantization;
        tensorwise's one cast writing both layouts, after the amax pass that finds x's scale; delayed's
        with ``scale_x``, returning the amax that ``record`` enters in x's history), so each GEMM takes
        the token operand and saves the wgrad operand, one copy between them, instead of quantizing x
        twice and saving it.
        None (each GEMM casts its own, with x's scale from :meth:`_cast_scale`) under the other recipes
        and where no weight's gradient is wanted: the wgrad operand would not be read."""
        if self.recipe not in SHARED_OPERANDS or not (torch.is_grad_enabled()
                                                      and any(w.requires_grad for w in weights)):
            return None
        if self.recipe != "delayed":
            return token_operands(x, offsets, self.recipe, self.fp8_dtype)
        *operands, maxima = token_operands(x, offsets, self.recipe, self.fp8_dtype, scale_x, amax=True)
        record(("x",), (maxima,), (scale_x,))
        return tuple(operands)

    def _mm(self, a, scale_a, w, scale_w, offsets, record, name_w: str, name_a: str | None = None,
            a_operands=None) -> torch.Tensor:
        """``a_g @ w[g]`` by :meth:`_grouped`; under delayed scaling (given scales), the tile maxima of its
        casts go to ``record(names, maxima, scales)`` (:func:`kernels.fp8.recipes.delayed.record_amax`'s
        arguments after the layer): w's as ``name_w``, a's as ``name_a`` if given
        (gate and up cast the same x: one of them names it; a cast whose amax is not recorded writes
        no tile maxima), and the backward takes the output
        gradient's scale from ``dy_<name_w>``'s history and records into it where the layer keeps one.
        Under another recipe the scales are None (the casts find their own) or tensorwise's
        (:meth:`_cast_scale`): nothing to record; ``a_operands``: a's FP8 operands made already
        (:meth:`_shared_operands`, which recorded a's amax: ``name_a`` None)."""
        if self.recipe != "delayed":
            return self._grouped(a, scale_a, w, scale_w, offsets, a_operands=a_operands)
        names = (name_a, name_w)
        out, maxima = self._grouped(a, scale_a, w, scale_w, offsets, amax=(name_a is not None, True),
                                    a_operands=a_operands, **self._grad_state(name_w))
        record(*zip(*[(n, m, s) for n, m, s in zip(names, maxima, (scale_a, scale_w)) if n]))   # maxima: a's, w's
        return out

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        fp8_recipes.get(self.recipe).upgrade_state(self, state_dict, prefix)   # an older checkpoint's layout
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        name = lambda dtype: str(dtype).replace("torch.float8_", "")   # noqa: E731
        rule = "" if self.scale_rule is None else f", scale_rule={self.scale_rule}"
        shared = ", fp8_shared_experts=True" if self._fp8_shared_experts else ""
        return (f"{super().extra_repr()}, recipe={self.recipe}{rule}, fp8={name(self.fp8_dtype)}, "
                f"grad={name(self.grad_fp8_dtype)}{shared}")

    @property
    def grad_format(self) -> str:
        """The output gradients' format in :func:`kernels.fp8.fp8_linear`'s word: ``"e4m3"`` where they
        are the operands' format, else ``"hybrid"`` (the e5m2 of their family)."""
        return "e4m3" if self.grad_fp8_dtype == self.fp8_dtype else "hybrid"

    @property
    def fp8_shared_experts(self) -> bool:
        """Whether the shared experts' GEMMs and their gradients run in FP8 too, by this layer's recipe,
        formats and scale rule, as FP8 Linears of the same recipe would run them: gate and up as one
        :func:`kernels.fp8.fp8_linear` on their weights side by side (the rows quantized once, as
        :func:`kernels.fp8.side_by_side` joins a model's gate and up), SwiGLU the routed experts'
        Triton pass, down another; the weights are quantized from their own (master) dtype, read
        through transposed views of their (dim, S·h) and (S·h, dim) storage. False by default:
        :func:`kernels.fp8.convert` sets it where ``keep_high_precision`` does not name
        ``"<layer>.shared_experts"`` (its default keeps them, ``"*shared_experts"``). Refused by a
        recipe whose scales come from a layer's amax histories (delayed scaling: this layer keeps
        them for its routed experts only)."""
        return self._fp8_shared_experts

    @fp8_shared_experts.setter
    def fp8_shared_experts(self, value: bool) -> None:
        if value and fp8_recipes.get(self.recipe).layer_scales:
            raise ValueError(f"the shared experts cannot run in FP8 under {self.recipe} scaling: its scales "
                             "come from this layer's amax histories, which it keeps for its routed experts only")
        if value and not self.shared_experts:
            raise ValueError("this layer has no shared experts to run in FP8")
        self._fp8_shared_experts = bool(value)

    def shared_mlp(self, rows: torch.Tensor) -> torch.Tensor:
        """The shared experts' output (T, dim), in FP8 where :attr:`fp8_shared_experts` says so, else as
        the high-precision layer runs them."""
        if not self._fp8_shared_experts:
            return super().shared_mlp(rows)
        settings = dict(recipe=self.recipe, fp8_dtype=self.fp8_dtype, grad_format=self.grad_format,
                        scale_rule=self.scale_rule)
        g, u = joint_gemm(functools.partial(fp8_linear, **settings), rows, (self.shared_gate, self.shared_up),
                          out_axis=1)   # stored (dim, S·h): one (dim, 2·S·h) copy, read transposed
        return fp8_linear(swiglu(g, u), self.shared_down.t(), **settings)
