"""Output allocation that the correctness harness can poison.

Every rung allocates its result through :func:`new_output` (or :func:`new_output_like`). Inside
:func:`poisoned_outputs` the buffer is filled with NaN (or the integer maximum)
instead of left uninitialised, so an element a kernel forgets to write shows up as a
mismatch instead of passing by luck with stale memory that happens to be right.
"""
from __future__ import annotations

import contextlib
import threading

import torch

_state = threading.local()
_poisoning = 0            # threads inside poisoned_outputs(): while 0, no thread-local read per output
_poisoning_lock = threading.Lock()


def poison_value(dtype: torch.dtype) -> float | int:
    if dtype.is_floating_point:
        return float("nan")
    return torch.iinfo(dtype).max


def new_output(shape, dtype: torch.dtype, device) -> torch.Tensor:
    # the count first: a thread-local read is a quarter of an allocation's host time
    if _poisoning and getattr(_state, "poison", False):
        return torch.full(shape, poison_value(dtype), dtype=dtype, device=device)
    # the sizes by keyword: torch parses a tuple of sizes given by position slower than the same
    # ints one by one (0.5 µs a call, ``workbench bench overhead`` shows it), and ``size=`` as
    # fast as those, also for a 0-d shape, which has no ints to give one by one
    return torch.empty(size=shape, dtype=dtype, device=device)


def new_output_like(t: torch.Tensor) -> torch.Tensor:
    """:func:`new_output` of ``t``'s shape, dtype and device, laid out as ``torch.empty_like(t)``
    lays it out (``preserve_format``): with ``t``'s strides where ``t`` is dense and
    non-overlapping, else dense strides in the order of ``t``'s (an expanded, stride-0
    dimension gets its own rows). Where ``t`` is dense, a gradient so allocated goes back
    through the views that made ``t`` without a copy."""
    if _poisoning and getattr(_state, "poison", False):
        return torch.full_like(t, poison_value(t.dtype))
    return torch.empty_like(t)


@contextlib.contextmanager
def poisoned_outputs():
    """Within this block, outputs from :func:`new_output` and :func:`new_output_like` start as poison."""
    global _poisoning
    previous = getattr(_state, "poison", False)
    _state.poison = True
    with _poisoning_lock:
        _poisoning += 1
    try:
        yield
    finally:
        _state.poison = previous
        with _poisoning_lock:
            _poisoning -= 1
