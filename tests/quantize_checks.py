"""Nine-decade activations and a bitwise check: tensor amax's tests hold its kernels to the fused quantize's bits."""
from __future__ import annotations

import torch


def activations(shape, seed=0, dtype=torch.float32):
    """Columns over nine decades, an all-zero row and a -0 column: groups with very different
    amaxes, a zero group, and signed zeros."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen) * torch.logspace(-6, 3, shape[1])
    x[min(3, shape[0] - 1)] = 0.0
    x[:, min(7, shape[1] - 1)] = -0.0
    return x.to(dtype)


def assert_same(got, want):
    """Bitwise equality (an fp8 payload compared as bytes: NaN poison never equals)."""
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, w.dtype, g.shape, w.shape)
        if g.dtype.itemsize == 1 and g.dtype.is_floating_point:
            g, w = g.view(torch.uint8), w.view(torch.uint8)
        bad = g != w
        assert not bad.any(), f"output {i}: {int(bad.sum())} of {bad.numel()} differ, first at {bad.nonzero()[0].tolist()}"
