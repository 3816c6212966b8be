"""Device-event timing: warm-up, cache flush before every repeat, median of many.

Performance numbers come only from a GPU. On the interpreter every call raises
:class:`PerformanceUnavailable`: an interpreted kernel's wall time says nothing about
a GPU, and printing it next to real numbers would mislead.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

import torch

import kernels

# Larger than any last-level cache we target (MI300X/MI325X Infinity Cache: 256 MiB).
FLUSH_BYTES = 512 * 1024 * 1024


class PerformanceUnavailable(RuntimeError):
    """Raised instead of producing a performance number where none can be measured."""


def require_gpu() -> None:
    here = kernels.backend.current()
    if here.is_interpreter:
        raise PerformanceUnavailable(
            "no GPU here: kernels run in the Triton interpreter / Numba CUDA simulator, whose "
            "times say nothing about GPU performance, so none are reported. Recorded GPU "
            "results: `workbench tour` or workbench.results.recorded().")


@dataclass(frozen=True)
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    reps: int
    flops: float | None = None        # work per call, when the caller said
    bytes_moved: float | None = None  # minimum traffic per call, when the caller said

    @property
    def tflops(self) -> float | None:
        return None if self.flops is None else self.flops / self.median_ms / 1e9

    @property
    def gbps(self) -> float | None:
        return None if self.bytes_moved is None else self.bytes_moved / self.median_ms / 1e6


class _Flusher:
    """Overwrites a buffer larger than the caches so every repeat starts cold."""

    def __init__(self):
        self.buffer = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")

    def __call__(self):
        self.buffer.zero_()


def time_ms(fn: Callable[[], object], warmup_ms: float = 25.0, target_ms: float = 200.0,
            min_reps: int = 10, max_reps: int = 500, flush: bool = True,
            flops: float | None = None, bytes_moved: float | None = None) -> Timing:
    """Time ``fn()`` with CUDA/HIP events; each repeat is preceded by a cache flush.

    Give ``flops`` and ``bytes_moved`` (per call) to read TFLOP/s and GB/s off the result.
    """
    require_gpu()
    flusher = _Flusher() if flush else (lambda: None)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end), 1e-3)
    for _ in range(max(1, int(warmup_ms / estimate))):
        fn()
    reps = int(min(max_reps, max(min_reps, target_ms / estimate)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        flusher()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return Timing(statistics.median(times), min(times), max(times), reps, flops, bytes_moved)
