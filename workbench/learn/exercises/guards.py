"""Make the CPU say what a GPU would not: which program or thread broke memory, and where.

On a GPU an out-of-bounds load reads a neighbour's data or faults without a location, and
a missing barrier gives wrong answers now and then. A learner needs the culprit named, so
while an exercise is checked on the CPU:

* :func:`triton_bounds` makes every load and store of the Triton interpreter check its
  active addresses against the tensors passed to the launch, and fail with the program id,
  the element of the block, the tensor and how far past its end (or before its start);
* :func:`shared_races` makes each ``shared.array`` of Numba's CUDA simulator remember, per
  element, which threads wrote and read it since the last ``syncthreads()``, and fail when
  two threads touch one element between barriers and one of them writes, naming both
  threads, the block and the element;
* :func:`simt_bounds` makes every element access of a simulated kernel's arrays (global
  and shared) check its index, and fail naming the array, the index, the shape and the
  kernel's source line. Numpy alone says "index 19 is out of bounds for axis 0 with size
  19" with no array or line, and wraps a negative index silently where a GPU reads before
  the array's start.

All patch the two simulators for the duration of a ``with`` block only.
"""
from __future__ import annotations

import inspect
import linecache
import sys
import threading
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path

import numpy as np


class OutOfBounds(IndexError):
    """A Triton program touched memory outside every tensor of its launch, or a simulated
    thread indexed an array outside its shape."""


class SharedMemoryRace(Exception):
    """Two threads of a block touched one shared-memory element with no barrier between."""


# ---- Triton interpreter ---------------------------------------------------------------

def _launch_tensors(fn, args_hst, kwargs_hst) -> list[tuple[int, int, str, int]]:
    """(start address, end address, argument name, element size) of each tensor argument."""
    names = list(inspect.signature(fn).parameters)
    named = list(zip(names, args_hst)) + list(kwargs_hst.items())
    spans = []
    for name, arg in named:
        if hasattr(arg, "untyped_storage"):
            storage = arg.untyped_storage()
            spans.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes(), name,
                          arg.element_size()))
    return sorted(spans)


def _check_addresses(spans, ptrs: np.ndarray, mask: np.ndarray, size: int, grid_idx, verb: str):
    addresses = np.broadcast_to(ptrs, np.broadcast_shapes(ptrs.shape, mask.shape)).astype(np.uint64)
    active = np.broadcast_to(mask, addresses.shape).astype(bool)
    starts = np.array([s[0] for s in spans], dtype=np.uint64)
    ends = np.array([s[1] for s in spans], dtype=np.uint64)
    owner = np.searchsorted(starts, addresses, side="right") - 1
    inside = (owner >= 0) & (addresses + np.uint64(size) <= ends[np.clip(owner, 0, None)])
    bad = active & ~inside
    if not bad.any():
        return
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    address = int(addresses[where])
    start, end, name, elem = min(spans, key=lambda s: min(abs(address - s[0]), abs(address - s[1])))
    if address < start:
        place = f"{(start - address) // elem} elements before the start of `{name}`"
    else:
        count = (end - start) // elem
        place = f"element {(address - start) // elem} of `{name}`, which has {count} (the last is {count - 1})"
    raise OutOfBounds(f"program {tuple(grid_idx)} {verb} out of bounds: lane {list(where)} of the "
                      f"block {verb} {place}; mask that lane off")


@contextmanager
def interpreter_hooks(on_launch=None, on_load=None, on_store=None):
    """Call ``on_launch(fn, args, kwargs)`` as each interpreted launch starts and
    ``on_load``/``on_store(program, ptrs, mask)`` before each load and store (``ptrs`` and
    ``mask`` are numpy arrays, ``program`` the grid index). The one place that patches the
    interpreter: guards built on it nest, each restoring what it found."""
    from triton.runtime import interpreter as interp

    builder = interp.interpreter_builder
    init_args = interp.GridExecutor._init_args_hst
    found = {name: vars(builder).get(name) for name in ("create_masked_load", "create_masked_store")}
    load, store = builder.create_masked_load, builder.create_masked_store

    def init_args_hooked(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        if on_launch:
            on_launch(self.fn, args_hst, kwargs_hst)
        return args_hst, kwargs_hst

    def hooked_load(ptrs, mask, other, cache_policy, is_volatile):
        if on_load:
            on_load(tuple(builder.grid_idx), ptrs, mask)
        return load(ptrs, mask, other, cache_policy, is_volatile)

    def hooked_store(ptrs, value, mask, cache_policy):
        if on_store:
            on_store(tuple(builder.grid_idx), ptrs, mask)
        return store(ptrs, value, mask, cache_policy)

    interp.GridExecutor._init_args_hst = init_args_hooked
    builder.create_masked_load, builder.create_masked_store = hooked_load, hooked_store
    try:
        yield
    finally:
        interp.GridExecutor._init_args_hst = init_args
        for name, value in found.items():
            if value is None:
                delattr(builder, name)      # back to the class's method
            else:
                setattr(builder, name, value)


@contextmanager
def triton_bounds():
    """Check every interpreted load and store against the launch's tensors."""
    spans: list = []

    def launch(fn, args_hst, kwargs_hst):
        spans[:] = _launch_tensors(fn, args_hst, kwargs_hst)

    def check(verb):
        def access(program, ptrs, mask):
            if spans:
                size = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
                _check_addresses(spans, ptrs.data, mask.data, size, program, verb)
        return access

    with interpreter_hooks(launch, check("loads"), check("stores")):
        yield


# ---- Numba's CUDA simulator ------------------------------------------------------------

class _TrackedShared:
    """A shared array that records, per element, the accesses since the last barrier.

    A thread's barrier count (``generation``) rises as it enters ``syncthreads()``; two
    accesses of one generation are unordered, so a write and any other access to the same
    element in one generation by different threads is a race, whatever order the
    simulator happened to run them in."""

    def __init__(self, array: np.ndarray, label: str):
        self._array, self._label = array, label
        self._lock = threading.Lock()
        self._block = None
        self._writes: dict[int, tuple[int, tuple]] = {}
        self._reads: dict[int, tuple[int, set]] = {}

    shape = property(lambda self: self._array.shape)
    dtype = property(lambda self: self._array.dtype)
    size = property(lambda self: self._array.size)
    ndim = property(lambda self: self._array.ndim)

    def __len__(self):
        return len(self._array)

    def _flat(self, key):
        index = _element_index(key, self._array.ndim)
        if index is None:
            return None  # a slice: the access is checked by numpy, not tracked
        return int(np.ravel_multi_index(index, self._array.shape))

    def _access(self, key, writing: bool):
        _check_index(lambda: f"shared array {self._label}", self._array.shape, key, writing)
        flat = self._flat(key)
        if flat is None:
            return
        thread = threading.current_thread()
        me, block = tuple(thread.threadIdx), tuple(thread.blockIdx)
        generation = getattr(thread, "_workbench_barriers", 0)
        element = [int(i) for i in np.unravel_index(flat, self._array.shape)]
        with self._lock:
            if block != self._block:  # blocks run one after another: start afresh
                self._block, self._writes, self._reads = block, {}, {}
            written = self._writes.get(flat)
            if written and written[0] == generation and written[1] != me:
                raise SharedMemoryRace(
                    f"race on shared array {self._label} element {element} in block {block}: thread {me} "
                    f"{'writes' if writing else 'reads'} it and thread {written[1]} wrote it with no "
                    f"syncthreads() between them")
            if writing:
                read = self._reads.get(flat)
                others = read[1] - {me} if read and read[0] == generation else set()
                if others:
                    raise SharedMemoryRace(
                        f"race on shared array {self._label} element {element} in block {block}: thread {me} "
                        f"writes it while thread {min(others)} reads it, with no syncthreads() between")
                self._writes[flat] = (generation, me)
            else:
                read = self._reads.get(flat)
                if not read or read[0] != generation:
                    read = (generation, set())
                    self._reads[flat] = read
                read[1].add(me)

    def __getitem__(self, key):
        self._access(key, writing=False)
        return self._array[key]

    def __setitem__(self, key, value):
        self._access(key, writing=True)
        self._array[key] = value


def _element_index(key, ndim: int) -> tuple[int, ...] | None:
    """``key`` as one int per axis, or None for a slice or a partial index."""
    index = key if isinstance(key, tuple) else (key,)
    if len(index) != ndim or not all(isinstance(i, (int, np.integer)) for i in index):
        return None
    return tuple(int(i) for i in index)


def _kernel_frame():
    """The frame of the kernel line that made the access: the first outside this module."""
    frame = sys._getframe(1)
    while frame.f_code.co_filename == __file__:
        frame = frame.f_back
    return frame


def _check_index(what, shape: tuple, key, writing: bool):
    """Fail on an index outside ``shape``, naming the array (``what()``: looked up only for
    a failure, as it walks frames), the index and the kernel line; a negative index counts:
    numpy would wrap it, a GPU reads before the start."""
    index = _element_index(key, len(shape))
    if index is None:
        return
    bad = next(((axis, i, n) for axis, (i, n) in enumerate(zip(index, shape)) if not 0 <= i < n), None)
    if bad is None:
        return
    axis, i, n = bad
    frame = _kernel_frame()
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    why = "is negative" if i < 0 else f"is past the last, {n - 1}"
    raise OutOfBounds(f"{'writes' if writing else 'reads'} {what()} at {list(index)} out of bounds: "
                      f"its shape is {tuple(shape)}, and index {i} on axis {axis} {why}; at line "
                      f"{frame.f_lineno} of {Path(frame.f_code.co_filename).name}: `{line}`")


def _argument_name(array) -> str:
    """The kernel's name for ``array`` (``a`` for ``a[row, k]``), found in the kernel's frame."""
    names = [name for name, value in _kernel_frame().f_locals.items() if value is array]
    return f"`{names[0]}`" if names else "an argument"


@contextmanager
def simt_bounds():
    """Check every element index a simulated kernel uses on its global and shared arrays."""
    from numba.cuda.simulator.cudadrv.devicearray import FakeWithinKernelCUDAArray as Global

    get, put = Global.__getitem__, Global.__setitem__

    def checked_get(self, key):
        _check_index(lambda: _argument_name(self), self._item.shape, key, writing=False)
        return get(self, key)

    def checked_put(self, key, value):
        _check_index(lambda: _argument_name(self), self._item.shape, key, writing=True)
        return put(self, key, value)

    Global.__getitem__, Global.__setitem__ = checked_get, checked_put
    try:
        yield
    finally:
        Global.__getitem__, Global.__setitem__ = get, put


def _array_name(filename: str, line: int) -> str:
    """``a_tile`` for the line ``a_tile = simt.shared.array(...)``, else where it was made."""
    text = linecache.getline(filename, line)
    target = text.split("=", 1)[0].strip() if "=" in text else ""
    where = f"line {line} of {filename.rsplit('/', 1)[-1]}"
    return f"`{target}` ({where})" if target.isidentifier() else f"({where})"


@contextmanager
def shared_races():
    """Track every ``shared.array`` of simulated kernels launched inside."""
    from numba.cuda.simulator import kernel, kernelapi
    from numba.core import types
    from numba.np import numpy_support

    shared_array, barrier = kernelapi.FakeCUDAShared.array, kernel.BlockThread.syncthreads
    allocating = threading.Lock()

    def tracked_array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:  # dynamic shared memory, or the simulator's error
            return shared_array(self, shape, dtype, alignment)
        # One allocation per source line and block, as the simulator keys them (its own
        # lookup would see this wrapper's line as the caller and alias every array).
        caller = sys._getframe(1)
        key = ("tracked", caller.f_code.co_filename, caller.f_lineno)
        with allocating:  # every thread of the block asks at once: exactly one creates it
            if key not in self._allocations:
                if isinstance(dtype, types.Type):
                    dtype = numpy_support.as_dtype(dtype)
                label = _array_name(caller.f_code.co_filename, caller.f_lineno)
                self._allocations[key] = _TrackedShared(np.empty(shape, dtype), label)
            return self._allocations[key]

    def counted_barrier(self):
        self._workbench_barriers = getattr(self, "_workbench_barriers", 0) + 1
        return barrier(self)

    kernelapi.FakeCUDAShared.array, kernel.BlockThread.syncthreads = tracked_array, counted_barrier
    try:
        yield
    finally:
        kernelapi.FakeCUDAShared.array, kernel.BlockThread.syncthreads = shared_array, barrier


def cpu_guards(kind: str):
    """The guard for a rung of this kind on the CPU (none for library rungs or on a GPU)."""
    import kernels

    if kernels.backend.current().is_gpu:
        return nullcontext()
    if kind == "simt":
        stack = ExitStack()
        stack.enter_context(simt_bounds())
        stack.enter_context(shared_races())
        return stack
    return {"triton": triton_bounds}.get(kind, nullcontext)()
