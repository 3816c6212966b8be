"""v3 fused: gather + gate/up GEMM + SwiGLU in one kernel, down GEMM + weighted scatter in
another, and a backward of two grouped GEMMs per expert GEMM on saved activations.

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
    The k slots of each token are then summed in float32 in slot order by a small kernel
    that rounds once on the store (:mod:`.slot_sum`; top_k == 1: the buffer is the
    output), so no float32 copy of the buffer is made.

    Program order: both kernels' programs walk super-rows
    (:func:`~kernels.moe.grouped_gemm.schedule.super_rows`): GROUP_M = 8 row tiles, all
    their column panels, panel by panel, then the next 8. A row tile's gathered x rows
    (h rows in kernel 2) are then used by programs that run close together, not once per
    column panel a whole grid column apart, and each panel of w[e] serves 8 row tiles in
    a row.

    Config: the grouped GEMM's pruned space, pruned again for these two kernels
    (:mod:`.configs`, ``tuned_space.json``), timed per problem on a GPU; at DeepSeek-V3's
    shape the untimed choice is the grouped GEMM's 128 x 128 x 64 tile with 8 warps
    (the fixed 128 x 64 tile with 8 warps this rung ran before read kernel 1's operands
    from LDS two bytes at a time); its loops read them with ``ds_read_b128`` on gfx942, and the ISA
    test holds both kernels to no 16-bit LDS op, no spills and 2 waves per SIMD on gfx942
    and gfx950.

    Backward (:mod:`.v3_backward`): the forward keeps g and u (kernel 1 stores them
    beside h when a gradient is needed) and h, the slots and the offsets; the backward
    runs, per expert GEMM, its dX and its dW grouped GEMM (6 launches, no forward GEMM),
    SwiGLU's derivative, the routing weights' gradient and the weighted h in one fp32
    pass over the rows (:mod:`.swiglu_backward`), and sums x's gradient with the k-sum
    kernel. Memory for FLOPs: the saved tensors are
    3·T·k·hidden elements in x's dtype plus 8·T·k + 4·E bytes of indices (DeepSeek-V3's
    local experts in bf16: 0.40 GB per layer), where recomputing them would run the
    three forward GEMMs again: a training step's expert GEMM FLOPs are 3 units (forward,
    dX, dW) instead of 4. Forward and
    backward are the custom ops ``kernels::moe_fused`` and ``kernels::moe_fused_backward``,
    so ``torch.compile(fullgraph=True)`` runs them as they are.

    Host side: everything the forward decides but the slots' order follows from the inputs'
    metadata and whether it saves g and u, so both kernels' tuned configs, grids and
    arguments, and the k-sum's, are decided once per kind of input and kept (a launch plan,
    :mod:`kernels.plans`); a repeated call sorts the slots, allocates and launches.

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
    unpermute), and gate and up share every A tile they load. The backward's expert
    GEMM FLOPs are two units per forward GEMM, not three (no recompute).

Expected bound:
    As v2's grouped GEMMs: compute at many rows per expert, the experts' weights
    (3·E·dim·hidden·S bytes read once) at few; the activations' share of the traffic
    is the model's v3 bytes above.

Limits:
    In training, kernel 1 writes g and u as well as h (2·R·hidden·S more bytes than the
    model above). The backward's operands are not gathered in the load: it copies the
    output gradient's rows and x's rows into sorted order (R·dim each). Gathered A rows are
    scattered reads (one row per token, not one block), which the hardware coalesces
    only within a row; a token's row is read once per slot (k times). The two
    accumulators double kernel 1's registers: 256 x 128, 128 x 256 and, capped at 2
    waves, 128 x 128 at 4 warps spill there on gfx942 and gfx950 and are pruned, though
    the grouped GEMM keeps them. No persistent scheduling and no XCD remap: the upper-bound grid has up to
    G surplus row tiles, whose programs exit.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ... import backend as _backend
from ... import eager, plans
from ...outputs import new_output
from ...registry import AotKernel, rung
from ...tuning import with_overrides
from ...triton_support import aot_launch, cdiv, interp_bf16, next_power_of_2, round_to_bf16, run_kwargs, store_rows
from ..grouped_gemm.schedule import group_tiles, locate, super_rows
from ..grouped_gemm.tiles import operand, reduce_tiles
from ..routing import route
from . import configs
from .checks import moe_operands
from .slot_sum import SlotSum
from .spec import AOT_SHAPE, DTYPES
from .v3_backward import fused_backward

GROUP_M = 8   # row tiles per super-row of both kernels' program order


@triton.jit
def _program_tile(offsets_ptr, R, N, G, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, BLOCK_G: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's (group, sorted rows, the group's end row, columns, first K step) on the
    grouped GEMM's device schedule, rows bounded by R (= T·k, the sorted rows), in super-row
    order over the upper-bound grid's (cdiv(R, BLOCK_M) + G) x cdiv(N, BLOCK_N) tiles; group
    >= G for a surplus program. Both kernels start here."""
    starts, ends, tiles, cum = group_tiles(offsets_ptr, G, R, BLOCK_M, BLOCK_G)
    row_tile, col_tile = super_rows(tl.program_id(0), tl.cdiv(R, BLOCK_M) + G, tl.cdiv(N, BLOCK_N),
                                    GROUP_M)
    group, start, end = locate(row_tile, starts, ends, tiles, cum, BLOCK_M, BLOCK_G)
    rows = start + tl.arange(0, BLOCK_M)
    cols = col_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    return group, rows, end, cols, tl.arange(0, BLOCK_K)


@triton.jit
def _weight_tile(w_ptr, group, ks, cols, stride_wg, stride_wk, stride_wn):
    """Pointers to the first (BLOCK_K, BLOCK_N) tile of expert ``group``'s weight, in int64
    (an operand of 2^31+ elements would wrap in i32)."""
    return (w_ptr + group.to(tl.int64) * stride_wg + ks.to(tl.int64)[:, None] * stride_wk
            + cols.to(tl.int64)[None, :] * stride_wn)


@triton.jit
def _gate_up_kernel(x_ptr, gate_ptr, up_ptr, h_ptr, g_ptr, u_ptr, slot_ptr, offsets_ptr, R, N, K, G,
                    TOP_K, stride_xt, stride_xk, stride_wg, stride_wk, stride_wn, stride_ht, stride_hn,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    BLOCK_G: tl.constexpr, GROUP_M: tl.constexpr, SAVE: tl.constexpr,
                    INTERP_BF16: tl.constexpr):
    group, rows, end, cols, ks = _program_tile(offsets_ptr, R, N, G, BLOCK_M, BLOCK_N, BLOCK_K, BLOCK_G,
                                               GROUP_M)
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
    store_rows(h_ptr, rows, cols, stride_ht, stride_hn, h, a_rows & b_cols, INTERP_BF16)
    if SAVE:   # the pre-activations, for a backward without a forward GEMM (g and u strided as h)
        store_rows(g_ptr, rows, cols, stride_ht, stride_hn, g, a_rows & b_cols, INTERP_BF16)
        store_rows(u_ptr, rows, cols, stride_ht, stride_hn, u, a_rows & b_cols, INTERP_BF16)


@triton.jit
def _down_scatter_kernel(h_ptr, down_ptr, out_ptr, slot_ptr, weight_ptr, offsets_ptr, R, N, K, G,
                         stride_ht, stride_hk, stride_wg, stride_wk, stride_wn,
                         stride_os, stride_on,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         BLOCK_G: tl.constexpr, GROUP_M: tl.constexpr, INTERP_BF16: tl.constexpr):
    group, rows, end, cols, ks = _program_tile(offsets_ptr, R, N, G, BLOCK_M, BLOCK_N, BLOCK_K, BLOCK_G,
                                               GROUP_M)
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


def config(backend: str, arch: str = "gfx942", dtype: torch.dtype | None = None) -> tuple[dict, dict]:
    """(kernel 1, kernel 2) settings a launch at :data:`.spec.AOT_SHAPE` takes untimed here at
    ``dtype``: the first of :func:`.configs.pruned` for each (what the ISA inspector compiles)."""
    t, dim, hidden, e, top_k, _ = AOT_SHAPE
    return (configs.pruned(backend, arch, t * top_k, hidden, e, dtype)[0],
            configs.pruned(backend, arch, t * top_k, dim, e, dtype)[0])


def _grid(rows: int, n: int, groups: int, cfg: dict) -> tuple[int]:
    """The upper-bound grid, one dimension: the schedule orders its programs (super-rows)."""
    return ((cdiv(rows, cfg["BLOCK_M"]) + groups) * cdiv(n, cfg["BLOCK_N"]),)


class GateUp:
    """Kernel 1's launch on operands of one metadata with settings ``cfg``: every argument but
    the tensors decided (h, g and u as :func:`gate_up_outputs` makes them, contiguous)."""

    def __init__(self, x, gate, rows: int, top_k: int, save: bool, cfg: dict):
        groups, dim, hidden = gate.shape
        self.save = save
        self.scalars = (rows, hidden, dim, groups, top_k, *x.stride(), *gate.stride(), hidden, 1)
        self.kwargs = run_kwargs(_grid(rows, hidden, groups, cfg), dict(
            BLOCK_G=next_power_of_2(groups), GROUP_M=GROUP_M, SAVE=save, INTERP_BF16=interp_bf16(x.dtype), **cfg))

    def __call__(self, x, gate, up, slots, offsets, h, g, u) -> None:
        _gate_up_kernel.run(x, gate, up, h, g if self.save else h, u if self.save else h, slots, offsets,
                            *self.scalars, **self.kwargs)


class Down:
    """Kernel 2's launch on operands of one metadata with settings ``cfg`` (h strided as ``h``,
    the slot buffer contiguous, the routing weights flat float32): all but the tensors decided."""

    def __init__(self, h, down, rows: int, cfg: dict):
        groups, hidden, dim = down.shape
        self.shape = (rows, dim)   # the slot buffer's
        self.scalars = (rows, dim, hidden, groups, *h.stride(), *down.stride(), dim, 1)
        self.kwargs = run_kwargs(_grid(rows, dim, groups, cfg), dict(
            BLOCK_G=next_power_of_2(groups), GROUP_M=GROUP_M, INTERP_BF16=interp_bf16(h.dtype), **cfg))

    def __call__(self, h, down, out, slots, weights, offsets) -> None:
        _down_scatter_kernel.run(h, down, out, slots, weights, offsets, *self.scalars, **self.kwargs)


def _launch(kernel: str, make, operands: tuple, rows: int, n: int, groups: int, dtype: torch.dtype,
            cfg: dict | None, layer: tuple):
    """``make(cfg)``, the launch (:class:`GateUp`, :class:`Down`) with settings ``cfg``, or, without
    ``cfg``, with the config :mod:`.configs` picks for this problem on this device (a new key is
    timed on ``operands``); ``layer``: the layer's (T, dim, hidden, E, top_k), for a ranker."""
    if cfg is None:
        here = _backend.current()
        cfg = configs.choose(kernel, here.name, here.arch, rows, n, groups, dtype,
                             lambda cfg: make(cfg)(*operands), layer)
    return make(cfg)


def gate_up_outputs(x, rows: int, hidden: int, save: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Kernel 1's (h, g, u): h (rows, hidden) in x's dtype, g and u as h with ``save``, else (0, hidden)."""
    kept = (rows if save else 0, hidden)
    return (new_output((rows, hidden), x.dtype, x.device), new_output(kept, x.dtype, x.device),
            new_output(kept, x.dtype, x.device))


def _gate_up(x, gate, up, slots, offsets, top_k, save: bool, outputs: tuple, cfg: dict | None) -> GateUp:
    """Kernel 1's launch on these operands: ``cfg``, else tuned (timed into ``outputs``, (h, g, u))."""
    (groups, dim, hidden), rows = gate.shape, slots.shape[0]
    return _launch("gate_up", lambda cfg: GateUp(x, gate, rows, top_k, save, cfg),
                   (x, gate, up, slots, offsets, *outputs), rows, hidden, groups, x.dtype, cfg,
                   (x.shape[0], dim, hidden, groups, top_k))


def _down(h, down, slots, weights, flat, offsets, out, cfg: dict | None) -> Down:
    """Kernel 2's launch on these operands (``weights`` as given, (T, k) or (R,), and ``flat``
    as kernel 2 reads them, :func:`_flat`): ``cfg``, else tuned (timed into ``out``)."""
    (groups, hidden, dim), rows = down.shape, slots.shape[0]
    tokens, top_k = weights.shape[0], weights.shape[1] if weights.dim() > 1 else 1   # (T, k); (R,): k = 1
    return _launch("down", lambda cfg: Down(h, down, rows, cfg), (h, down, out, slots, flat, offsets),
                   rows, dim, groups, h.dtype, cfg, (tokens, dim, hidden, groups, top_k))


def _flat(weights: torch.Tensor) -> torch.Tensor:
    """The routing weights as kernel 2 reads them: flat float32, by slot."""
    return weights.reshape(-1).float().contiguous()


def gate_up_saving(x, gate, up, slots, offsets, top_k, save: bool, cfg: dict | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Kernel 1: (h, g, u), h (T·k, hidden) in sorted order from x itself (gathered in the load),
    with ``save`` the pre-activations g and u too (else two empty (0, hidden) tensors);
    ``cfg`` pins the settings (else tuned)."""
    h, g, u = gate_up_outputs(x, slots.shape[0], gate.shape[2], save)
    _gate_up(x, gate, up, slots, offsets, top_k, save, (h, g, u), cfg)(x, gate, up, slots, offsets, h, g, u)
    return h, g, u


def gate_up(x, gate, up, slots, offsets, top_k, cfg: dict | None = None) -> torch.Tensor:
    """Kernel 1's h alone (:func:`gate_up_saving` without saving)."""
    return gate_up_saving(x, gate, up, slots, offsets, top_k, False, cfg)[0]


def down_scatter(h, down, slots, weights, offsets, cfg: dict | None = None) -> torch.Tensor:
    """Kernel 2: the weighted rows of h·down[e] at their slots, (T·k, dim) in h's dtype;
    ``cfg`` pins the settings (else tuned)."""
    out, flat = new_output((slots.shape[0], down.shape[2]), h.dtype, h.device), _flat(weights)
    _down(h, down, slots, weights, flat, offsets, out, cfg)(h, down, out, slots, flat, offsets)
    return out


_PLANS = plans.PlanCache()


def _plan(x, weights, ids, gate, up, down, save: bool, slots, offsets) -> tuple:
    """(kernel 1's launch, kernel 2's, the k-sum's or None for top_k == 1) for inputs of this
    metadata, each config chosen as :func:`gate_up_saving` and :func:`down_scatter` choose it
    (a new key timed into outputs of its own): what a fused forward on inputs of the same
    metadata keeps (:mod:`kernels.plans`)."""
    top_k = ids.shape[1]
    outputs = gate_up_outputs(x, slots.shape[0], gate.shape[2], save)
    out = new_output((slots.shape[0], down.shape[2]), x.dtype, x.device)
    return (_gate_up(x, gate, up, slots, offsets, top_k, save, outputs, None),
            _down(outputs[0], down, slots, weights, _flat(weights), offsets, out, None),
            SlotSum(out, top_k) if top_k > 1 else None)


def fused_forward(x, weights, ids, gate, up, down, save: bool) -> tuple[torch.Tensor, ...]:
    """(out (T, dim), g, u, h, slots, offsets): the routed experts for a routing, in two kernels
    and a k-sum, and what the backward needs (g and u empty unless ``save``); no autograd.
    The launches are the kept plan of the inputs' metadata and ``save`` (:func:`_plan`)."""
    (t, top_k), (groups, _, hidden) = ids.shape, gate.shape
    offsets, slots = sort_slots(ids, groups)
    if t == 0:
        empty = x.new_zeros((0, hidden))
        return x.new_zeros((0, down.shape[2])), empty, empty.clone(), empty.clone(), slots, offsets
    kernel1, kernel2, k_sum = _PLANS(plans.meta(x, weights, ids, gate, up, down, extra=(save,)), _plan,
                                     x, weights, ids, gate, up, down, save, slots, offsets)
    h, g, u = gate_up_outputs(x, slots.shape[0], hidden, save)
    kernel1(x, gate, up, slots, offsets, h, g, u)
    per_slot = new_output(kernel2.shape, x.dtype, x.device)
    kernel2(h, down, per_slot, slots, _flat(weights), offsets)
    return (per_slot if top_k == 1 else k_sum(per_slot)), g, u, h, slots, offsets


NEEDS = (0, 1, 3, 4, 5)   # the inputs with a gradient: x, weights, gate, up, down


class _FusedExperts(torch.autograd.Function):
    """Forward: :func:`fused_forward`, saving what the backward needs when a gradient is;
    backward: :func:`.v3_backward.fused_backward`, no forward GEMM. Expert weights of another
    dtype than x's (fp32 master weights under autocast, :func:`.fused_op.fused_experts`)
    are cast here, where autograd records no cast, and their gradients come in their own dtype."""

    @staticmethod
    def forward(ctx, x, weights, ids, gate, up, down):
        ctx.wgrad_dtype = None
        if gate.dtype != x.dtype:
            ctx.wgrad_dtype = gate.dtype
            gate, up, down = (w.to(x.dtype) for w in (gate, up, down))
        out, *saved = fused_forward(x, weights, ids, gate, up, down, any(ctx.needs_input_grad))
        ctx.save_for_backward(x, weights, gate, up, down, *saved)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable   # the backward launches kernels: no graph of its own
    def backward(ctx, grad_out):
        dx, dweights, dgate, dup, ddown = fused_backward(
            grad_out, *ctx.saved_tensors, [ctx.needs_input_grad[i] for i in NEEDS], ctx.wgrad_dtype)
        return dx, dweights, None, dgate, dup, ddown


def fused_experts(x, weights, ids, gate, up, down) -> torch.Tensor:
    """The experts' part of the layer for a given routing (as :func:`.v2_grouped.routed_experts`):
    x (T, dim), weights (T, k) float32 and ids (T, k) -> (T, dim); differentiable in x,
    weights and the expert weights. :class:`kernels.MoE` runs the same as a custom op
    (:mod:`.fused_op`)."""
    return _FusedExperts.apply(x, weights, ids, gate, up, down)


fused_experts_autograd = eager.applier(_FusedExperts, tensors=6)
""":func:`fused_experts` for a call that only autograd watches (:data:`kernels.eager.AUTOGRAD`),
entered without ``Function.apply``'s Python preamble (:func:`kernels.eager.applier`)."""


def _ints(shape, kernel: str) -> dict[str, int]:
    """Int arguments of kernel "gate_up" or "down" at ``shape`` with contiguous operands."""
    t, dim, hidden, e, top_k, _ = shape
    if kernel == "gate_up":
        return dict(R=t * top_k, N=hidden, K=dim, G=e, TOP_K=top_k, stride_xt=dim, stride_xk=1,
                    stride_wg=dim * hidden, stride_wk=hidden, stride_wn=1, stride_ht=hidden,
                    stride_hn=1)
    return dict(R=t * top_k, N=dim, K=hidden, G=e, stride_ht=hidden, stride_hk=1, stride_wg=hidden * dim,
                stride_wk=dim, stride_wn=1, stride_os=dim, stride_on=1)


def aot(dtype: torch.dtype, backend: str, arch: str, overrides: dict | None = None) -> list[AotKernel]:
    """Kernel 1 (gather + gate/up + SwiGLU, saving g and u as in training) and kernel 2 (down +
    weighted scatter) at :data:`.spec.AOT_SHAPE`, DeepSeek-V3's 32 local experts, each with
    the config its launch takes untimed there (:func:`config`).

    ``overrides`` replaces settings of both; ``{"kernel": "gate_up"}`` (or "down") among them
    compiles that one alone (how ``workbench.isa.tune_space`` compiles each candidate twice)."""
    settings = dict(overrides or {})
    only = settings.pop("kernel", None)
    if only is not None and only not in configs.KERNELS:
        raise ValueError(f"kernel must be one of {list(configs.KERNELS)}, got {only!r}")
    fixed = {"INTERP_BF16": False, "BLOCK_G": triton.next_power_of_2(AOT_SHAPE[3]), "GROUP_M": GROUP_M,
             "SAVE": True}
    indices = {"offsets_ptr": "*i32", "slot_ptr": "*i64", "weight_ptr": "*fp32"}
    launches = zip(configs.KERNELS, (_gate_up_kernel, _down_scatter_kernel), config(backend, arch, dtype))
    return [aot_launch(fn, dtype, with_overrides(cfg, settings), _ints(AOT_SHAPE, name), fixed, indices)
            for name, fn, cfg in launches if only in (None, name)]


@rung(op="moe", rung=3, name="fused", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="triton", aot=aot, backward=True)
def moe_fused(x, router, gate, up, down, top_k):
    moe_operands(x, router, gate, up, down, top_k, DTYPES)
    weights, ids = route(F.linear(x.float(), router.float()), top_k)
    return fused_experts(x, weights, ids, gate, up, down)
