"""Device ops per call: what a GPU would launch for one call of an op, counted on the CPU.

On a GPU every Triton launch and every torch op on a device tensor that runs a kernel costs
host time (torch's dispatch, the driver's launch), so an op made of many small device ops is
host-bound long before its GEMMs are: the host-overhead benchmark
(:mod:`workbench.harness.host_overhead`) reports this count beside its time. It does not depend
on the CPU's speed or load, so a test may bound it.

:func:`device_ops` runs the call with Triton's launches stubbed (each one counted) under a
``TorchDispatchMode`` that counts the aten ops reaching the dispatcher, less those that launch
nothing (:func:`launches`: views and allocations). A ``kernels::`` custom op is not itself a
launch: its own implementation runs under the mode, so the ops *inside* it count (a mode
otherwise sees a custom op as one opaque call).
"""
from __future__ import annotations

import collections
import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch._library.custom_ops import _maybe_get_opdef
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from kernels import eager


# allocations (uninitialized memory), and views that autograd does not treat as views
_NO_KERNEL = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default,
              torch.ops.aten.empty_like.default, torch.ops.aten.new_empty.default,
              torch.ops.aten.new_empty_strided.default, torch.ops.aten.lift_fresh.default,
              torch.ops.aten._unsafe_view.default}


@dataclass
class Launches:
    """What the stub saw: launches, the arguments they were packed with, and per launch the
    storages of its tensor arguments (what it may read or write: a kernel reaches memory only
    through the pointers it is given)."""

    count: int = 0
    args: int = 0
    storages: list[frozenset[int]] = field(default_factory=list)   # with stubbed_launches(storages=True)

    def taking(self, t: torch.Tensor) -> int:
        """How many launches were given ``t``'s memory (its storage, through any view of it); none for
        a tensor of no bytes (whose null pointer other empty tensors share). Storages are recorded by
        address, so ``t`` must have been alive throughout the launches: a tensor allocated later
        may get the address of an argument freed since."""
        storage = t.untyped_storage()
        return sum(storage.data_ptr() in launch for launch in self.storages) if storage.nbytes() else 0


@contextlib.contextmanager
def stubbed_launches(storages: bool = False) -> Iterator[Launches]:
    """Within this block, ``kernel[grid](...)`` packs its arguments and returns without running
    (``storages``: and records the storages each launch was given, off by default so the
    host-overhead benchmark times no bookkeeping of its own).

    Both launchers are replaced: the interpreter's (``InterpretedFunction.run``) and the
    compiled JIT's (``JITFunction.run``, which ``triton.autotune`` also ends in)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    seen = Launches()

    def run(self, *args, grid, warmup=False, **kwargs):
        seen.count += 1
        seen.args += len(args) + len(kwargs)
        if storages:
            seen.storages.append(frozenset(a.untyped_storage().data_ptr() for a in (*args, *kwargs.values())
                                           if isinstance(a, torch.Tensor)))

    saved = {cls: cls.__dict__["run"] for cls in (InterpretedFunction, JITFunction)}
    for cls in saved:
        cls.run = run
    try:
        yield seen
    finally:
        for cls, original in saved.items():
            cls.run = original


def launches(func: torch._ops.OpOverload) -> bool:
    """Whether aten op ``func`` runs a kernel on a GPU: not a view (its output aliases its
    input: metadata only), nor an allocation, nor an op that returns no tensor (such as
    ``promote_types``, a dtype)."""
    return (not func.is_view and func not in _NO_KERNEL
            and any(isinstance(r.type, torch.TensorType) for r in func._schema.returns))


@dataclass
class DeviceOps:
    """What one call launched: Triton launches and the torch ops that run a kernel, by name."""

    triton: int = 0
    torch_ops: collections.Counter = field(default_factory=collections.Counter)

    @property
    def total(self) -> int:
        return self.triton + sum(self.torch_ops.values())


class _Counting(TorchDispatchMode):
    """Counts the aten ops that launch; runs a ``kernels::`` custom op's implementation under
    itself, so that what it calls is counted too."""

    def __init__(self, seen: DeviceOps):
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "kernels":
            with self:
                return _maybe_get_opdef(func)._init_fn(*args, **kwargs)
        if launches(func):
            self.seen.torch_ops[str(func.overloadpacket.__name__)] += 1
        return func(*args, **kwargs)


def _other_dispatch_modes() -> int:
    """The dispatch modes open besides the counter: what :func:`kernels.eager.path` sees while
    :func:`device_ops` counts."""
    return sum(not isinstance(mode, _Counting) for mode in _get_current_dispatch_mode_stack())


@contextlib.contextmanager
def _unseen_by_kernels():
    """The counter hidden from :func:`kernels.eager.path`, which takes any open dispatch mode for a
    tracer and then runs a public op as its custom op: counted, the call takes the path it takes
    uncounted (in an eager training step, an op's own ``autograd.Function``). Swapped in
    :mod:`kernels.eager` for the count's duration, process-wide (the counts run on one thread), so
    that ``eager.path`` keeps its one C call on the hot path instead of inspecting the mode stack."""
    saved = eager._dispatch_modes
    eager._dispatch_modes = _other_dispatch_modes
    try:
        yield
    finally:
        eager._dispatch_modes = saved


def device_ops(call: Callable[[], object]) -> DeviceOps:
    """The device ops of one ``call()`` after a warm-up call (first-call caches and plans), on the
    path the call takes when nothing counts it."""
    with stubbed_launches() as stub:
        call()
        seen = DeviceOps()
        before = stub.count
        with _unseen_by_kernels(), _Counting(seen):
            call()
        seen.triton = stub.count - before
    return seen
