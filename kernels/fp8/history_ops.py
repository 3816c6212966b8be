"""Delayed scaling's per-step bookkeeping on the device, one launch each: the scale from an amax
history, and a step's amax entering its history with its saturation counted.

Why kernels: each is a handful of scalar operations (compare, divide, select; shift a 16-entry
history), which as torch ops were a dozen device ops per tensor and step (``where``, ``gt``,
``div``, ``ones_like``, ``mul``, ``cat``, ``copy_``, ...), each a launch on a GPU's host
(:mod:`workbench.harness.device_ops`); a Float8Linear under delayed scaling made 41 device ops per
forward (measured at commit 1df93df). One program each, bit for bit the torch expressions they
replace as the CPU evaluates them (the division is IEEE, ``tl.math.div_rn``, as in
:mod:`kernels.gemm_fp8.quantize_kernel`; torch on a GPU divides by a Python float through its
reciprocal, an ulp off at times) (:mod:`kernels.fp8.recipes.delayed` says what the rules are;
``tests/test_fp8_history_ops.py``, ``tests/test_fp8_delayed_dy.py`` and
``tests/test_fp8_training.py`` check the histories, counts and scales).

Both are ``torch.library`` custom ops (the record declares the history and the counts it
writes), so ``torch.compile`` keeps them, their writes included, in its graphs; an eager call
that nothing traces runs the launch itself (:func:`kernels.eager.direct`).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import eager
from ..outputs import new_output
from ..triton_support import next_power_of_2


@triton.jit
def _scale_kernel(seen_ptr, amax_ptr, scale_ptr, FMAX: tl.constexpr):
    """seen (the history's max) / FMAX, the current amax while seen is 0, 1 for both 0."""
    seen = tl.load(seen_ptr)
    ref = tl.where(seen > 0, seen, tl.load(amax_ptr))
    tl.store(scale_ptr, tl.where(ref > 0, tl.math.div_rn(ref, FMAX), 1.0))


@triton.jit
def _record_kernel(history_ptr, counts_ptr, amax_ptr, scale_ptr, index, H,
                   LIMIT: tl.constexpr, AT_LIMIT: tl.constexpr, BLOCK: tl.constexpr):
    """history (H entries, newest first) shifted by one with amax first; counts[index] + 1 where
    amax is beyond scale * LIMIT (or on it, with AT_LIMIT). A lane stores the entry another lane
    loads, so a barrier separates the loads of the old entries from the stores: no lane (of any
    warp, on any GPU: lanes of an NVIDIA warp are not ordered without one) writes an entry before
    every lane has read it."""
    amax = tl.load(amax_ptr)
    limit = tl.load(scale_ptr) * LIMIT
    if AT_LIMIT:
        saturated = amax >= limit
    else:
        saturated = amax > limit
    i = tl.arange(0, BLOCK)
    older = tl.load(history_ptr + i - 1, mask=(i >= 1) & (i < H), other=0.0)
    tl.debug_barrier()
    tl.store(history_ptr + i, tl.where(i == 0, amax, older), mask=i < H)
    tl.store(counts_ptr + index, tl.load(counts_ptr + index) + saturated.to(tl.int64))


def _scale_impl(seen: torch.Tensor, amax: torch.Tensor, fmax: float) -> torch.Tensor:
    scale = new_output((), torch.float32, seen.device)
    _scale_kernel.run(seen, amax, scale, fmax, grid=(1,), warmup=False, num_warps=1)
    return scale


_scale = torch.library.custom_op("kernels::fp8_history_scale", _scale_impl, mutates_args=())


@_scale.register_fake
def _(seen, amax, fmax):
    return seen.new_empty((), dtype=torch.float32)


def scale(seen: torch.Tensor, amax: torch.Tensor, fmax: float, direct: bool | None = None) -> torch.Tensor:
    """``seen / fmax`` (0-d float32: an amax history's max), ``amax / fmax`` (0-d float32: the
    current amax) while ``seen`` is 0, 1 where both are 0: a 0-d float32 on their device; one
    launch. Bitwise (as the CPU evaluates it) ``torch.where(ref > 0, ref / fmax, 1)`` with ``ref = torch.where(seen > 0,
    seen, amax)``. ``direct``: :func:`kernels.eager.direct` of the tensors, where the caller asked it
    once for several ops (None: asked here)."""
    if direct is None:
        direct = eager.direct(seen, amax)
    return (_scale_impl if direct else _scale)(seen, amax, fmax)


def _record_impl(history: torch.Tensor, counts: torch.Tensor, index: int, amax: torch.Tensor,
                 scale: torch.Tensor, limit: float, at_limit: bool) -> None:
    n = history.numel()
    _record_kernel.run(history, counts, amax, scale, index, n, limit, at_limit, max(next_power_of_2(n), 1),
                       grid=(1,), warmup=False, num_warps=1)


_record = torch.library.custom_op("kernels::fp8_record_amax", _record_impl, mutates_args=("history", "counts"))


@_record.register_fake
def _(history, counts, index, amax, scale, limit, at_limit):
    return None


def record(history: torch.Tensor, counts: torch.Tensor, index: int, amax: torch.Tensor, scale: torch.Tensor,
           limit: float, at_limit: bool, direct: bool | None = None) -> None:
    """In place, one launch: ``amax`` (0-d float32) enters ``history`` (contiguous float32,
    newest first; the oldest entry drops out), and ``counts[index]`` (int64) gains 1 where
    ``amax`` lies beyond ``scale * limit`` (0-d float32 and a float), or on it with
    ``at_limit``. ``direct``: as :func:`scale`'s."""
    if direct is None:
        direct = eager.direct(history, counts, amax, scale)
    (_record_impl if direct else _record)(history, counts, index, amax, scale, limit, at_limit)
