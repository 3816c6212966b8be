"""The host-sync trap (and counter) that tests of sync-free code share.

A GPU op that reads a tensor's value on the host (``.item()``, ``.tolist()``, ``.cpu()``,
``int(t)``, ``if t:``) stalls the host until the device has caught up. On the CPU nothing
stalls, so tests catch such reads by making every way to read a value raise, or count
them where a layer allows a documented one. Used in the test process (the grouped GEMM)
and inside spawned ranks (the expert-parallel layer), hence context managers rather than
pytest fixtures.
"""
from __future__ import annotations

import contextlib
import sys

import torch

READS = ("item", "tolist", "cpu", "numpy", "__int__", "__index__", "__bool__", "__float__")


@contextlib.contextmanager
def _replaced(wrap):
    """Each of :data:`READS` replaced by ``wrap(name, original)`` within the block."""
    own = {name: vars(torch.Tensor).get(name) for name in READS}
    originals = {name: getattr(torch.Tensor, name) for name in READS}
    for name in READS:
        setattr(torch.Tensor, name, wrap(name, originals[name]))
    try:
        yield
    finally:
        for name, method in own.items():
            if method is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, method)


@contextlib.contextmanager
def no_host_sync(allowed=()):
    """Within the block, each of :data:`READS` on any tensor raises ``AssertionError``, unless
    called directly by a function in ``allowed`` (its reads are appended to the list the
    block yields) or by ``torch.optim``, whose optimizers read their step counts: tensors
    that stay on the host on a GPU too, so no device sync."""
    codes, reads = {fn.__code__ for fn in allowed}, []

    def trap(name, original):
        def read(*args, **kwargs):
            caller = sys._getframe(1)
            if caller.f_code in codes:
                reads.append(name)
            elif not caller.f_globals.get("__name__", "").startswith("torch.optim."):
                raise AssertionError(f"host sync: Tensor.{name} in {caller.f_code.co_name} "
                                     f"({caller.f_code.co_filename}:{caller.f_lineno})")
            return original(*args, **kwargs)
        return read

    with _replaced(trap):
        yield reads


@contextlib.contextmanager
def counted_host_reads():
    """Within the block, reads work and their names are appended to the list it yields."""
    reads = []

    def count(name, original):
        def read(*args, **kwargs):
            reads.append(name)
            return original(*args, **kwargs)
        return read

    with _replaced(count):
        yield reads
