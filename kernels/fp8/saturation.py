"""Saturation of delayed scales: counted on the device each step, read when the caller reads.

A delayed scale that is too small for this step's tensor clamps its largest values to
+-fp8_max (never NaN: the quantizer clamps before the cast). The layer counts such
steps in its ``fp8_saturated`` buffer without a host sync; :func:`warn_saturation`
reads the counts (one sync) and warns, as the training loop does when it reads its
losses.
"""
from __future__ import annotations

import warnings

import torch

TENSORS = ("x", "w", "dy")
"""A Linear's tensors with delayed scales (x and w recorded in its forward, the output gradient
dy in its backward); a layer with others names them in ``fp8_tensors``."""


def saturation(model: torch.nn.Module) -> dict[str, dict[str, int]]:
    """Steps in which each FP8 layer's tensors (a Linear's x, w or dy; a Float8MoE's five forward
    operands and three output gradients) saturated, since the last reset."""
    return {name: dict(zip(getattr(m, "fp8_tensors", TENSORS), m.fp8_saturated.tolist()))
            for name, m in model.named_modules() if hasattr(m, "fp8_saturated")}


def warn_saturation(model: torch.nn.Module, reset: bool = True) -> dict[str, dict[str, int]]:
    """Warn (``warnings.warn``) naming each layer whose delayed scale saturated; reset the counts."""
    counts = {name: c for name, c in saturation(model).items() if any(c.values())}
    if counts:
        where = "; ".join(f"{name}: " + ", ".join(f"{t} in {n} step(s)" for t, n in c.items() if n)
                          for name, c in counts.items())
        warnings.warn(f"FP8 delayed scaling saturated (values clamped to the format's max): {where}. "
                      "The amax history is too short or the tensor grew; try a current-scaling "
                      "recipe (tensorwise, rowwise).", RuntimeWarning, stacklevel=2)
    if reset:
        for m in model.modules():
            if hasattr(m, "fp8_saturated"):
                m.fp8_saturated.zero_()
    return counts
