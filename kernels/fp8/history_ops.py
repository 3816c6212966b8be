"""Delayed scaling's per-step bookkeeping on the device, one launch each: the scale from an amax
history, and a step's amax entering its history with its saturation counted.

Each launch reduces what it reads itself: the scale the history (16 entries) and the amax
pass's partial maxima, the record the tile maxima of the cast with the given scale, so no
torch reduction (``history.amax()``, the cast's ``maxima.amax()``, a ``torch.stack`` of two
amaxes) and no launch reducing the partials comes before them: a Float8Linear's delayed forward
is 9 launches and no torch op but its bias's add (``tests/test_host_overhead_fp8.py`` counts them),
where the reductions made it 11 launches and 5 torch ops besides the bias's add (measured at commit
c50b686). Maxima are
>= 0, so a max over them (and 0 for none) is the amax bit for bit, in any order.

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
from ..gemm_fp8.quantize_kernel import PARTIALS, max_of, scale_of_amax
from ..outputs import new_output
from ..triton_support import next_power_of_2


# ``count`` (how many maxima: a shape's) is not specialized, ``index`` neither (which tensor of the
# layer): Triton would otherwise compile a binary for a value of 1, one for multiples of 16, one for
# the rest, per kernel
@triton.jit(do_not_specialize=["count"])
def _scale_kernel(history_ptr, maxima_ptr, scale_ptr, H, count, FMAX: tl.constexpr, H_BLOCK: tl.constexpr,
                  BLOCK: tl.constexpr):
    """max(history) / FMAX (H entries), the current amax's (the max of ``count`` maxima) while the
    history is all 0, 1 for both 0."""
    i = tl.arange(0, H_BLOCK)
    seen = tl.max(tl.load(history_ptr + i, mask=i < H, other=0.0))
    ref = tl.where(seen > 0, seen, max_of(maxima_ptr, count, BLOCK))
    tl.store(scale_ptr, scale_of_amax(ref, FMAX))


@triton.jit(do_not_specialize=["index", "count"])
def _record_kernel(history_ptr, counts_ptr, maxima_ptr, scale_ptr, index, H, count,
                   LIMIT: tl.constexpr, AT_LIMIT: tl.constexpr, H_BLOCK: tl.constexpr, BLOCK: tl.constexpr):
    """history (H entries, newest first) shifted by one with amax (the max of ``count`` maxima)
    first; counts[index] + 1 where amax is beyond scale * LIMIT (or on it, with AT_LIMIT). A lane
    stores the entry another lane loads, so a barrier separates the loads of the old entries from
    the stores: no lane (of any warp, on any GPU: lanes of an NVIDIA warp are not ordered without
    one) writes an entry before every lane has read it."""
    amax = max_of(maxima_ptr, count, BLOCK)
    limit = tl.load(scale_ptr) * LIMIT
    if AT_LIMIT:
        saturated = amax >= limit
    else:
        saturated = amax > limit
    i = tl.arange(0, H_BLOCK)
    older = tl.load(history_ptr + i - 1, mask=(i >= 1) & (i < H), other=0.0)
    tl.debug_barrier()
    tl.store(history_ptr + i, tl.where(i == 0, amax, older), mask=i < H)
    tl.store(counts_ptr + index, tl.load(counts_ptr + index) + saturated.to(tl.int64))


def _scale_impl(history: torch.Tensor, maxima: torch.Tensor, fmax: float) -> torch.Tensor:
    scale = new_output((), torch.float32, history.device)
    h = history.numel()
    _scale_kernel.run(history, maxima, scale, h, maxima.numel(), fmax, max(next_power_of_2(h), 1), PARTIALS,
                      grid=(1,), warmup=False, num_warps=1)
    return scale


_scale = torch.library.custom_op("kernels::fp8_history_scale", _scale_impl, mutates_args=())


@_scale.register_fake
def _(history, maxima, fmax):
    return history.new_empty((), dtype=torch.float32)


def scale(history: torch.Tensor, maxima: torch.Tensor, fmax: float, direct: bool | None = None) -> torch.Tensor:
    """``max(history) / fmax`` (``history``: an amax history, contiguous float32), the current
    amax's, ``max(maxima) / fmax``, while every entry is 0 (or there is none: a history of no
    entries makes it the maxima's scale, current scaling's) (``maxima``: contiguous float32 maxima
    of |x|, such as the amax pass's partials, :func:`kernels.gemm_fp8.quantize.amax_partials_checked`;
    none: 0), 1 where both are 0: a 0-d float32 on their device; one launch, which reduces both
    (no torch reduction before it). Bitwise (as the CPU evaluates it)
    ``torch.where(ref > 0, ref / fmax, 1)`` with ``ref = torch.where(history.amax() > 0,
    history.amax(), reduce_maxima(maxima))`` (:func:`kernels.gemm_fp8.quantize.reduce_maxima`: 0 for none; a
    max is exact in any order). ``direct``:
    :func:`kernels.eager.direct` of the tensors, where the caller asked it once for several ops
    (None: asked here)."""
    if direct is None:
        direct = eager.direct(history, maxima)
    return (_scale_impl if direct else _scale)(history, maxima, fmax)


def _record_impl(history: torch.Tensor, counts: torch.Tensor, index: int, maxima: torch.Tensor,
                 scale: torch.Tensor, limit: float, at_limit: bool) -> None:
    h = history.numel()
    _record_kernel.run(history, counts, maxima, scale, index, h, maxima.numel(), limit, at_limit,
                       max(next_power_of_2(h), 1), PARTIALS, grid=(1,), warmup=False, num_warps=1)


_record = torch.library.custom_op("kernels::fp8_record_amax", _record_impl, mutates_args=("history", "counts"))


@_record.register_fake
def _(history, counts, index, maxima, scale, limit, at_limit):
    return None


def record(history: torch.Tensor, counts: torch.Tensor, index: int, maxima: torch.Tensor, scale: torch.Tensor,
           limit: float, at_limit: bool, direct: bool | None = None) -> None:
    """In place, one launch: the amax, the max of ``maxima`` (contiguous float32 maxima of |x|,
    any shape: a fused cast's tile maxima, :func:`kernels.gemm_fp8.quantize.quantize_checked`
    with ``amax=True``; none: 0), enters ``history`` (contiguous float32, newest first; the
    oldest entry drops out), and ``counts[index]`` (int64) gains 1 where the amax lies beyond
    ``scale * limit`` (0-d float32 and a float), or on it with ``at_limit``. The launch reduces
    the maxima itself: no torch reduction before it. ``direct``: as :func:`scale`'s."""
    if direct is None:
        direct = eager.direct(history, counts, maxima, scale)
    (_record_impl if direct else _record)(history, counts, index, maxima, scale, limit, at_limit)
