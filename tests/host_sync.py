"""The host-sync trap that tests of sync-free code share.

A GPU op that reads a tensor's value on the host (``.item()``, ``.tolist()``, ``.cpu()``,
``int(t)``, ``if t:``) stalls the host until the device has caught up. On the CPU nothing
stalls, so tests catch such reads by making every way to read a value raise. Used in the
test process (the grouped GEMM) and inside spawned ranks (the expert-parallel layer),
hence a context manager rather than a pytest fixture.
"""
from __future__ import annotations

import contextlib

import torch

READS = ("item", "tolist", "cpu", "numpy", "__int__", "__index__", "__bool__", "__float__")


@contextlib.contextmanager
def no_host_sync():
    """Within the block, each of :data:`READS` on any tensor raises ``AssertionError``."""
    own = {name: vars(torch.Tensor).get(name) for name in READS}

    def trap(name):
        def read(*_, **__):
            raise AssertionError(f"host sync: Tensor.{name}")
        return read

    for name in READS:
        setattr(torch.Tensor, name, trap(name))
    try:
        yield
    finally:
        for name, method in own.items():
            if method is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, method)
