"""Cross-entropy over rows of logits in three Triton passes: the rows, their mean, the gradient.

The training model's ``F.cross_entropy(logits.float(), targets)`` writes an fp32 copy of the
bf16 logits, which log_softmax reads and writes again, and its backward writes an fp32
gradient and casts it back. Here the forward reads the logits once, in their own dtype, and
keeps one fp32 log-sum-exp per row (as its max and the log of the sum of exponentials past it: softmax
is then ``exp((x - max) - log_sum)`` as torch computes it, where ``exp(x - lse)`` with lse
rounded to fp32 loses the absolute precision of a value near 100: 4e-6 relative at scale
30); the backward reads them once more and writes the gradient
once, rounded from fp32 to the logits' dtype.

All three passes share one fp32 *state* of 3R + 1 values (:func:`_state`): each row's loss, max and
log_sum, a column of R each, then the rows counted; the forward returns it beside the mean loss
and the backward reads it. One buffer where there were three (the row losses, an (R, 2) max and
log_sum, the count): the forward allocates two tensors, not four, and each allocation costs the
host about 1 µs a call (``workbench bench overhead``). The mean loss stays its own 0-d tensor: a
custom op's outputs may not alias each other (:mod:`.ops`).

- :func:`_rows_kernel`: one program per row walks its V columns BLOCK_V at a time with an online
  max and sum (``s·e^(m - m') + Σ e^(x - m')``), so any V (not a power of two, up to 256K and
  past) is one loop, and writes the row's loss ``(max - x[target]) + log_sum`` (0 where the
  target is ``ignore_index``), its max and its log_sum into the state.
- :func:`_mean_kernel`: one program sums the state's row losses and counts the rows not ignored,
  in a fixed order (no atomics: the same inputs give the same bits), and writes the mean (the
  loss) and the count (into the state; 0 rows counted give 0/0 = nan, as torch).
- :func:`_gradient_kernel`: one program per row writes ``(softmax - onehot)·dloss/count``, from
  the max, log_sum and count the state kept; an ignored row reads nothing and gets 0, also where
  its logits hold a NaN (torch's ``0·exp(nan)`` is NaN there: a row no loss reads gets no
  gradient here).

A target outside [0, V) that is not ``ignore_index`` cannot raise without reading the targets
on the host (torch's CUDA kernel asserts on the device instead): its row's loss and log_sum are
NaN, so the mean and that row's gradient are NaN, never a finite wrong answer;
:func:`check_targets` raises torch's ``IndexError`` where a caller asks for the host read.

``tests/test_cross_entropy_isa.py`` compiles :func:`aot`'s launches (bf16, V = 32000) for gfx942
and gfx950: the logits read and the gradient written 16 bytes per thread in the loop over V,
no spills, no scratch, 8 waves per SIMD for the row passes.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..outputs import new_output
from ..registry import AotKernel
from ..triton_support import aot_launch, cols_if, interp_bf16, next_power_of_2, run_args, store_rows

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
LANES = 64              # a CDNA wave; on NVIDIA (32 lanes) a thread then holds two 16-byte pieces
NUM_WARPS = 4
MEAN_BLOCK, MEAN_WARPS = 1024, 4
AOT_SHAPE = (16384, 32000)   # rows x vocabulary of the training step's GPU preset


@triton.jit
def _state(state_ptr, R):
    """Where the fp32 state of R rows keeps each row's loss, max and log_sum, and the rows counted:
    three columns of R, then the count. Each found R past the one before, a step that fits R's
    int32 where 2·R or 3·R would overflow it past 1G or 715M rows."""
    tops = state_ptr + R
    log_sums = tops + R
    return state_ptr, tops, log_sums, log_sums + R


@triton.jit
def _rows_kernel(logits_ptr, targets_ptr, state_ptr, R, V, stride_row, stride_target, ignore_index,
                 BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)   # int64: row·stride passes 2^31 past 67K rows of 32K
    line = logits_ptr + row * stride_row
    cols = tl.arange(0, BLOCK_V)
    top = tl.full((), float("-inf"), tl.float32)
    total = tl.zeros((), tl.float32)
    for start in range(0, V, BLOCK_V):
        x = tl.load(line + start + cols, mask=start + cols < V, other=float("-inf")).to(tl.float32)
        new_top = tl.maximum(top, tl.max(x, axis=0))
        total = total * tl.exp(top - new_top) + tl.sum(tl.exp(x - new_top), axis=0)
        top = new_top
    target = tl.load(targets_ptr + row * stride_target)
    ignored = target == ignore_index
    inside = (target >= 0) & (target < V)
    picked = tl.load(line + target, mask=inside & ~ignored, other=0.0).to(tl.float32)
    log_total = tl.where(inside | ignored, tl.log(total), float("nan"))   # a target out of range: NaN
    losses, tops, log_sums, _ = _state(state_ptr, R)
    tl.store(losses + row, tl.where(ignored, 0.0, (top - picked) + log_total))   # torch's -log_softmax
    tl.store(tops + row, top)
    tl.store(log_sums + row, log_total)


@triton.jit
def _mean_kernel(targets_ptr, state_ptr, loss_ptr, R, stride_target, ignore_index, BLOCK: tl.constexpr):
    losses, _, _, count_ptr = _state(state_ptr, R)
    rows = tl.arange(0, BLOCK)
    total = tl.zeros((BLOCK,), tl.float32)
    counted = tl.zeros((BLOCK,), tl.int32)
    for start in range(0, R, BLOCK):
        inside = start + rows < R
        total += tl.load(losses + start + rows, mask=inside, other=0.0)
        target = tl.load(targets_ptr + (start + rows).to(tl.int64) * stride_target, mask=inside, other=ignore_index)
        counted += (target != ignore_index).to(tl.int32)
    count = tl.sum(counted, axis=0).to(tl.float32)
    tl.store(loss_ptr, tl.sum(total, axis=0) / count)
    tl.store(count_ptr, count)


@triton.jit
def _gradient_kernel(logits_ptr, targets_ptr, state_ptr, dloss_ptr, dlogits_ptr, R, V, stride_row, stride_target,
                     ignore_index, BLOCK_V: tl.constexpr, INTERP_BF16: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    line = logits_ptr + row * stride_row
    target = tl.load(targets_ptr + row * stride_target)
    kept = target != ignore_index
    _, tops, log_sums, count_ptr = _state(state_ptr, R)
    scale = tl.where(kept, tl.load(dloss_ptr) / tl.load(count_ptr), 0.0)
    top = tl.load(tops + row)
    log_total = tl.load(log_sums + row)
    cols = tl.arange(0, BLOCK_V)
    for start in range(0, V, BLOCK_V):
        x = tl.load(line + start + cols, mask=cols_if(start + cols, V, kept), other=0.0).to(tl.float32)
        grad = (tl.exp((x - top) - log_total) - tl.where(start + cols == target, 1.0, 0.0)) * scale
        grad = tl.where(kept, grad, 0.0)   # an ignored row is 0 whatever its max and sum (inf, nan)
        store_rows(dlogits_ptr, tl.full((1,), 0, tl.int64) + row, start + cols, V, 1, grad[None, :],
                   (start + cols < V)[None, :], INTERP_BF16)


@functools.lru_cache(maxsize=64)
def settings(vocab: int, dtype: torch.dtype) -> dict:
    """The row passes' constexprs and compile options for V = ``vocab`` columns of ``dtype``,
    on every backend and in the AOT compile (:func:`aot`): one function, so the ISA tests
    compile what a call launches.

    Why these: both row passes are bound by reading the logits, so a thread reads 16 bytes of
    a row at a time (``16 / itemsize`` columns, one ``buffer_load_dwordx4``) and a block is
    two of those per thread over NUM_WARPS waves of LANES: 4096 bf16 or fp16 columns, 2048
    fp32, two loads in flight per thread per iteration, and V = 32000 is 8 iterations of bf16
    with the last one masked (V need not be a power of two; 256K is 64 iterations with two
    scalars carried, nothing more kept per row). A smaller V gets the next power of two, so
    a short row loads no masked block bigger than itself, and as many warps as still give each
    lane its two pieces (at least one), so warps are not idle copies. Four waves of few
    registers per row keep 8 waves per SIMD (the ISA test asserts both), enough rows in flight
    to hide the loads.
    """
    per_thread = 16 // dtype.itemsize
    widest = 2 * per_thread * LANES * NUM_WARPS
    block = min(widest, max(16, next_power_of_2(vocab)))
    return dict(BLOCK_V=block, num_warps=max(1, min(NUM_WARPS, block // (2 * per_thread * LANES))))


def check_targets(targets: torch.Tensor, vocab: int, ignore_index: int) -> None:
    """Raise torch's ``IndexError`` for a target outside [0, ``vocab``) that is not
    ``ignore_index``: reads the targets on the host (a sync on a GPU), so only where asked."""
    bad = (targets != ignore_index) & ((targets < 0) | (targets >= vocab))
    if bad.any():
        raise IndexError(f"Target {int(targets[bad][0])} is out of bounds (logits have {vocab} classes, "
                         f"ignore_index={ignore_index}).")


class Launches:
    """The three launches on logits (R = ``rows``, V = ``vocab``) of ``dtype`` whose rows lie
    ``stride_row`` apart (columns adjacent), targets ``stride_target`` apart, and ``ignore_index``:
    every argument after the tensors worked out once (:func:`kernels.triton_support.run_args`),
    so a call only allocates and launches. A launch plan keeps them (:mod:`.ops`)."""

    def __init__(self, rows: int, vocab: int, dtype: torch.dtype, stride_row: int, stride_target: int,
                 ignore_index: int):
        chosen = settings(vocab, dtype)
        ints = (rows, vocab, stride_row, stride_target, ignore_index)
        self.any_rows, self.any_cells = rows > 0, rows * vocab > 0
        self.state_shape, self.shape = (3 * rows + 1,), (rows, vocab)
        self.row_args, self.row_kwargs = run_args(_rows_kernel, 3, ints, (rows,), chosen)
        self.mean_args, self.mean_kwargs = run_args(_mean_kernel, 3, (rows, stride_target, ignore_index), (1,),
                                                    dict(BLOCK=MEAN_BLOCK, num_warps=MEAN_WARPS))
        self.gradient_args, self.gradient_kwargs = run_args(_gradient_kernel, 5, ints, (rows,),
                                                            dict(chosen, INTERP_BF16=interp_bf16(dtype)))

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean loss (), fp32; the state (3R + 1,), fp32: each row's loss, max and log_sum, a
        column of R each, then the rows counted), the backward's input (:func:`_state`)."""
        device = logits.device
        state = new_output(self.state_shape, torch.float32, device)
        loss = new_output((), torch.float32, device)
        if self.any_rows:
            _rows_kernel.run(logits, targets, state, *self.row_args, **self.row_kwargs)
        _mean_kernel.run(targets, state, loss, *self.mean_args, **self.mean_kwargs)
        return loss, state

    def backward(self, dloss: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor,
                 state: torch.Tensor) -> torch.Tensor:
        """dlogits, contiguous, in the logits' dtype."""
        dlogits = new_output(self.shape, logits.dtype, logits.device)
        if self.any_cells:
            _gradient_kernel.run(logits, targets, state, dloss, dlogits, *self.gradient_args, **self.gradient_kwargs)
        return dlogits


def aot(dtype: torch.dtype = torch.bfloat16) -> list[AotKernel]:
    """The forward's two launches and the backward's at :data:`AOT_SHAPE`, contiguous logits,
    targets of unit stride, ignore_index -100, for an ahead-of-time compile
    (:func:`workbench.isa.compile.compile_aot`): the row pass, the mean, the gradient."""
    rows, vocab = AOT_SHAPE
    chosen = settings(vocab, dtype)
    ints = dict(R=rows, V=vocab, stride_row=vocab, stride_target=1, ignore_index=-100)
    fp32 = "*fp32"
    return [
        aot_launch(_rows_kernel, dtype, chosen, ints, pointers=dict(targets_ptr="*i64", state_ptr=fp32)),
        aot_launch(_mean_kernel, dtype, dict(BLOCK=MEAN_BLOCK, num_warps=MEAN_WARPS), ints,
                   pointers=dict(targets_ptr="*i64", state_ptr=fp32, loss_ptr=fp32)),
        aot_launch(_gradient_kernel, dtype, chosen, ints, dict(INTERP_BF16=False),
                   pointers=dict(targets_ptr="*i64", state_ptr=fp32, dloss_ptr=fp32)),
    ]
