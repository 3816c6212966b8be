"""tensorwise: one scale per tensor, from that tensor's amax now ("current scaling").

x, w and dy each get ``scale = amax / fp8_max``, computed from the tensor as it is in
this step (torchao's ``tensorwise``, Transformer Engine's ``Float8CurrentScaling``).
One scale serves both orientations, so the transposes the backward needs are views of
the forward's x8 and w8, which it keeps. Gradients in e5m2 by default (``grad_format``
``"hybrid"``, as Transformer Engine's ``Float8CurrentScaling``): one scale for all of dy
leaves its small values to the format's range.
Cheap (one amax per tensor) but coarse: one outlier sets the scale of the whole tensor
and pushes small values into e4m3's subnormals or to zero.
"""
from __future__ import annotations

from ..recipe import register
from ..scaled_gemm import PerTensorRecipe


class Tensorwise(PerTensorRecipe):
    name = "tensorwise"
    summary = "one scale per tensor, from its amax in this step (current scaling)"


register(Tensorwise())
