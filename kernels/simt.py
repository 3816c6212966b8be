"""One name, ``simt``, for the thread-level (SIMT) teaching kernels, bound once.

A SIMT rung is written once against ``simt`` (``simt.jit``, ``simt.grid``,
``simt.shared.array``, ``simt.syncthreads`` ...), the CUDA-style API that all three
targets share:

* ``hip``: numba-hip (``numba.hip``, the ``amd`` extra; needs ROCm), whose API is
  numba.cuda's: tensors go in through ``as_cuda_array`` (ROCm torch tensors expose
  ``__cuda_array_interface__``), streams through ``external_stream``;
* ``cuda``: numba-cuda on the NVIDIA GPU (the ``cuda`` extra);
* ``interpreter``: Numba's CUDA simulator on the CPU (the ``cpu`` extra;
  ``NUMBA_ENABLE_CUDASIM=1``, set by :mod:`kernels.backend` before numba is imported).

The SIMT rungs are optional: where that package cannot be imported, ``UNAVAILABLE``
says which extra to install, ``simt`` is a stand-in under which the rung modules
still import (so the ladder still lists them), and the registry marks their rungs
as not running here (``unavailable=UNAVAILABLE`` in their declaration).

The simulator runs every thread as a Python thread, so SIMT rungs are only checked
at smoke shapes on the CPU, and :func:`launch` shortens the GIL's turns while it runs.
"""
from __future__ import annotations

import sys
import threading
from contextlib import contextmanager

import numpy as np
import torch

from . import backend as _backend

_BACKEND = _backend.current()
_EXTRA = {"hip": "amd", "cuda": "cuda", "interpreter": "cpu"}[_BACKEND.name]  # brings `simt` here


class _Unavailable:
    """Stands in for ``simt`` where its package is missing: ``@simt.jit`` gives back this
    stand-in, so a rung module still defines its kernel, and launching it raises why."""

    def __init__(self, reason: str):
        self.reason = reason

    def jit(self, fn):
        return self

    def __getitem__(self, launch_config):
        raise ImportError(self.reason)


try:
    from numba import float32  # the scalar type kernels accumulate in
    if _BACKEND.name == "hip":
        from numba import hip as simt  # type: ignore[attr-defined]
    else:
        from numba import cuda as simt  # the simulator when NUMBA_ENABLE_CUDASIM=1
    UNAVAILABLE: str | None = None
    _MISSING: str | None = None
except ImportError as exc:
    UNAVAILABLE = f"not available here: install the `{_EXTRA}` extra"
    _MISSING = f"the SIMT kernels are {UNAVAILABLE} ({exc})"
    simt = _Unavailable(_MISSING)
    float32 = None  # read only inside kernel bodies, which never run without numba

__all__ = ["UNAVAILABLE", "as_simt_array", "current_stream", "float32", "launch", "launch_shape", "simt"]

# The simulator's block manager polls its threads in a loop that holds the GIL, and a thread
# woken at a barrier waits for the poller's turn to end: CPython's default turn is 5 ms. A
# shorter turn for the launch's duration runs the same threads in the same barrier phases.
SIMULATOR_GIL_TURN_S = 0.0005
_SIMULATING = threading.Lock()   # the simulator swaps module globals per launch: one at a time


def as_simt_array(tensor: torch.Tensor):
    """The tensor as an array a SIMT kernel takes; outputs are written through, not copied.

    A GPU target reads any strided view in place. The simulator copies each argument to
    its pretend device as one memory region, which a sliced view (row stride larger
    than its width) is not; such inputs get a dense copy first, which changes nothing the
    kernel computes. Outputs always come from ``new_output``, so they are dense.
    """
    if _BACKEND.is_interpreter:
        array = tensor.detach().numpy()
        dense = array.flags.c_contiguous or array.flags.f_contiguous
        return array if dense else np.ascontiguousarray(array)
    return simt.as_cuda_array(tensor.detach())


def current_stream(device: torch.device):
    """The stream a SIMT launch goes on: ``kernel[grid, block, current_stream(device)]``.

    On a GPU that is torch's current stream on ``device``, wrapped for numba: a launch on
    numba's default stream would race with the torch ops around it under
    ``torch.cuda.stream(s)`` (torch's ``__cuda_array_interface__`` names no stream, so
    numba cannot synchronise on its own). The simulator has no external streams and runs
    each launch to the end before returning, so it gets numba's default stream, 0.
    """
    if _MISSING:
        raise ImportError(_MISSING)
    if _BACKEND.is_interpreter:
        return 0
    return simt.external_stream(torch.cuda.current_stream(device).cuda_stream)


def launch(kernel, grid, block, *tensors: torch.Tensor) -> None:
    """``kernel[grid, block, stream](*tensors)``, with the output last: the stream is torch's
    current one on the output's device (:func:`current_stream`), each tensor goes in through
    :func:`as_simt_array`, and in the simulator the launch runs with short GIL turns."""
    stream = current_stream(tensors[-1].device)
    arrays = [as_simt_array(tensor) for tensor in tensors]
    with _short_gil_turns():
        kernel[grid, block, stream](*arrays)


@contextmanager
def _short_gil_turns():
    if not _BACKEND.is_interpreter:
        yield
        return
    with _SIMULATING:
        turn = sys.getswitchinterval()
        sys.setswitchinterval(min(turn, SIMULATOR_GIL_TURN_S))
        try:
            yield
        finally:
            sys.setswitchinterval(turn)


def launch_shape(rows: int, cols: int, block: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """Grid and block for a 2-D thread-per-element launch (x indexes columns)."""
    bx, by = block
    return ((cols + bx - 1) // bx, (rows + by - 1) // by), (bx, by)
