"""delayed: per-tensor scales of x and w from the amax of earlier steps (an amax history).

The scale of this step is known before the tensor is read: ``max(history) / fp8_max``
over the last :data:`HISTORY` steps' amaxes (Transformer Engine's ``DelayedScaling``,
``amax_compute_algo="max"``). So the cast need not wait for an amax: the fused cast
with the given scale (:func:`kernels.gemm_fp8.quantize` with ``scale=`` and
``amax=True``) writes each tile's max |x| as it casts, and that amax, reduced on the
device, is what enters the history (:meth:`Delayed.record`): each of x and w is read
once per step, and no torch pass reads it for its amax. While a history is empty (the
first step, or :data:`HISTORY` all-zero steps) the current amax is taken instead; it
comes from the dense op's amax launch (:func:`kernels.gemm_fp8.quantize.amax`),
which every step launches but which reads the tensor only when the device finds the
history empty (no host sync decides it). The price: a tensor whose amax grows past
the history's saturates at +-fp8_max. A step in which the largest value lands beyond
``fp8_max`` plus half a unit in the last place there (what round-to-nearest would have
rounded down to the max anyway) is counted per layer
(``fp8_saturated``: x, w) and reported by :func:`kernels.fp8.warn_saturation`, never a NaN
(:func:`kernels.gemm_fp8.quantize_fp8` clamps before the cast).

The histories and counts are buffers of the layer, so ``state_dict`` saves and loads
them: ``fp8_amax_history_<tensor>`` per tensor and one ``fp8_saturated`` count per
tensor, in the order of the layer's ``fp8_tensors`` (x, w for a Linear;
:class:`kernels.moe.fp8_layer.Float8MoE` keeps one per operand of its three grouped
GEMMs through :func:`history_state`, :func:`cast_scale` and :func:`record_amax`, the same
rule; the expert-parallel layer, which casts in chunks, records the largest of its chunks'
amaxes once a step, :func:`record_parts`). Under
``torch.distributed`` the ranks share them: one MAX all-reduce of every layer's histories
per training step (:mod:`kernels.fp8.amax_sync`, installed by ``convert``). A layer updates them in training mode only; the first step (an empty history)
takes the current amax. The output gradient dy uses current scaling: its amax is known
only inside the backward, and a history of it would need state written from there
(torchao's delayed recipe offers the same mix).
"""
from __future__ import annotations

import math

import torch

from ...gemm_fp8.quantize import amax as fused_amax
from ..recipe import register
from ..saturation import TENSORS
from ..scaled_gemm import PerTensorRecipe

HISTORY = 16
PREFIX = "fp8_amax_history_"


def _scale(seen: torch.Tensor, amax: torch.Tensor, fmax: float) -> torch.Tensor:
    """``seen`` (max(history)) / fmax, the current amax while the history is empty, 1 for all-zero."""
    ref = torch.where(seen > 0, seen, amax)
    return torch.where(ref > 0, ref / fmax, torch.ones_like(ref))


def saturates_above(fmax: float) -> float:
    """fp8_max plus half its ulp (3 mantissa bits): 464 for e4m3fn, 248 for e4m3fnuz."""
    return fmax + 2.0 ** (math.floor(math.log2(fmax)) - 4)


def history_state(tensors: tuple[str, ...], device) -> dict[str, torch.Tensor]:
    """The buffers of a layer whose ``tensors`` take delayed scales: an empty amax history
    each and one saturation count each (``fp8_saturated``, in ``tensors``' order)."""
    return {**{PREFIX + name: torch.zeros(HISTORY, device=device) for name in tensors},
            "fp8_saturated": torch.zeros(len(tensors), dtype=torch.int64, device=device)}


@torch.no_grad()
def cast_scale(layer, name: str, t: torch.Tensor) -> torch.Tensor:
    """The delayed scale of ``t`` (2-D, or an expert stack (G, K, N) read as G·K rows), for a
    fused cast that returns ``t``'s amax to :func:`record_amax` after: ``t`` is read here only
    while the history of ``name`` is empty (:func:`kernels.gemm_fp8.quantize.amax`'s ``unless``)."""
    seen = getattr(layer, PREFIX + name).amax()
    rows = t.detach().reshape(math.prod(t.shape[:-1]), t.shape[-1])   # a view of a contiguous t
    return _scale(seen, fused_amax(rows, unless=seen), torch.finfo(layer.fp8_dtype).max)


@torch.no_grad()
def record_amax(layer, name: str, amax: torch.Tensor, scale: torch.Tensor) -> None:
    """In training mode: ``amax`` enters the history of ``name`` and a step whose ``scale``
    saturates it is counted."""
    if layer.training:
        history = getattr(layer, PREFIX + name)
        i = getattr(layer, "fp8_tensors", TENSORS).index(name)
        layer.fp8_saturated[i] += (amax > scale * saturates_above(torch.finfo(layer.fp8_dtype).max)).to(torch.int64)
        history.copy_(torch.cat([amax.reshape(1), history[:-1]]))


@torch.no_grad()
def record_parts(layer, name: str, amaxes: list[torch.Tensor]) -> torch.Tensor:
    """For a layer that casts a tensor in parts (the expert-parallel layer's chunks), each with
    :func:`cast_scale`'s scale of its part: the largest of the ``amaxes`` the parts' casts found
    enters the history of ``name`` once a step (:func:`record_amax`), and the whole tensor's
    scale is returned: the history's, or while it was empty that amax's."""
    amax = torch.stack(amaxes).amax()
    scale = _scale(getattr(layer, PREFIX + name).amax(), amax, torch.finfo(layer.fp8_dtype).max)
    record_amax(layer, name, amax, scale)
    return scale


class Delayed(PerTensorRecipe):
    name = "delayed"
    summary = f"per-tensor scales of x and w from the max amax of the last {HISTORY} steps"

    def state(self, device):
        return history_state(TENSORS, device)

    def reduced_buffers(self, layer):
        return [b for name, b in layer.named_buffers(recurse=False) if name.startswith(PREFIX)]

    def scales(self, layer, x, w):
        return cast_scale(layer, "x", x), cast_scale(layer, "w", w)

    def record(self, layer, scales, amax):
        for i, name in enumerate(TENSORS):
            record_amax(layer, name, amax[i], scales[i])


register(Delayed())
