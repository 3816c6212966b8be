"""The elementwise part of the fused MoE rung's backward in one pass: SwiGLU's derivative,
the routing weights' gradient and the weighted h that down's dW reads.

Per sorted row i (routing weight w, 1 where the caller weighted the gradient already) and
column j, from the down dX result dh (the gradient of h before the weight, x's dtype) and
the forward's saved g, u and h (x's dtype), in fp32:

* ``dw_rows[i] = Σ_j h·dh``, the routing weight's gradient;
* with dh' = w·dh and σ = sigmoid(g): ``dg = dh'·u·σ·(1 + g·(1 − σ))`` and ``du = dh'·g·σ``,
  rounded once to x's dtype;
* ``hw = h·w`` in x's dtype, the A operand of down's dW launch (not needed at weight 1).

With torch these were a chain of elementwise ops over (T·k, hidden), most of them writing
and reading fp32 temporaries; here each input is read once and each output written once:
4 reads and 3 writes of x's dtype per element, plus 4 bytes of w and of dw_rows per row.
Only what is asked is read, computed and written. The FP8 MoE layers' backward runs it too
for dg and du alone (3 reads, 2 writes): :mod:`kernels.moe.swiglu_op` for ``Float8MoE``,
and the expert-parallel FP8 owner (:mod:`kernels.moe.ep_fp8_layer`), whose capacity padding
rows past the last expert's end it bounds on the device (``rows_end``: they read nothing
and their outputs are 0, where the dX GEMM left dh unwritten). Their forward is
:mod:`.swiglu_forward` (h = g·σ(g)·u from the same σ), whose tile, checks and launch are
this kernel's (:mod:`.swiglu_rows`).

One program owns BLOCK_R rows and loops over their columns BLOCK_H at a time, so a row's
sum is added in one order on every run (blocks left to right; ``tl.sum`` within a block):
the same bits every time, no atomics. ``tests/test_moe_swiglu_isa.py`` compiles
the launches (v3's, the expert-parallel owner's at weight 1 and the FP8 owner's bounded one)
for gfx942 and gfx950: bf16 rows read and written 16 bytes per thread (BLOCK_R x BLOCK_H over
4 warps is 8 consecutive columns a thread), the routing weight read and the row sums written
4 bytes at a time, once per program, the sums' change of layout before their store the one
LDS round trip (none in the FP8 owner's, which sums nothing), no spills, 8 waves per SIMD.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...outputs import new_output
from ...registry import AotKernel
from ...triton_support import store_rows
from . import swiglu_rows
from .spec import AOT_SHAPE
from .swiglu_rows import check_rows, check_rows_end, col_block, launch, load_rows, row_block


@triton.jit
def _swiglu_backward_kernel(dh_ptr, g_ptr, u_ptr, h_ptr, w_ptr, end_ptr, dg_ptr, du_ptr, dw_ptr, hw_ptr, R, H,
                            stride_dh, stride_g, stride_u, stride_h, stride_w,
                            SWIGLU: tl.constexpr, DW_ROWS: tl.constexpr, WEIGHTED_H: tl.constexpr,
                            WEIGHTED: tl.constexpr, BOUNDED: tl.constexpr, BLOCK_R: tl.constexpr,
                            BLOCK_H: tl.constexpr, INTERP_BF16: tl.constexpr):
    rows, live, read = row_block(R, end_ptr, BOUNDED, BLOCK_R)   # past *end_ptr: inputs 0, so outputs 0
    if WEIGHTED:   # the outputs are contiguous: row stride H
        w = tl.load(w_ptr + rows * stride_w, mask=read, other=0.0)[:, None]
    total = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for start in range(0, H, BLOCK_H):
        cols, mask, loaded = col_block(start, H, live, read, BLOCK_H)
        if DW_ROWS or WEIGHTED_H:
            h = load_rows(h_ptr, rows, stride_h, cols, loaded)
        if SWIGLU or DW_ROWS:
            dh = load_rows(dh_ptr, rows, stride_dh, cols, loaded)
        if DW_ROWS:
            total += tl.sum(h * dh, axis=1)      # masked columns load as 0
        if WEIGHTED_H:
            store_rows(hw_ptr, rows, cols, H, 1, h * w, mask, INTERP_BF16)
        if SWIGLU:
            if WEIGHTED:
                dh = dh * w
            g = load_rows(g_ptr, rows, stride_g, cols, loaded)
            u = load_rows(u_ptr, rows, stride_u, cols, loaded)
            sig = tl.sigmoid(g)
            store_rows(dg_ptr, rows, cols, H, 1, dh * u * sig * (1 + g * (1 - sig)), mask, INTERP_BF16)
            store_rows(du_ptr, rows, cols, H, 1, dh * g * sig, mask, INTERP_BF16)
    if DW_ROWS:
        tl.store(dw_ptr + rows, total, mask=live)


def _check(dh, g, u, h, w, rows_end, swiglu: bool, dw_rows: bool, weighted_h: bool) -> None:
    """h (R, H) and the others the flags read: dh, g, u as :func:`.swiglu_rows.check_rows`
    has them; w fp32 with one value per row; rows_end as :func:`.swiglu_rows.check_rows_end`."""
    named = {"h": h}
    for name, t, needed in (("dh", dh, swiglu or dw_rows), ("g", g, swiglu), ("u", u, swiglu)):
        if needed:
            if t is None:
                raise ValueError(f"{name} is None, but the outputs asked for read it")
            named[name] = t
    check_rows(**named)
    if weighted_h and w is None:
        raise ValueError("weighted_h asks for h·w, but w is None (weight 1: use h itself)")
    if w is not None:
        if not isinstance(w, torch.Tensor) or w.dtype != torch.float32 \
                or tuple(w.shape) not in ((h.shape[0],), (h.shape[0], 1)) or w.device != h.device:
            raise ValueError(f"w must be a float32 tensor of one value per row, (R,) or (R, 1) with R = "
                             f"{h.shape[0]} on {h.device}, got {getattr(w, 'dtype', type(w))} "
                             f"{tuple(getattr(w, 'shape', ()))}")
    check_rows_end(rows_end, h.device)


def swiglu_backward(dh, g, u, h, w, *, swiglu: bool, dw_rows: bool, weighted_h: bool, rows_end=None):
    """``(dg, du, dw_rows, hw)`` over sorted rows, None for an output not asked: dg and du if
    ``swiglu``, dw_rows (R,) fp32 if ``dw_rows``, hw if ``weighted_h``; dg, du and hw in h's
    dtype, contiguous.

    ``dh`` (R, H): the gradient of h before the routing weight, read if ``swiglu`` or
    ``dw_rows``; ``g``, ``u`` (R, H): the saved pre-activations, read if ``swiglu``; ``h``
    (R, H): the saved SwiGLU output; ``w`` (R, 1) fp32: each row's routing weight, None for
    weight 1 (then ``weighted_h`` must be False: h is its own weighted copy). ``rows_end``:
    None, or an int32 tensor of one element on the device (the expert-parallel FP8 owner's
    ``offsets[-1:]``): the rows at or past it (capacity padding, whose dh the dX GEMM left
    unwritten) read nothing and get 0 in every output, with no host read of the bound."""
    _check(dh, g, u, h, w, rows_end, swiglu, dw_rows, weighted_h)
    rows, hidden = h.shape
    dtype, device = h.dtype, h.device
    dg = new_output((rows, hidden), dtype, device) if swiglu else None
    du = new_output((rows, hidden), dtype, device) if swiglu else None
    sums = new_output((rows,), torch.float32, device) if dw_rows else None
    hw = new_output((rows, hidden), dtype, device) if weighted_h else None
    if hidden == 0 and sums is not None:
        sums.zero_()                  # a row of no columns sums to 0
    if rows * hidden == 0 or not (swiglu or dw_rows or weighted_h):
        return dg, du, sums, hw
    weighted = w is not None and (swiglu or weighted_h)
    # an input or output the flags leave alone: h stands in for its pointer
    dh = dh if swiglu or dw_rows else h
    g, u = (g, u) if swiglu else (h, h)
    launch(_swiglu_backward_kernel, (
        dh, g, u, h, w if weighted else h, h if rows_end is None else rows_end, h if dg is None else dg,
        h if du is None else du, h if sums is None else sums, h if hw is None else hw, rows, hidden,
        dh.stride(0), g.stride(0), u.stride(0), h.stride(0), w.stride(0) if weighted else 0), rows, dtype,
        SWIGLU=swiglu, DW_ROWS=dw_rows, WEIGHTED_H=weighted_h, WEIGHTED=weighted, BOUNDED=rows_end is not None)
    return dg, du, sums, hw


def aot(dtype: torch.dtype = torch.bfloat16, weighted: bool = True, fp8_owner: bool = False) -> AotKernel:
    """The launch of a training step's backward with every output asked, at
    :data:`.spec.AOT_SHAPE` (DeepSeek-V3's 32 local experts: R = T·k rows of hidden columns,
    contiguous), for an ahead-of-time compile (:func:`workbench.isa.compile.compile_aot`; not
    a rung, so not in the inspector); ``weighted=False``: the expert-parallel owner's launch
    (weight 1, no h·w); ``fp8_owner=True`` (``weighted`` then ignored): the FP8 expert-parallel owner's with capacity
    (:mod:`kernels.moe.ep_fp8_layer`: dg and du only, weight 1, rows bounded by ``rows_end``). A
    pointer the flags leave unread is h's, as the launch passes it."""
    t, _, hidden, _, top_k, _ = AOT_SHAPE
    weighted = weighted and not fp8_owner
    ints = dict(R=t * top_k, H=hidden, stride_dh=hidden, stride_g=hidden, stride_u=hidden, stride_h=hidden,
                stride_w=1 if weighted else 0)
    return swiglu_rows.aot(_swiglu_backward_kernel, dtype, ints,
                           dict(SWIGLU=True, DW_ROWS=not fp8_owner, WEIGHTED_H=weighted, WEIGHTED=weighted,
                                BOUNDED=fp8_owner),
                           {**({"w_ptr": "*fp32"} if weighted else {}), **({"end_ptr": "*i32"} if fp8_owner else {}),
                            **({} if fp8_owner else {"dw_ptr": "*fp32"})})
