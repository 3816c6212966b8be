"""v3's SwiGLU backward in float64 and a one-rounding check: the FP8 MoE's SwiGLU is held to the fused rung's."""
from __future__ import annotations

import torch

from rounding_units import UNIT


def exact(dh, g, u, h, w):
    """v3's backward before the elementwise kernel (:mod:`kernels.moe.layer_ladder.swiglu_backward`), in
    float64: (dg, du, dw_rows, h·w)."""
    dh, g, u, h = (t.double() for t in (dh, g, u, h))
    w = torch.ones(h.shape[0], 1, dtype=torch.float64) if w is None else w.double()
    dw_rows = (h * dh).sum(dim=1)
    dh = dh * w
    sig = torch.sigmoid(g)
    return dh * u * sig * (1 + g * (1 - sig)), dh * g * sig, dw_rows, h * w


def close(got, exact, dtype):
    """Within one rounding to ``dtype`` of the exact value (float32: 8 units for its chain of
    about six roundings, sigmoid's exp among them, whose last bits the interpreter's NumPy
    computes differently on different CPUs; du measured within 4 here), plus an absolute 1e-6:
    dg's relative error is large only where 1 + g·(1 − σ) cancels, and that term covers it."""
    assert got.dtype == dtype and got.shape == exact.shape
    rtol = UNIT[dtype] * (8 if dtype == torch.float32 else 1.01)
    err = (got.double() - exact).abs()
    assert not got.isnan().any()
    assert (err <= rtol * exact.abs() + 1e-6).all(), err.max()
