"""Delayed scaling across data-parallel ranks: one MAX all-reduce of every layer's amax history.

Each rank sees its own batch, so with local histories the ranks would quantize the same
weights (and like activations) with different delayed scales, and their replicas would
drift apart. :func:`sync_amax` makes every rank's history the elementwise max over the
group: all layers' histories (a Linear's x, w and dy, a Float8MoE's five forward operands
and three output gradients, :data:`~kernels.fp8.recipes.delayed.HISTORY` entries each: the
recipe's ``reduced_buffers``, every ``fp8_amax_history_*`` buffer) go into one flat fp32 tensor and one ``all_reduce(MAX)``, not one collective
per tensor (Transformer Engine reduces its amaxes in one collective per step the same
way). MAX is idempotent, so reducing the whole history (not only the newest entry)
repairs a step that was skipped and costs ``3 * HISTORY * 4`` bytes per Linear
(``8 * HISTORY * 4`` per Float8MoE). The hook
:func:`install` sets runs before every training-mode forward: with gradient accumulation,
once per micro-batch, not once per optimizer step.

:func:`kernels.fp8.convert` runs it from a forward pre-hook on the converted model, in
training mode and only while ``torch.distributed`` is initialized: at the start of step t
the histories hold each rank's amaxes up to step t - 1 (the output gradients', recorded
in the backward, included), so after the reduce every rank derives the same scales for step
t, the output gradients' in its backward too. The first step (empty histories) still takes each
rank's own current amax (the history has nothing to agree on yet).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from . import recipe as _recipes


def sync_amax(model: torch.nn.Module, group=None) -> bool:
    """All-reduce (MAX) the scaling state of every FP8 layer of ``model`` over ``group``
    (default: the whole world) in one collective; False (nothing done) when
    ``torch.distributed`` is not initialized or no layer keeps such state."""
    if not (dist.is_available() and dist.is_initialized()):
        return False
    buffers = [b for m in model.modules() if hasattr(m, "recipe") and isinstance(m.recipe, str)
               for b in _recipes.get(m.recipe).reduced_buffers(m)]
    if not buffers:
        return False
    flat = torch.cat([b.reshape(-1) for b in buffers])
    dist.all_reduce(flat, op=dist.ReduceOp.MAX, group=group)
    for b, part in zip(buffers, flat.split([b.numel() for b in buffers])):
        b.copy_(part.view_as(b))
    return True


def install(model: torch.nn.Module, group=None) -> None:
    """Run :func:`sync_amax` before each training-mode forward of ``model`` (once per model)."""
    if getattr(model, "_fp8_amax_sync", None) is not None:
        return

    def hook(module, args):
        if module.training:
            with torch.no_grad():
                sync_amax(module, group)

    model._fp8_amax_sync = model.register_forward_pre_hook(hook)
