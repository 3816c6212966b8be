"""Name two Triton programs that store one element: a race the CPU would otherwise hide.

The interpreter runs a launch's programs one after another, so when two programs store
the same output element the later one simply wins, and a tile that strays into its
neighbour's rows (the next expert's, in a grouped GEMM) is overwritten by the owner and
passes every numeric check. On a GPU the programs run at once and the winner changes
from run to run. :func:`triton_store_races` records, per launch, which program stored
each address and fails at the second program's store, naming both programs, the
tensor and the element. Atomics do not pass through the patched store, so kernels that
combine partial results with them are not flagged.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from .guards import _launch_tensors


class ProgramRace(Exception):
    """Two programs of one launch stored the same element."""


def _element(spans, address: int) -> str:
    for start, end, name, size in spans:
        if start <= address < end:
            return f"element {(address - start) // size} of `{name}`"
    return f"address {address:#x}"


@contextmanager
def triton_store_races():
    """Fail when two programs of one interpreted launch store one address."""
    from triton.runtime import interpreter as interp

    builder = interp.interpreter_builder
    init_args, store = interp.GridExecutor._init_args_hst, builder.create_masked_store
    owner: dict[int, tuple] = {}      # address -> the program that stored it in this launch
    spans: list = []

    def init_args_recorded(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        owner.clear()                 # a new launch: its programs race only among themselves
        spans[:] = _launch_tensors(self.fn, args_hst, kwargs_hst)
        return args_hst, kwargs_hst

    def recorded_store(ptrs, value, mask, cache_policy):
        program = tuple(builder.grid_idx)
        addresses = np.broadcast_to(ptrs.data, np.broadcast_shapes(ptrs.data.shape, mask.data.shape))
        active = np.broadcast_to(mask.data, addresses.shape).astype(bool)
        for address in addresses[active].astype(np.uint64).tolist():
            first = owner.setdefault(address, program)
            if first != program:
                raise ProgramRace(f"programs {first} and {program} both store {_element(spans, address)}: "
                                  f"on a GPU they run at once and either may win; each element "
                                  f"must belong to one program")
        return store(ptrs, value, mask, cache_policy)

    interp.GridExecutor._init_args_hst = init_args_recorded
    builder.create_masked_store = recorded_store
    try:
        yield
    finally:
        interp.GridExecutor._init_args_hst = init_args
        del builder.create_masked_store  # back to the class's method
