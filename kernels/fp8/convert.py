"""``convert(model, recipe)``: swap a model's Linear layers for FP8 ones, in place.

Which layers stay in high precision is a stated choice, :data:`KEEP_HIGH_PRECISION` by
default: the first and the last Linear of the model (the first sees raw embeddings, the
last, the LM head, produces logits whose small differences the softmax amplifies) and
the MoE router (a small GEMM whose top-k choice flips on small errors). These are the
layers FP8 recipes usually leave alone (DeepSeek-V3 keeps the embedding, output head,
MoE gating, normalization and attention operators in BF16/FP32; torchao's examples
skip the output head). Pass your own:

* a collection of names or ``fnmatch`` patterns over ``model.named_modules()``, where
  ``"first"`` and ``"last"`` stand for the first and last Linear in module order;
* a callable ``(name, module) -> bool``;
* ``()`` to convert every Linear.

Only ``torch.nn.Linear`` and its subclasses (``kernels.nn.Linear``) are swapped;
every other module is left as it is. Parameters are shared, not copied, so this can
run before or after the optimizer is made, and before ``fully_shard``.
"""
from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Callable, Iterable

import torch

from ..gemm_fp8.formats import fp8_dtype as native_fp8
from . import amax_sync, recipe as _recipes
from .linear import Float8Linear

KEEP_HIGH_PRECISION = ("first", "last", "*router")


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
            grad_format: str | None = None, amax_group=None) -> torch.nn.Module:
    """Swap every Linear of ``model`` not kept in high precision for a :class:`Float8Linear`.

    Returns ``model`` (changed in place; a bare Linear is returned swapped). ``fp8_dtype``:
    the e4m3 format, default this GPU's (fnuz on gfx942, OCP elsewhere); ``grad_format``:
    the output gradient's, ``"hybrid"`` (e5m2 of the same family) or ``"e4m3"``, default the
    recipe's (:attr:`kernels.fp8.recipe.Recipe.grad_format`: hybrid for tensorwise and
    delayed, e4m3 for the others). A recipe whose state ranks must share (delayed's amax
    histories) gets a forward pre-hook on the returned model that all-reduces it over
    ``amax_group`` (default: every rank; pass the data-parallel group) in one collective
    per training step, while ``torch.distributed`` is initialized (:mod:`.amax_sync`).
    """
    rec = _recipes.get(recipe)
    if rec.needs:
        raise NotImplementedError(f"FP8 recipe {recipe!r} needs {rec.needs}")
    fp8_dtype = fp8_dtype or native_fp8()
    rec.grad_dtype(fp8_dtype, grad_format)   # a format the recipe does not take: refused here
    if isinstance(model, torch.nn.Linear):
        return _synced(Float8Linear.from_linear(model, rec.name, fp8_dtype, grad_format), rec, amax_group)
    linears = [name for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and not isinstance(m, Float8Linear)]
    keep = _keeper(keep_high_precision, linears)
    for name in linears:
        module = model.get_submodule(name)
        if keep(name, module):
            continue
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, Float8Linear.from_linear(module, rec.name, fp8_dtype, grad_format))
    return _synced(model, rec, amax_group)


def _synced(model: torch.nn.Module, rec, group) -> torch.nn.Module:
    if type(rec).reduced_buffers is not _recipes.Recipe.reduced_buffers:   # state ranks must share
        amax_sync.install(model, group)
    return model


def converted(model: torch.nn.Module) -> dict[str, str]:
    """Each FP8 layer's name and recipe."""
    return {name: m.recipe for name, m in model.named_modules() if isinstance(m, Float8Linear)}
