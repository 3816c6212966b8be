"""The k-sum of the fused MoE rung: each token's k slot rows summed in float32, stored once
in the rows' dtype.

The forward's down kernel leaves one weighted row per token-slot, (T·k, dim) in x's dtype,
and the token's output is their sum; the backward's two dX GEMMs leave one row per
slot each, in sorted order, and x's gradient is the sum of a token's 2·k rows. Upcasting
the whole buffer with torch (``buf.float().sum(1)``) would write and read a float32 copy
of (T·k, dim): twice the bytes of the buffer for 16-bit dtypes. This kernel loads each
row in its own dtype, adds in an fp32 register tile and rounds once on the store, so
the result is the float32 sum's, and nothing of (T·k, dim) is written in float32.

One program per (BLOCK_T tokens, BLOCK_D columns); the slots are added in slot order,
j = 0..k-1 (for a pair, a's row then b's per slot): the same bits on every run. With a
float32 weight per slot (``w`` (T, k): ``Float8MoE``'s combine, :mod:`kernels.moe.combine_op`, and
the expert-parallel layers' on rows already in slot order, :mod:`kernels.moe.ep_layer`) each
slot's row of ``a`` (no pair) is multiplied by it in fp32 before the add. A float64 ``a`` (the
dispatch API's, :mod:`kernels.comm.ep_dispatch`) is added, and weighted by float64 weights, in
float64 instead (:func:`kernels.triton_support.accumulated`): a float32 sum would drop its bits.

A 16 x 128 tile over 4 warps is 8 consecutive columns a thread: a bf16 row moves 16 bytes per
thread. ``tests/test_moe_combine_isa.py`` compiles ``Float8MoE``'s gathering launches (:func:`aot`)
for gfx942 and gfx950: each slot's row one 16-byte load a thread with its int64 index (and
weight), the sum one 16-byte store, no LDS, no spills, 8 waves per SIMD. The tile was 16 x 64
(8 bytes a thread) before it served that combine; the fused rung's and the expert-parallel
layers' launches (pairs; the sender's sums, weighted or not; all ungathered) take the same
tile, whose compiles no test checks and whose time no GPU has measured.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...outputs import new_output
from ...registry import AotKernel
from ...triton_support import accumulated, aot_launch, cdiv, interp_bf16, round_to_bf16, run_kwargs
from .spec import AOT_SHAPE

BLOCK_T, BLOCK_D = 16, 128


@triton.jit
def _slot_sum_kernel(a_ptr, b_ptr, rows_ptr, w_ptr, out_ptr, T, D, TOP_K, stride_a, stride_b, stride_o,
                     PAIR: tl.constexpr, GATHER: tl.constexpr, WEIGHTED: tl.constexpr, BLOCK_T: tl.constexpr,
                     BLOCK_D: tl.constexpr, INTERP_BF16: tl.constexpr):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = (tokens[:, None] < T) & (cols[None, :] < D)
    acc = accumulated(tl.zeros((BLOCK_T, BLOCK_D), dtype=a_ptr.dtype.element_ty))
    for j in range(TOP_K):
        slots = tokens.to(tl.int64) * TOP_K + j      # slot t·k + j; int64: T·k·D may pass 2^31
        rows = slots
        if GATHER:   # the slot's row in a buffer of another order
            rows = tl.load(rows_ptr + slots, mask=tokens < T, other=0)
        row = accumulated(tl.load(a_ptr + rows[:, None] * stride_a + cols[None, :], mask=mask))
        if WEIGHTED:
            row *= tl.load(w_ptr + slots, mask=tokens < T, other=0.0)[:, None]
        acc += row
        if PAIR:
            acc += accumulated(tl.load(b_ptr + rows[:, None] * stride_b + cols[None, :], mask=mask))
    if INTERP_BF16:
        acc = round_to_bf16(acc)
    tl.store(out_ptr + tokens.to(tl.int64)[:, None] * stride_o + cols[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=mask)


class SlotSum:
    """One k-sum's launch on rows of one metadata: ``a`` (T·k, D) with unit column stride, ``b``
    (if given) strided as it is, ``gather`` whether ``rows`` are given, ``weighted`` whether
    ``w`` is; every argument but the tensors decided, for a launch plan (:mod:`.v3_fused`) to keep."""

    def __init__(self, a: torch.Tensor, top_k: int, b: torch.Tensor | None = None, gather: bool = False,
                 weighted: bool = False):
        slots, d = a.shape
        t = slots // top_k
        self.shape, self.empty = (t, d), t * d == 0
        # out is new_output's: contiguous, row stride D
        self.scalars = (t, d, top_k, a.stride(0), (a if b is None else b).stride(0), d)
        self.kwargs = run_kwargs((cdiv(t, BLOCK_T), cdiv(d, BLOCK_D)), dict(
            PAIR=b is not None, GATHER=gather, WEIGHTED=weighted, BLOCK_T=BLOCK_T, BLOCK_D=BLOCK_D,
            INTERP_BF16=interp_bf16(a.dtype)))

    def __call__(self, a: torch.Tensor, b: torch.Tensor | None = None, rows: torch.Tensor | None = None,
                 w: torch.Tensor | None = None) -> torch.Tensor:
        out = new_output(self.shape, a.dtype, a.device)
        if not self.empty:
            _slot_sum_kernel.run(a, a if b is None else b, a if rows is None else rows, a if w is None else w, out,
                                 *self.scalars, **self.kwargs)
        return out


def slot_sum(a: torch.Tensor, top_k: int, b: torch.Tensor | None = None,
             rows: torch.Tensor | None = None, w: torch.Tensor | None = None) -> torch.Tensor:
    """(T, D) in a's dtype: out[t] = Σ_j w[t, j] · a[r(t·k + j)] (+ b[r(t·k + j)]) in float32
    (float64 for a float64 a), for a and b (T·k, D) with unit column stride, r the identity or
    the int64 ``rows`` (T·k,), w the contiguous (T, k) in that type (not with b) or 1."""
    if w is not None and b is not None:
        raise ValueError("slot_sum weights a's rows alone: pass w or b, not both")
    return SlotSum(a, top_k, b, rows is not None, w is not None)(a, b, rows, w)


def aot(dtype: torch.dtype = torch.bfloat16, weighted: bool = True) -> AotKernel:
    """``Float8MoE``'s gathering launch at :data:`.spec.AOT_SHAPE` (T tokens, k slots of dim
    columns, contiguous), for an ahead-of-time compile (:func:`workbench.isa.compile.compile_aot`;
    not a rung): the combine's (``weighted``, float32 weights) or permute's backward (weight 1,
    a's pointer standing in for w's, as the call passes it)."""
    t, dim, _, _, top_k, _ = AOT_SHAPE
    ints = dict(T=t, D=dim, TOP_K=top_k, stride_a=dim, stride_b=dim, stride_o=dim)
    return aot_launch(_slot_sum_kernel, dtype, dict(BLOCK_T=BLOCK_T, BLOCK_D=BLOCK_D, num_warps=4), ints,
                      dict(PAIR=False, GATHER=True, WEIGHTED=weighted, INTERP_BF16=False),
                      {"rows_ptr": "*i64", **({"w_ptr": "*fp32"} if weighted else {})})
