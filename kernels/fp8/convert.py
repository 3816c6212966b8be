"""``convert(model, recipe)``: swap a model's Linear layers for FP8 ones, in place.

Which layers stay in high precision is a stated choice, :data:`KEEP_HIGH_PRECISION` by
default: the first and the last Linear of the model (the first sees raw embeddings, the
last, the LM head, produces logits whose small differences the softmax amplifies), the
MoE router (a small GEMM whose top-k choice flips on small errors) and the MoE layers'
shared experts (every token passes through them, so their error reaches every token).
The first three are the layers FP8 recipes usually leave alone (DeepSeek-V3 keeps the
embedding, output head, MoE gating, normalization and attention operators in BF16/FP32;
torchao's examples skip the output head); DeepSeek-V3 runs its shared experts in FP8, which
a list without ``"*shared_experts"`` does here. Pass your own:

* a collection of names or ``fnmatch`` patterns over ``model.named_modules()``, where
  ``"first"`` and ``"last"`` stand for the first and last Linear in module order outside
  MoE layers (a router is never the model's "last" Linear: ``"*router"`` names it), and
  ``"<layer>.shared_experts"`` (``"shared_experts"`` for a bare MoE layer) an MoE layer's
  shared experts, parameters of that layer, not modules;
* a callable ``(name, module) -> bool`` (asked with that name and the MoE layer for its
  shared experts);
* ``()`` to convert every Linear and every MoE layer's shared experts.

A list of your own that leaves out ``"*shared_experts"`` (such as ``("first", "last", "*router")``,
this default before it named the shared experts) runs them in FP8.

Only ``torch.nn.Linear`` and its subclasses (``kernels.nn.Linear``) and the MoE layers
are swapped; every other module is left as it is. A ``kernels.MoE`` not kept (its name
matched by a pattern) becomes a :class:`kernels.moe.fp8_layer.Float8MoE`, an
expert-parallel one (``kernels.MoE(..., ep_group=g)``) a
:class:`kernels.moe.ep_fp8_layer.Float8ExpertParallelMoE`: their experts' grouped GEMMs
and both their gradients run in FP8 (the recipes of
:data:`kernels.moe.grouped_gemm_fp8.quantize.RECIPES`, with the recipe's gradient format;
another recipe leaves the experts in high precision, with a warning), the expert-parallel
layer's dispatch in FP8 for the row-local recipes (rowwise, blockwise, mxfp8: each token
quantized once by its sender; ``convert(..., fp8_dispatch=False)`` or the layer's
``fp8_dispatch = False`` for the activation dtype) and its other all-to-alls in the
activation dtype, while the router is a Linear like any other, kept by ``"*router"`` unless
you say otherwise. Shared experts not kept run in FP8 by the layer's recipe
(:attr:`kernels.moe.fp8_experts.Float8Experts.fp8_shared_experts`), but for delayed scaling,
which keeps them in high precision with a warning. A subclass of either layer has no FP8 path
and is left as it is, with a warning. Parameters are shared, not copied, so this can run before
or after the optimizer is made, and before ``fully_shard``.
"""
from __future__ import annotations

import warnings
from fnmatch import fnmatchcase
from typing import Callable, Iterable

import torch

from . import amax_sync, recipe as _recipes
from .linear import Float8Linear

KEEP_HIGH_PRECISION = ("first", "last", "*router", "*shared_experts")


def _keeper(keep, linears: list[str]) -> Callable[[str, torch.nn.Module], bool]:
    if callable(keep):
        return keep
    if isinstance(keep, str) or not isinstance(keep, Iterable):
        raise TypeError(f"keep_high_precision must be names/patterns or a callable, got {keep!r}")
    aliases = {"first": linears[:1], "last": linears[-1:]}
    patterns = [name for word in keep for name in aliases.get(word, [word])]
    return lambda name, module: any(fnmatchcase(name, p) for p in patterns)


def convert(model: torch.nn.Module, recipe: str = "rowwise", *,
            keep_high_precision=KEEP_HIGH_PRECISION, fp8_dtype: torch.dtype | None = None,
            grad_format: str | None = None, amax_group=None,
            fp8_dispatch: bool | None = None, scale_rule: str | None = None) -> torch.nn.Module:
    """Swap every Linear of ``model`` not kept in high precision for a :class:`Float8Linear`,
    and every ``kernels.MoE`` for a :class:`kernels.moe.fp8_layer.Float8MoE` (the
    expert-parallel layer for :class:`kernels.moe.ep_fp8_layer.Float8ExpertParallelMoE`).

    Returns ``model`` (changed in place; a bare Linear or ``kernels.MoE`` is returned swapped).
    ``fp8_dtype``: the e4m3 format of every converted layer, default the recipe's
    (:meth:`kernels.fp8.recipe.Recipe.element_format`: this GPU's, fnuz on gfx942 and OCP
    elsewhere; OCP e4m3fn everywhere for mxfp8, which has no fnuz form);
    ``grad_format``: the output gradient's format in the Linears and the FP8 MoE experts,
    ``"hybrid"`` (e5m2 of the same family) or ``"e4m3"``, default the recipe's
    (:attr:`kernels.fp8.recipe.Recipe.grad_format`: hybrid for tensorwise and delayed, e4m3
    for the others). A recipe whose state ranks must share (delayed's amax histories, the
    MoE experts' included) gets a forward pre-hook on the returned model that all-reduces it
    over ``amax_group`` (default: every rank; pass the data-parallel group, which must span
    an expert-parallel layer's group: its ranks hold different experts' histories) in one
    collective per training-mode forward, while ``torch.distributed`` is initialized
    (:mod:`.amax_sync`). ``fp8_dispatch``: whether the expert-parallel layers' tokens travel
    to their owners in FP8 (:attr:`kernels.moe.ep_fp8_layer.Float8ExpertParallelMoE.fp8_dispatch`),
    default the recipe's (on for rowwise, blockwise and mxfp8, off for the per-tensor
    recipes); True under a per-tensor recipe is refused before anything is swapped.
    ``scale_rule``: the e8m0 rule of the ``mx32`` scales, for mxfp8 only (``"round_up"``, its
    default, or the OCP spec's ``"ocp"``: :mod:`kernels.fp8.recipes.mxfp8`), kept by every layer
    this converts, the Linears and the MoE layers' experts alike, so models converted with
    different rules coexist in one process; another recipe refuses one, before anything is swapped.
    """
    rec = _recipes.get(recipe)
    if rec.needs:
        raise NotImplementedError(f"FP8 recipe {recipe!r} needs {rec.needs}")
    fp8_dtype = rec.element_format(fp8_dtype)
    grad_dtype = rec.grad_dtype(fp8_dtype, grad_format)   # a format the recipe does not take: refused here
    scale_rule = rec.chosen_scale_rule(scale_rule)        # likewise a rule
    if fp8_dispatch is not None:
        from ..moe.ep_fp8_layer import check_fp8_dispatch
        check_fp8_dispatch(rec.name, fp8_dispatch)
    if isinstance(model, torch.nn.Linear):
        return _synced(Float8Linear.from_linear(model, rec.name, fp8_dtype, grad_format, scale_rule), rec,
                       amax_group)
    linears = [name for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and not isinstance(m, Float8Linear)]
    keep = _keeper(keep_high_precision, _outside_moe(model, linears))
    model = _convert_moe(model, rec.name, keep, fp8_dtype, grad_dtype, fp8_dispatch, scale_rule)
    for name in linears:
        module = model.get_submodule(name)
        if keep(name, module):
            continue
        _swap(model, name, Float8Linear.from_linear(module, rec.name, fp8_dtype, grad_format, scale_rule))
    return _synced(model, rec, amax_group)


def _outside_moe(model: torch.nn.Module, names: list[str]) -> list[str]:
    """The names not inside an MoE layer (its router, a gate of its own)."""
    from ..moe.layer_base import MoELayer
    moe = [name + "." for name, m in model.named_modules() if isinstance(m, MoELayer)]
    return [n for n in names if not any(n.startswith(prefix) for prefix in moe)]


def _swap(model: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, module)


def _convert_moe(model: torch.nn.Module, recipe: str, keep, fp8_dtype, grad_dtype,
                 fp8_dispatch: bool | None, scale_rule: str | None) -> torch.nn.Module:
    """Swap each MoE layer not kept for its FP8 form (before the Linears: the router, a
    submodule both layers share, is then swapped in the FP8 layer), its shared experts in FP8
    unless kept (by the name ``"<layer>.shared_experts"``), the expert-parallel ones
    with ``fp8_dispatch`` unless None; returns the model, the FP8 layer itself where the
    model is an MoE layer."""
    from ..moe.ep_fp8_layer import Float8ExpertParallelMoE
    from ..moe.ep_layer import ExpertParallelMoE
    from ..moe.fp8_experts import Float8Experts
    from ..moe.fp8_layer import Float8MoE
    from ..moe.grouped_gemm_fp8.quantize import RECIPES
    from ..moe.layer import MoE
    from ..moe.layer_base import MoELayer
    fp8_form = {MoE: Float8MoE.from_moe, ExpertParallelMoE: Float8ExpertParallelMoE.from_ep}
    layers = [(name, m) for name, m in model.named_modules()   # MoE, the EP layer, their subclasses
              if isinstance(m, MoELayer) and not isinstance(m, Float8Experts) and not keep(name, m)]
    for name, layer in layers:
        if type(layer) not in fp8_form or recipe not in RECIPES:
            why = (f"FP8 recipe {recipe!r} has no grouped GEMM (it has: {', '.join(RECIPES)})"
                   if type(layer) in fp8_form else f"{type(layer).__name__} has no FP8 path")
            warnings.warn(f"MoE layer {name or '(the model)'!r}: {why}; its experts stay in high "
                          "precision", RuntimeWarning, stacklevel=3)
            continue
        fp8_layer = fp8_form[type(layer)](layer, recipe, fp8_dtype, grad_dtype, scale_rule)
        if fp8_dispatch is not None and isinstance(fp8_layer, Float8ExpertParallelMoE):
            fp8_layer.fp8_dispatch = fp8_dispatch
        if layer.shared_experts and not keep(f"{name}.shared_experts" if name else "shared_experts", layer):
            try:
                fp8_layer.fp8_shared_experts = True
            except ValueError as refused:
                warnings.warn(f"MoE layer {name or '(the model)'!r}: {refused}; its shared experts stay in high "
                              "precision", RuntimeWarning, stacklevel=3)
        if not name:
            return fp8_layer
        _swap(model, name, fp8_layer)
    return model


def _synced(model: torch.nn.Module, rec, group) -> torch.nn.Module:
    if type(rec).reduced_buffers is not _recipes.Recipe.reduced_buffers:   # state ranks must share
        amax_sync.install(model, group)
    return model


def converted(model: torch.nn.Module) -> dict[str, str]:
    """Each FP8 layer's name and recipe (Linear layers and MoE layers whose experts are FP8,
    expert-parallel ones included)."""
    from ..moe.fp8_experts import Float8Experts
    return {name: m.recipe for name, m in model.named_modules() if isinstance(m, (Float8Linear, Float8Experts))}
