"""v3 fused: gather + gate/up GEMM + SwiGLU in one kernel, down GEMM + weighted scatter in another.

Idea:
    v2 moves the activations through HBM five times around its GEMMs: permute writes
    x_sorted, gate and up each read it and write their output, SwiGLU reads both and
    writes h, unpermute reads the down GEMM's output back. v3 keeps the routing (float32,
    :func:`kernels.moe.route`) and the stable sort of the token-slots by expert, but
    sorts only *indices*: the offsets and, per sorted row, the slot ``t·k + j`` it came
    from. Kernel 1 runs over (expert, row tile, hidden tile) on the grouped GEMM's
    device schedule (:mod:`kernels.moe.grouped_gemm.schedule`); its A rows are loaded
    straight from x through the slots' token ids (the gather happens in the load), one
    K loop feeds two fp32 accumulators, x·gate[e] and x·up[e], from the same A tile, and
    the epilogue writes ``h = silu(g)·u`` (T·k, hidden) in sorted order, rounded once.
    Kernel 2 runs over (expert, row tile, dim tile): h·down[e] with the grouped GEMM's
    K loop (:mod:`kernels.moe.grouped_gemm.tiles`); its epilogue multiplies each row by
    its slot's routing weight and stores it at the slot's place of a (T, k, dim) buffer
    in x's dtype: a permutation, so no two programs write one element and no atomics.
    The k slots of each token are then summed in float32 in slot order (top_k == 1:
    the buffer is the output). x's dtype for the buffer, not float32: v2 also rounds
    each slot's output once before its float32 sum, so the error is v2's, at half the
    bytes of an fp32 buffer for 16-bit dtypes.

    The backward is v2's: an autograd Function whose backward recomputes the routed
    experts through :func:`.v2_grouped.routed_experts` (permute, grouped GEMMs with
    their own backward kernels, unpermute) and differentiates that.

Why faster:
    Traffic (model, :func:`.spec.modelled_bytes`): with R = T·k rows and S bytes per
    element, v2 moves S·(2·T·dim + 5·R·dim + 6·R·hidden) bytes of activations (x read,
    x_sorted written and read twice, g and u written and read, h written and read,
    y written and read, out written); v3 moves S·(T·dim + 3·R·dim + 2·R·hidden) for
    top_k > 1 (x gathered once per slot, h written and read, the slot buffer written
    and read, out written) and S·(2·T·dim + 2·R·hidden) for top_k == 1. Saved per call:
    S·(T·dim + 2·R·dim + 4·R·hidden) (top_k > 1). For DeepSeek-V3's local experts
    (T 4096, dim 7168, hidden 2048, k 8) in bf16 that is 1.5 GB of v2's 6.1 GB per
    call, weights included (model).
    Two launches for the experts instead of v2's six (gather, three GEMMs, SwiGLU,
    unpermute), and gate and up share every A tile they load.

Expected bound:
    As v2's grouped GEMMs: compute at many rows per expert, the experts' weights
    (3·E·dim·hidden·S bytes read once) at few; the activations' share of the traffic
    is the model's v3 bytes above.

Limits:
    The backward is not fused yet: it recomputes v2's forward (gather, three grouped
    GEMMs) and runs v2's backward, so a training step pays v2's traffic plus v3's
    forward. Gathered A rows are scattered reads (one row per token, not one block),
    which the hardware coalesces only within a row; a token's row is read once per
    slot (k times). One fixed tile per backend, not tuned (v4 of the grouped GEMM
    ladder tunes); the two accumulators double the registers of the epilogue, so
    kernel 1 runs a 128 x 64 tile on GPUs. No persistent scheduling.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ... import backend as _backend
from ...outputs import new_output
from ...registry import AotKernel, rung
from ...triton_support import aot_launch, cdiv, interp_bf16, round_to_bf16
from ..grouped_gemm.launch import config as gemm_config
from ..grouped_gemm.schedule import group_tiles, locate
from ..grouped_gemm.tiles import operand, reduce_tiles
from ..routing import route
from .checks import moe_operands
from .spec import AOT_SHAPE, DTYPES
from .v2_grouped import routed_experts


@triton.jit
def _program_tile(offsets_ptr, R, G, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, BLOCK_G: tl.constexpr):
    """This program's (group, sorted rows, the group's end row, columns, first K step) on the
    grouped GEMM's device schedule, rows bounded by R (= T·k, the sorted rows); group >= G for
    a surplus program. Both kernels start here."""
    starts, ends, tiles, cum = group_tiles(offsets_ptr, G, R, BLOCK_M, BLOCK_G)
    group, start, end = locate(tl.program_id(0), starts, ends, tiles, cum, BLOCK_M, BLOCK_G)
    rows = start + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    return group, rows, end, cols, tl.arange(0, BLOCK_K)


@triton.jit
def _weight_tile(w_ptr, group, ks, cols, stride_wg, stride_wk, stride_wn):
    """Pointers to the first (BLOCK_K, BLOCK_N) tile of expert ``group``'s weight, in int64
    (an operand of 2^31+ elements would wrap in i32)."""
    return (w_ptr + group.to(tl.int64) * stride_wg + ks.to(tl.int64)[:, None] * stride_wk
            + cols.to(tl.int64)[None, :] * stride_wn)


@triton.jit
def _gate_up_kernel(x_ptr, gate_ptr, up_ptr, h_ptr, slot_ptr, offsets_ptr, R, N, K, G, TOP_K,
                    stride_xt, stride_xk, stride_wg, stride_wk, stride_wn, stride_ht, stride_hn,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    BLOCK_G: tl.constexpr, INTERP_BF16: tl.constexpr):
    group, rows, end, cols, ks = _program_tile(offsets_ptr, R, G, BLOCK_M, BLOCK_N, BLOCK_K, BLOCK_G)
    if group >= G:  # a surplus program of the upper-bound grid
        return
    a_rows, b_cols = rows[:, None] < end, cols[None, :] < N
    # The gather: row i of the tile is token slot[i] // k of x itself, not a sorted copy.
    # exercise begin: gather
    tokens = tl.load(slot_ptr + rows, mask=rows < end, other=0) // TOP_K
    # exercise end
    # int64 offsets: an operand of 2^31+ elements would wrap in i32.
    x_ptrs = x_ptr + tokens.to(tl.int64)[:, None] * stride_xt + ks.to(tl.int64)[None, :] * stride_xk
    g_ptrs = _weight_tile(gate_ptr, group, ks, cols, stride_wg, stride_wk, stride_wn)
    u_ptrs = _weight_tile(up_ptr, group, ks, cols, stride_wg, stride_wk, stride_wn)
    x_step, w_step = tl.cast(stride_xk, tl.int64) * BLOCK_K, tl.cast(stride_wk, tl.int64) * BLOCK_K
    g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    full = (K // BLOCK_K) * BLOCK_K
    for _ in range(0, full, BLOCK_K):   # one A tile, two products: both GEMMs share the load
        a = operand(x_ptrs, a_rows, INTERP_BF16)
        g = tl.dot(a, operand(g_ptrs, b_cols, INTERP_BF16), g, input_precision="ieee")
        u = tl.dot(a, operand(u_ptrs, b_cols, INTERP_BF16), u, input_precision="ieee")
        x_ptrs += x_step
        g_ptrs += w_step
        u_ptrs += w_step
    if full < K:   # the ragged last step, peeled: the loop above compares nothing against K
        a = operand(x_ptrs, a_rows & (ks[None, :] + full < K), INTERP_BF16)
        b_mask = (ks[:, None] + full < K) & b_cols
        g = tl.dot(a, operand(g_ptrs, b_mask, INTERP_BF16), g, input_precision="ieee")
        u = tl.dot(a, operand(u_ptrs, b_mask, INTERP_BF16), u, input_precision="ieee")
    # exercise begin: swiglu
    h = g * tl.sigmoid(g) * u   # SwiGLU in fp32, rounded once on the store
    # exercise end
    if INTERP_BF16:
        h = round_to_bf16(h)
    h_ptrs = h_ptr + rows.to(tl.int64)[:, None] * stride_ht + cols.to(tl.int64)[None, :] * stride_hn
    tl.store(h_ptrs, h.to(h_ptr.dtype.element_ty), mask=a_rows & b_cols)


@triton.jit
def _down_scatter_kernel(h_ptr, down_ptr, out_ptr, slot_ptr, weight_ptr, offsets_ptr, R, N, K, G,
                         stride_ht, stride_hk, stride_wg, stride_wk, stride_wn,
                         stride_os, stride_on,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         BLOCK_G: tl.constexpr, INTERP_BF16: tl.constexpr):
    group, rows, end, cols, ks = _program_tile(offsets_ptr, R, G, BLOCK_M, BLOCK_N, BLOCK_K, BLOCK_G)
    if group >= G:  # a surplus program of the upper-bound grid
        return
    h_ptrs = h_ptr + rows.to(tl.int64)[:, None] * stride_ht + ks.to(tl.int64)[None, :] * stride_hk
    w_ptrs = _weight_tile(down_ptr, group, ks, cols, stride_wg, stride_wk, stride_wn)
    acc = reduce_tiles(h_ptrs, w_ptrs, tl.cast(stride_hk, tl.int64) * BLOCK_K,
                       tl.cast(stride_wk, tl.int64) * BLOCK_K, rows[:, None] < end,
                       cols[None, :] < N, K, BLOCK_M, BLOCK_N, BLOCK_K, INTERP_BF16)
    # The scatter: row i goes, weighted, to its slot t·k + j; the slots are a permutation.
    # exercise begin: weight
    slots = tl.load(slot_ptr + rows, mask=rows < end, other=0)
    acc = acc * tl.load(weight_ptr + slots, mask=rows < end, other=0.0)[:, None]
    # exercise end
    if INTERP_BF16:
        acc = round_to_bf16(acc)
    # exercise begin: scatter
    out_ptrs = out_ptr + slots.to(tl.int64)[:, None] * stride_os + cols.to(tl.int64)[None, :] * stride_on
    # exercise end
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < end) & (cols[None, :] < N))


def sort_slots(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert ids (T, k) -> (offsets int32 (E,), slots int64 (T·k,)): :func:`kernels.moe.permute`'s
    stable order by expert, as indices only (row i of the sorted order is slot ``slots[i]``)."""
    sorted_ids, slots = torch.sort(ids.reshape(-1), stable=True)
    experts = torch.arange(num_experts, device=ids.device, dtype=sorted_ids.dtype)
    return torch.searchsorted(sorted_ids, experts, right=True).to(torch.int32), slots


def config(backend: str, arch: str = "gfx942") -> tuple[dict, dict]:
    """(kernel 1, kernel 2) settings: the grouped GEMM's tile, halved in N for kernel 1 on
    GPUs, where its two accumulators and two B tiles would double registers and LDS."""
    down = gemm_config(backend, arch)
    if backend == "interpreter":
        return down, down
    return {**down, "BLOCK_N": down["BLOCK_N"] // 2}, down


def gate_up(x, gate, up, slots, offsets, top_k, cfg) -> torch.Tensor:
    """Kernel 1: h (T·k, hidden) in sorted order, from x itself (gathered in the load)."""
    (groups, dim, hidden), rows = gate.shape, slots.shape[0]
    h = new_output((rows, hidden), x.dtype, x.device)
    grid = (cdiv(rows, cfg["BLOCK_M"]) + groups, cdiv(hidden, cfg["BLOCK_N"]))
    _gate_up_kernel[grid](x, gate, up, h, slots, offsets, rows, hidden, dim, groups, top_k,
                          *x.stride(), *gate.stride(), *h.stride(),
                          BLOCK_G=triton.next_power_of_2(groups), INTERP_BF16=interp_bf16(x.dtype), **cfg)
    return h


def down_scatter(h, down, slots, weights, offsets, cfg) -> torch.Tensor:
    """Kernel 2: the weighted rows of h·down[e] at their slots, (T·k, dim) in h's dtype."""
    (groups, hidden, dim), rows = down.shape, slots.shape[0]
    out = new_output((rows, dim), h.dtype, h.device)
    grid = (cdiv(rows, cfg["BLOCK_M"]) + groups, cdiv(dim, cfg["BLOCK_N"]))
    _down_scatter_kernel[grid](h, down, out, slots, weights.reshape(-1).float().contiguous(),
                               offsets, rows, dim, hidden, groups, *h.stride(), *down.stride(), *out.stride(),
                               BLOCK_G=triton.next_power_of_2(groups), INTERP_BF16=interp_bf16(h.dtype),
                               **cfg)
    return out


def fused_forward(x, weights, ids, gate, up, down) -> torch.Tensor:
    """The routed experts (T, dim) for a routing, in two kernels and a k-sum; no autograd."""
    (t, top_k), dim = ids.shape, down.shape[2]
    if t == 0:
        return x.new_zeros((0, dim))
    offsets, slots = sort_slots(ids, gate.shape[0])
    here = _backend.current()
    cfg1, cfg2 = config(here.name, here.arch)
    h = gate_up(x, gate, up, slots, offsets, top_k, cfg1)
    per_slot = down_scatter(h, down, slots, weights, offsets, cfg2).view(t, top_k, dim)
    if top_k == 1:
        return per_slot.view(t, dim)
    return per_slot.float().sum(dim=1).to(x.dtype)


class _FusedExperts(torch.autograd.Function):
    """Forward: :func:`fused_forward`. Backward: v2's, recomputed (see Limits)."""

    @staticmethod
    def forward(ctx, x, weights, ids, gate, up, down):
        ctx.save_for_backward(x, weights, ids, gate, up, down)
        return fused_forward(x, weights, ids, gate, up, down)

    @staticmethod
    def backward(ctx, grad_out):
        x, weights, ids, gate, up, down = ctx.saved_tensors
        inputs = [t.detach().requires_grad_(need) for t, need in
                  zip((x, weights, gate, up, down), (ctx.needs_input_grad[i] for i in (0, 1, 3, 4, 5)))]
        wanted = [t for t in inputs if t.requires_grad]
        with torch.enable_grad():
            out = routed_experts(inputs[0], inputs[1], ids, *inputs[2:])
            grads = iter(torch.autograd.grad(out, wanted, grad_out) if wanted else ())
        dx, dweights, dgate, dup, ddown = (next(grads) if t.requires_grad else None for t in inputs)
        return dx, dweights, None, dgate, dup, ddown


def fused_experts(x, weights, ids, gate, up, down) -> torch.Tensor:
    """The experts' part of the layer for a given routing (as :func:`.v2_grouped.routed_experts`):
    x (T, dim), weights (T, k) float32 and ids (T, k) -> (T, dim); differentiable in x,
    weights and the expert weights."""
    return _FusedExperts.apply(x, weights, ids, gate, up, down)


def _ints(shape, kernel: int) -> dict[str, int]:
    """Int arguments of kernel 1 or 2 at ``shape`` with contiguous operands."""
    t, dim, hidden, e, top_k, _ = shape
    if kernel == 1:
        return dict(R=t * top_k, N=hidden, K=dim, G=e, TOP_K=top_k, stride_xt=dim, stride_xk=1,
                    stride_wg=dim * hidden, stride_wk=hidden, stride_wn=1, stride_ht=hidden,
                    stride_hn=1)
    return dict(R=t * top_k, N=dim, K=hidden, G=e, stride_ht=hidden, stride_hk=1, stride_wg=hidden * dim,
                stride_wk=dim, stride_wn=1, stride_os=dim, stride_on=1)


def aot(dtype: torch.dtype, backend: str, arch: str) -> list[AotKernel]:
    """Kernel 1 (gather + gate/up + SwiGLU) and kernel 2 (down + weighted scatter) at
    :data:`.spec.AOT_SHAPE`, DeepSeek-V3's 32 local experts."""
    fixed = {"INTERP_BF16": False, "BLOCK_G": triton.next_power_of_2(AOT_SHAPE[3])}
    cfg1, cfg2 = config(backend, arch)
    indices = {"offsets_ptr": "*i32", "slot_ptr": "*i64", "weight_ptr": "*fp32"}
    return [aot_launch(_gate_up_kernel, dtype, cfg1, _ints(AOT_SHAPE, 1), fixed, indices),
            aot_launch(_down_scatter_kernel, dtype, cfg2, _ints(AOT_SHAPE, 2), fixed, indices)]


@rung(op="moe", rung=3, name="fused", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="triton", aot=aot, backward=True)
def moe_fused(x, router, gate, up, down, top_k):
    moe_operands(x, router, gate, up, down, top_k, DTYPES)
    weights, ids = route(F.linear(x.float(), router.float()), top_k)
    return fused_experts(x, weights, ids, gate, up, down)
