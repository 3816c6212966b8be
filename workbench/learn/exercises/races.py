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

from .guards import _launch_tensors, interpreter_hooks


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
    owner: dict[int, tuple] = {}      # address -> the program that stored it in this launch
    spans: list = []

    def launch(fn, args_hst, kwargs_hst):
        owner.clear()                 # a new launch: its programs race only among themselves
        spans[:] = _launch_tensors(fn, args_hst, kwargs_hst)

    def store(program, ptrs, mask):
        addresses = np.broadcast_to(ptrs.data, np.broadcast_shapes(ptrs.data.shape, mask.data.shape))
        active = np.broadcast_to(mask.data, addresses.shape).astype(bool)
        for address in addresses[active].astype(np.uint64).tolist():
            first = owner.setdefault(address, program)
            if first != program:
                raise ProgramRace(f"programs {first} and {program} both store {_element(spans, address)}: "
                                  f"on a GPU they run at once and either may win; each element "
                                  f"must belong to one program")

    with interpreter_hooks(on_launch=launch, on_store=store):
        yield
