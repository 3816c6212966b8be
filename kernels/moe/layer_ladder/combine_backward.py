"""The gradient of ``Float8MoE``'s weighted combine (:mod:`kernels.moe.combine_op`) in one pass
over the sorted rows.

The combine is ``out[t] = Σ_j w[t, j] · y[row(t·k + j)]`` (:func:`.slot_sum.slot_sum`,
weighted, gathering). Given dy (T, D), each sorted row r (slot s = ``permutation[r]``, token
t = s // k) gets ``dy_sorted[r] = w[s] · dy[t]``, computed in fp32 and rounded once to y's
dtype, and the slot's weight ``dw[s] = Σ_d dy[t, d] · y[r, d]``, accumulated in fp32 across
the row's column blocks (float32 (T·k,): the routing weights' dtype). Torch's way (``(dy ·
w).to(dtype)`` and ``(y.float() · dy.float()).sum(-1)``) writes and reads float32 copies of
(T·k, D); here y is read once, dy once per slot (a gather by token), dy_sorted written
once, and nothing of (T·k, D) in float32. Each row's dot product is one program's, its column
blocks in order: the same bits on every run, no atomics (a structural fact, which a CPU run
cannot show). Each program writes its own rows of dy_sorted; dw is written at the slots
``permutation`` names, so no two writes meet only where it is a permutation
(:func:`kernels.moe.combine_op.combine` checks that unless told not to). The expert-parallel
layers (:mod:`kernels.moe.ep_layer`) run it on the sender's rows, already in slot order, with
the identity permutation (``arange(T·k)``), and the dispatch API's combines
(:mod:`kernels.comm.ep_dispatch`) at the experts' ranks, each received wire row a "token" whose
cells are its slots (``permutation``: each of y's rows' cell; the cells no row names are left
unwritten in dw). A float64 y is computed in float64, weights and dw float64 too
(:func:`kernels.triton_support.accumulated`).

Tile, launch and AOT description are :mod:`.swiglu_rows`'s (BLOCK_R rows a program, BLOCK_H
columns at a time, 16 bytes a thread for bf16). ``tests/test_moe_combine_isa.py`` compiles the
launch for gfx942 and gfx950: y and dy read and dy_sorted written 16 bytes per thread in
bf16, no spills.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...outputs import new_output
from ...registry import AotKernel
from ...triton_support import accumulated, store_rows
from . import swiglu_rows
from .spec import AOT_SHAPE
from .swiglu_rows import col_block, launch, load_rows, row_block


@triton.jit
def _combine_backward_kernel(dy_ptr, y_ptr, w_ptr, perm_ptr, dys_ptr, dw_ptr, R, D, TOP_K, stride_dy, stride_y,
                             BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, INTERP_BF16: tl.constexpr):
    rows, live, read = row_block(R, perm_ptr, False, BLOCK_R)
    slots = tl.load(perm_ptr + rows, mask=live, other=0)
    tokens = slots // TOP_K
    w = tl.load(w_ptr + slots, mask=live, other=0.0)[:, None]
    dot = accumulated(tl.zeros((BLOCK_R,), dtype=y_ptr.dtype.element_ty))
    for start in range(0, D, BLOCK_H):
        cols, mask, loaded = col_block(start, D, live, read, BLOCK_H)
        dy = load_rows(dy_ptr, tokens, stride_dy, cols, loaded)
        dot += tl.sum(dy * load_rows(y_ptr, rows, stride_y, cols, loaded), axis=1)
        store_rows(dys_ptr, rows, cols, D, 1, w * dy, mask, INTERP_BF16)
    tl.store(dw_ptr + slots, dot, mask=live)


def combine_backward(dy: torch.Tensor, y_sorted: torch.Tensor, weights: torch.Tensor,
                     permutation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dy_sorted (T·k, D) in y's dtype, dw (T, k) float32, float64 for float64 y) of the combine's
    gradient dy (T, D): dy and y_sorted with unit column stride, weights contiguous in dw's dtype,
    permutation the int64 (T·k,) sort of the slots (:func:`kernels.moe.permutation.sort_slots`'s); checked by
    :func:`kernels.moe.combine_op.combine`, which calls this through its autograd formula."""
    rows, d = y_sorted.shape
    dy_sorted = new_output((rows, d), y_sorted.dtype, y_sorted.device)
    dw = new_output(tuple(weights.shape), torch.promote_types(y_sorted.dtype, torch.float32), weights.device)
    if rows * d:
        launch(_combine_backward_kernel, (dy, y_sorted, weights, permutation, dy_sorted, dw, rows, d,
                                          weights.shape[1], dy.stride(0), y_sorted.stride(0)), rows, y_sorted.dtype)
    elif rows:
        dw.zero_()   # no columns: every dot product is empty
    return dy_sorted, dw


def aot(dtype: torch.dtype = torch.bfloat16) -> AotKernel:
    """The launch at :data:`.spec.AOT_SHAPE` (R = T·k sorted rows of dim columns, contiguous),
    for an ahead-of-time compile (:func:`workbench.isa.compile.compile_aot`; not a rung)."""
    t, dim, _, _, top_k, _ = AOT_SHAPE
    ints = dict(R=t * top_k, D=dim, TOP_K=top_k, stride_dy=dim, stride_y=dim)
    return swiglu_rows.aot(_combine_backward_kernel, dtype, ints, {}, {"w_ptr": "*fp32", "perm_ptr": "*i64",
                                                                      "dw_ptr": "*fp32"})
