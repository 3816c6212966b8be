"""Expert-parallel dispatch and combine with DeepEP's API shape, on torch.distributed.

An expert-parallel MoE layer keeps E/W experts on each of W ranks. ``dispatch`` moves each
token's hidden row to the ranks of its top-k experts and hands every rank its rows
grouped by local expert, ready for a grouped GEMM; ``combine`` brings the expert outputs
back and sums them per token with the routing weights. DeepEP (deepseek-ai/DeepEP) does
this with NVLink/RDMA kernels; here the wire is ``torch.distributed.all_to_all_single``
with uneven splits, tested on gloo (CPU). The header travels as a CPU tensor
(:func:`._checks.exchange`), so on GPUs the group needs a CPU backend too
(``backend="cpu:gloo,cuda:nccl"``); not run on a GPU yet.

What travels, per call: one small all-gather of a header (sizes, dtypes, mode, split
sizes), so that ranks that disagree raise the same ``ValueError`` instead of hanging; one
all-to-all of routing metadata (token index, expert ids, weights: 2 + 2·C int64 per wire
row); one all-to-all of the payload. ``dedup=False`` sends one payload row per (token,
expert) pair, ``dedup=True`` one per (token, destination rank), copied to each local
expert on receipt (:func:`.ep_layout.dispatch_layout` counts both).

Host reads: ``all_to_all_single`` takes its split sizes as host ints, so a dispatch waits
for its device once, in one read of the ids' min and max (their range check) and of its
rows to each rank (:meth:`EPDispatcher._read`), as DeepEP's normal mode reads its counts
in its notify step. What a rank receives from each rank comes with the header, a CPU
tensor whose read waits for the collective, not for a device; the receiver's index
arithmetic runs without ``nonzero`` or ``bincount``, which size their outputs from the
values. ``combine`` and both backward passes read nothing from the device (a test traps
every read). A fixed-capacity dispatch with no read at all, as the MoE layer's
``ep_capacity`` (:mod:`kernels.moe.ep_exchange`), is not offered here.

Order of ``recv_x``: grouped by local expert ascending; within an expert by (source rank,
source token index, k). Both modes produce the same rows in the same order.

``fp8=True`` quantizes each wire row to float8_e4m3fn with one float32 scale
``s = amax(|row|)/448`` and ships both as the row's bytes (gloo has no fp8 dtype:
:mod:`.row_bytes`); DeepEP's fp8 dispatch scales each 128 channels instead, which this does
not offer. Error bound per
element, before the final cast to x's dtype: ``|x' - x| <= 2^-4·|x| + 2^-10·s`` (3 mantissa
bits round to within 2^-4 relative for normal values; below 2^-6·s the subnormal spacing
2^-9·s gives the absolute term); the cast to x's dtype adds its own half-ulp. Rows must be
finite (an inf makes its row's scale inf). Gradients pass through the quantization
unchanged (straight-through).

Autograd: dispatch's backward sends the gradient rows back and sums them per source token
(a combine without weights); combine's backward dispatches ``grad_out`` and returns
gradients for ``y`` and for ``topk_weights``. Both are collectives: every rank must run
backward through the same dispatches and combines, as with any distributed layer.

The sums over a token's k rows are the MoE's Triton kernels, as in the expert-parallel layer
(:mod:`kernels.moe.ep_layer`): the order-preserving combine's weighted k-sum is
:func:`kernels.moe.layer_ladder.slot_sum.slot_sum` on the rows home in slot order, and both
combines' backward is :func:`kernels.moe.layer_ladder.combine_backward.combine_backward` at the
experts' ranks (``w·dy`` and the weights' gradient ``dy·y`` in one pass over y's rows), so no
torch op computes over a (T, k, dim) tensor or the (T·k, dim) slot rows, and in fp16/bf16 none
writes them in float32 (tests/test_ep_dispatch_k_sum.py). Products and sums run in float32,
in float64 for float64 (the kernels accumulate a float64 operand in float64:
:func:`kernels.triton_support.accumulated`), each result rounded once to its dtype. The
reducing combine's per-wire-row and per-token sums and dispatch's backward
(:func:`_sum_to_sources`) stay torch sums in that precision: their grids hold cells no row
serves (a dedup handle's token has no row on a rank it does not go to), which a gathering
k-sum, reading one row per cell, cannot skip.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..gemm_fp8.quantize_ref import dequantize, quantize_one
from ..moe.layer_ladder.combine_backward import combine_backward
from ..moe.layer_ladder.slot_sum import slot_sum
from ..moe.layer_ladder.swiglu_rows import unit_columns
from . import _checks as check
from . import row_bytes
from .ep_layout import EPLayout, check_id_range, checked_ids, device_counts, dispatch_layout, expert_split

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True, eq=False)
class EPHandle:
    """What combine and the backward passes need from one dispatch.

    Sender side (this rank's T tokens, top-k K):
        ``layout``: the :class:`.EPLayout` of this rank's ``topk_ids``.
        ``topk_weights``: the caller's (T, K) weights; combine differentiates through them.
        ``send_splits``: wire rows to each rank. ``send_token`` (S,): the source token of
        each wire row, in wire order (by destination rank, then token, then k).
        ``send_cell`` (S,): the wire row's cell in a (T, ``send_cols``) grid, ``t·K + k``
        (naive, send_cols = K) or ``t·W + rank`` (dedup, send_cols = W): a per-token
        buffer where answers per wire row are summed in a fixed order.
        ``slot_order`` (T·K,): the slots ``t·K + k`` in (destination rank, t, k) order,
        the order in which one row per pair comes back. ``send_pairs``: (token, k) pairs
        to each rank (``layout.rows_per_rank`` as host ints).
    Receiver side (R rows of ``recv_x``):
        ``recv_splits``: wire rows from each rank. ``recv_cols``: pairs a wire row can
        carry (1 naive, K dedup). ``recv_cell`` (R,): ``wire row · recv_cols + column``
        of each recv_x row. ``recv_perm`` (R,): recv_x row i is pair ``recv_perm[i]`` in
        (source rank, token, k) order. ``pair_splits``: recv_x rows from each rank.
        ``recv_counts`` (E/W,): rows per local expert. ``recv_src``, ``recv_token``,
        ``recv_topk`` (R,): source rank, its token index and k of each row.
        ``recv_weights`` (R,): the routing weight of each row, in topk_weights' dtype.
    ``serial``: the dispatcher's call count, checked by combine so that ranks cannot
    pass handles of different dispatches.
    """

    group: object
    rank: int
    world_size: int
    serial: int
    layout: EPLayout
    topk_weights: torch.Tensor
    send_splits: list
    send_token: torch.Tensor
    send_cell: torch.Tensor
    send_cols: int
    slot_order: torch.Tensor
    send_pairs: list
    recv_splits: list
    recv_cols: int
    recv_cell: torch.Tensor
    recv_perm: torch.Tensor
    pair_splits: list
    recv_counts: torch.Tensor
    recv_src: torch.Tensor
    recv_token: torch.Tensor
    recv_topk: torch.Tensor
    recv_weights: torch.Tensor

    @property
    def num_recv(self) -> int:
        return self.recv_cell.shape[0]


def _compute_dtype(dtype):
    """Products and sums run in float32 (float64 for float64), as the single-process layer does
    and as the Triton k-sums accumulate (:func:`kernels.triton_support.accumulated`)."""
    return torch.promote_types(dtype, torch.float32)


def _all_to_all(rows, send_splits, recv_splits, group):
    out = rows.new_empty((sum(recv_splits), *rows.shape[1:]))
    dist.all_to_all_single(out, rows.contiguous(), recv_splits, send_splits, group=group)
    return out


def _to_wire(h: EPHandle, rows):
    """Per-token rows (T, ...) -> the wire rows each rank receives: one per send_token."""
    return _all_to_all(rows[h.send_token], h.send_splits, h.recv_splits, h.group)


def _to_receivers(h: EPHandle, rows, decode=None):
    """Per-token rows (T, ...) -> recv_x's rows (R, ...): the wire rows (:func:`_to_wire`),
    ``decode`` applied on receipt, then copied to every pair that wire row serves."""
    got = _to_wire(h, rows)
    if decode is not None:
        got = decode(got)
    return got[h.recv_cell // h.recv_cols]


def _sum_to_sources(h: EPHandle, rows, tokens):
    """recv_x-shaped rows (R, D) -> per-token sums (T, D): summed per wire row on the
    receiver (k order), one row per wire row back, summed per token on the sender (rank or
    k order). Fixed orders, no atomics: the result does not depend on the run."""
    cd = _compute_dtype(rows.dtype)
    dim = rows.shape[1]
    wire = rows.new_zeros((sum(h.recv_splits) * h.recv_cols, dim), dtype=cd)
    wire[h.recv_cell] = rows.to(cd)
    wire = wire.view(-1, h.recv_cols, dim).sum(dim=1).to(rows.dtype)
    back = _all_to_all(wire, h.recv_splits, h.send_splits, h.group)
    grid = rows.new_zeros((tokens * h.send_cols, dim), dtype=cd)
    grid[h.send_cell] = back.to(cd)
    return grid.view(tokens, h.send_cols, dim).sum(dim=1).to(rows.dtype)


def _pairs_to_sources(h: EPHandle, rows):
    """recv_x-shaped rows (R, ...) -> one row per slot (T·K, ...) on the sender, unsummed."""
    ordered = torch.empty_like(rows)
    ordered[h.recv_perm] = rows
    back = _all_to_all(ordered, h.pair_splits, h.send_pairs, h.group)
    slots = torch.empty_like(back)
    slots[h.slot_order] = back
    return slots


def _weighted(rows, weights):
    """Each row times its weight in the compute dtype, rounded once to the rows' dtype
    (v3_fused's down kernel: ``acc · w`` stored in x's dtype)."""
    cd = _compute_dtype(rows.dtype)
    return (rows.to(cd) * weights.to(cd).unsqueeze(-1)).to(rows.dtype)


def _quantize(x):
    """(T, D) -> (T, D + 4) bytes: float8_e4m3fn values, then the row's float32 scale
    (``amax / 448``, 1 for a zero row: :func:`kernels.gemm_fp8.quantize_ref.quantize_one`'s
    ``row`` rule)."""
    return row_bytes.pack(*quantize_one(x, "row", torch.float8_e4m3fn))


def _dequantizer(dim, dtype):
    parts = ((torch.float8_e4m3fn, (dim,)), (torch.float32, (1,)))

    def decode(packed):
        return dequantize(*row_bytes.views(packed, parts), "row", dtype)
    return decode


class _Dispatch(torch.autograd.Function):
    """Forward: the payload to the experts' ranks. Backward: the rows' gradients home,
    summed per token without weights (``_sum_to_sources``), in full precision also for fp8."""

    @staticmethod
    def forward(ctx, x, h, fp8):
        ctx.h, ctx.tokens = h, x.shape[0]
        if fp8:
            return _to_receivers(h, _quantize(x), _dequantizer(x.shape[1], x.dtype))
        return _to_receivers(h, x)

    @staticmethod
    def backward(ctx, grad):
        return _sum_to_sources(ctx.h, grad.contiguous(), ctx.tokens), None, None


class _Combine(torch.autograd.Function):
    """Order-preserving (``reduce_on_sender=False``): y's rows come back one per slot, in slot
    order, and the token's rank weights and sums them in k order with the MoE's k-sum
    (:func:`kernels.moe.layer_ladder.slot_sum.slot_sum`, weighted). Reducing (``True``): the
    expert's rank weights and sums the rows of each wire row first.

    Backward, either mode: ``grad_out`` travels to the experts' ranks as dispatch sent x (one
    row per wire row), where the combine's gradient kernel
    (:func:`kernels.moe.layer_ladder.combine_backward.combine_backward`) writes each row's
    ``w·dy`` and its weight's gradient ``dy·y`` in one pass over y's rows (each wire row a
    "token" of ``recv_cols`` cells, the row's cell its slot); the dots go home, one per pair: one
    more all-to-all per backward than computing them on the token's rank, of T·k scalars, where
    that rank would have to keep y's (T·k, dim) rows from the forward."""

    @staticmethod
    def forward(ctx, y, topk_weights, h, reduce_on_sender):
        tokens, top_k = topk_weights.shape
        ctx.h = h
        ctx.save_for_backward(y, topk_weights)
        if reduce_on_sender:
            return _sum_to_sources(h, _weighted(y, h.recv_weights), tokens)
        weights = topk_weights.to(_compute_dtype(y.dtype)).contiguous()
        return slot_sum(_pairs_to_sources(h, unit_columns(y)), top_k, w=weights)

    @staticmethod
    def backward(ctx, grad_out):
        h = ctx.h
        y, topk_weights = ctx.saved_tensors
        grad_wire = _to_wire(h, grad_out)
        cells = y.new_empty((grad_wire.shape[0] * h.recv_cols,), dtype=_compute_dtype(y.dtype))
        cells[h.recv_cell] = h.recv_weights.to(cells.dtype)   # the cells no row serves are not read
        grad_y, dots = combine_backward(grad_wire, unit_columns(y),
                                        cells.view(-1, h.recv_cols), h.recv_cell)
        grad_w = _pairs_to_sources(h, dots.view(-1)[h.recv_cell]).view(topk_weights.shape)
        return grad_y, grad_w.to(topk_weights.dtype), None, None


def _float_2d(name, value):
    check.tensor(name, value, contiguous=False)
    if value.dim() != 2:
        raise ValueError(f"{name} must be 2-D, got shape {tuple(value.shape)}")
    if value.dtype not in _FLOATS:
        raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {value.dtype}")
    return value


class EPDispatcher:
    """Dispatch/combine for ``num_experts`` experts split contiguously over ``group``'s ranks.

    ``dedup``: one wire row per (token, rank) instead of per (token, expert); same result,
    fewer bytes for top-k > 1. ``fp8``: quantized dispatch payload (see the module doc).
    """

    def __init__(self, num_experts: int, group=None, *, dedup: bool = True, fp8: bool = False):
        if not dist.is_initialized():
            raise RuntimeError("EPDispatcher needs an initialized torch.distributed process group")
        for name, flag in (("dedup", dedup), ("fp8", fp8)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
        self.group, self.num_experts, self.dedup, self.fp8 = group, num_experts, dedup, fp8
        self.world_size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.experts_per_rank = expert_split(num_experts, self.world_size)
        self._serial = 0

    def layout(self, topk_ids: torch.Tensor) -> EPLayout:
        return dispatch_layout(topk_ids, self.num_experts, self.world_size)

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor):
        """x (T, D), topk_ids (T, K) int32/int64, topk_weights (T, K) float ->
        (recv_x (R, D) in x's dtype, recv_counts (E/W,) int64, handle)."""
        self._serial += 1
        try:
            sender = self._sender(x, topk_ids, topk_weights)
            error = None
        except (TypeError, ValueError) as err:
            sender, error = None, err
        h = self._plan(x, topk_ids, topk_weights, sender, error)
        return _Dispatch.apply(x, h, self.fp8), h.recv_counts, h

    def combine(self, y: torch.Tensor, handle: EPHandle, *, reduce_on_sender: bool = False):
        """y (R, D') with recv_x's rows -> out (T, D') on the tokens' ranks:
        ``out[t] = sum_k w[t,k]·y[row of (t,k)]``.

        ``reduce_on_sender=False`` (default) sends one row per (token, expert) back and sums
        on the token's rank in k order, each row times its weight in float32 (float64 for
        float64) and rounded once: in fp32 v3_fused.fused_forward's operations (it rounds
        ``acc·w`` to the dtype before the sum, a no-op in fp32), so an fp32 layer built on it
        can be bitwise equal to the single-process layer; in fp16/bf16 the products are not
        rounded before the sum, as in the expert-parallel layer. ``True`` sums the rows of
        each (token, rank) on the expert's rank and sends one partial sum per (token, rank),
        DeepEP's combine: fewer bytes with a dedup handle, but the sum is grouped by rank
        and rounded once more, so it is not bitwise equal (nor is it with a naive handle).
        """
        error = None
        try:
            self._check_combine(y, handle, reduce_on_sender)
        except (TypeError, ValueError) as err:
            error = err
        grad = torch.is_grad_enabled() and (
            error is None and (y.requires_grad or handle.topk_weights.requires_grad))
        values = [y.shape[1], check.dtype_code(y.dtype), int(reduce_on_sender), int(grad),
                  handle.serial] if error is None else [0] * 5
        self._agree("combine", values, error, ["dim", "dtype", "reduce_on_sender",
                                                "needs grad", "dispatch serial"])
        return _Combine.apply(y, handle.topk_weights, handle, reduce_on_sender)

    # -- checks and plan ---------------------------------------------------------------

    def _check_dispatch(self, x, topk_ids, topk_weights) -> None:
        """What needs no value of a tensor (the ids' range comes with :meth:`_read`)."""
        _float_2d("x", x)
        _float_2d("topk_weights", topk_weights)
        checked_ids(topk_ids, self.num_experts, values=False)
        if topk_weights.shape != topk_ids.shape:
            raise ValueError(f"topk_weights has shape {tuple(topk_weights.shape)}, topk_ids "
                             f"{tuple(topk_ids.shape)}: one weight per (token, k)")
        if x.shape[0] != topk_ids.shape[0]:
            raise ValueError(f"x has {x.shape[0]} tokens but topk_ids has {topk_ids.shape[0]}")
        if x.shape[1] < 1:
            raise ValueError("x must have at least one column")
        if len({x.device, topk_ids.device, topk_weights.device}) > 1:
            raise ValueError(f"x, topk_ids and topk_weights are on different devices "
                             f"({x.device}, {topk_ids.device}, {topk_weights.device})")

    def _check_combine(self, y, handle, reduce_on_sender):
        if not isinstance(handle, EPHandle):
            raise TypeError(f"handle must be the EPHandle that dispatch returned, got "
                            f"{type(handle).__name__}")
        if handle.group is not self.group or handle.world_size != self.world_size:
            raise ValueError("handle comes from a dispatcher on another process group")
        if not isinstance(reduce_on_sender, bool):
            raise TypeError(f"reduce_on_sender must be a bool, got {type(reduce_on_sender).__name__}")
        _float_2d("y", y)
        if y.shape[0] != handle.num_recv:
            raise ValueError(f"y has {y.shape[0]} rows but dispatch delivered {handle.num_recv} "
                             "(y must have recv_x's rows, in recv_x's order)")

    def _agree(self, what, values, error, names) -> list[list[int]]:
        """One all-gather of (ok, values...): a local error is raised on its rank and
        named on the others, a disagreement raises everywhere; nobody is left waiting.
        Returns every rank's row. The table is a CPU tensor (:func:`._checks.exchange`):
        its one read here waits for the collective, never for a device."""
        table = check.exchange([int(error is None), *values], self.group).tolist()
        if error is not None:
            raise error
        failed = [rank for rank, row in enumerate(table) if row[0] == 0]
        if failed:
            raise ValueError(f"{what}: rank(s) {failed} refused their arguments (see their error)")
        fields = [row[1:1 + len(names)] for row in table]
        if any(row != fields[0] for row in fields):
            rows = {n: [row[i] for row in fields] for i, n in enumerate(names)}
            raise ValueError(f"{what}: ranks disagree, per rank: {rows}")
        return table

    def _plan(self, x, topk_ids, topk_weights, sender, error) -> EPHandle:
        names = ["num_experts", "top_k", "dim", "x dtype", "weights dtype", "dedup", "fp8",
                 "needs grad"]
        world = self.world_size
        if error is None:
            values = [self.num_experts, topk_ids.shape[1], x.shape[1], check.dtype_code(x.dtype),
                      check.dtype_code(topk_weights.dtype), int(self.dedup), int(self.fp8),
                      int(torch.is_grad_enabled() and x.requires_grad), self._serial,
                      *sender["send_splits"], *sender["send_pairs"]]
        else:
            values = [0] * (len(names) + 1 + 2 * world)
        table = self._agree("dispatch", values, error, names + ["dispatch serial"])
        first = 1 + len(names) + 1   # each row: ok, names, serial, send splits (W), send pairs (W)
        recv_splits = [row[first + self.rank] for row in table]
        pair_splits = [row[first + world + self.rank] for row in table]
        meta = self._metadata(topk_ids.long(), topk_weights, sender)
        got = _all_to_all(meta, sender["send_splits"], recv_splits, self.group)
        return EPHandle(group=self.group, rank=self.rank, world_size=world,
                        serial=self._serial, topk_weights=topk_weights,
                        recv_splits=recv_splits, **sender,
                        **self._receiver(got, recv_splits, pair_splits, topk_ids.shape[1],
                                         topk_weights.dtype))

    @staticmethod
    def _read(counts: torch.Tensor) -> list[int]:
        """A dispatch's one host read: ``all_to_all_single`` takes its split sizes as host
        ints (as DeepEP's normal mode reads its counts in its notify step), and the ids'
        range check rides along, so a dispatch waits for its device once."""
        return counts.tolist()

    def _sender(self, x, topk_ids, topk_weights):
        """The checks, the layout and the sender's side of the plan, with one host read."""
        self._check_dispatch(x, topk_ids, topk_weights)
        ids, world = topk_ids.long(), self.world_size
        tokens, top_k = ids.shape
        # counted clamped: an id out of range must reach the check below, not fail the count
        counts = device_counts(ids.clamp(0, self.num_experts - 1), self.num_experts, world)
        bounds = torch.stack([ids.min(), ids.max()]) if ids.numel() else ids.new_zeros(2)
        low, high, *sizes = self._read(torch.cat([bounds, counts["tokens_per_rank"],
                                                  counts["rows_per_rank"]]))
        if ids.numel():
            check_id_range(low, high, self.num_experts)
        tokens_to_rank, send_pairs = sizes[:world], sizes[world:]
        layout = EPLayout(num_experts=self.num_experts, world_size=world, **counts,
                          rows_naive=tokens * top_k, rows_dedup=sum(tokens_to_rank))
        slot_order = torch.sort((ids // self.experts_per_rank).reshape(-1), stable=True).indices
        if self.dedup:   # (rank, token) pairs, by rank then token
            cell = _true_positions(layout.is_token_in_rank.T.reshape(-1), layout.rows_dedup)
            ranks, token = cell // max(tokens, 1), cell % max(tokens, 1)
            return dict(layout=layout, send_splits=tokens_to_rank, send_pairs=send_pairs,
                        send_token=token, send_cell=token * world + ranks, send_cols=world,
                        slot_order=slot_order)
        return dict(layout=layout, send_splits=send_pairs, send_pairs=send_pairs,
                    send_token=slot_order // top_k, send_cell=slot_order, send_cols=top_k,
                    slot_order=slot_order)

    def _metadata(self, ids, topk_weights, sender):
        """Per wire row (int64): token index, first k, then C expert ids and C weights (as
        float64 bits), C = K (dedup: the token's whole routing) or 1 (naive: its pair)."""
        token, slots = sender["send_token"], sender["send_cell"]
        weights = topk_weights.detach().double().contiguous().reshape(-1, ids.shape[1] if self.dedup else 1)
        if self.dedup:
            first_k = torch.zeros_like(token)
            return torch.cat([token[:, None], first_k[:, None], ids[token],
                              weights[token].view(torch.int64)], dim=1)
        flat_ids, flat_w = ids.reshape(-1, 1), weights.view(torch.int64)
        return torch.cat([token[:, None], (slots % ids.shape[1])[:, None], flat_ids[slots],
                          flat_w[slots]], dim=1)

    def _receiver(self, meta, recv_splits, pair_splits, top_k, weight_dtype):
        """The receiver's side of the plan, from the wire rows' metadata and the host sizes
        the header brought: no host read."""
        cols = top_k if self.dedup else 1
        src = torch.repeat_interleave(torch.arange(self.world_size, device=meta.device),
                                      torch.tensor(recv_splits, device=meta.device),
                                      output_size=sum(recv_splits))
        local = meta[:, 2:2 + cols] - self.rank * self.experts_per_rank
        mine = ((local >= 0) & (local < self.experts_per_rank)).reshape(-1)
        pairs = _true_positions(mine, sum(pair_splits))   # in (source rank, token, k) order
        expert = local.reshape(-1)[pairs]
        recv_perm = torch.sort(expert, stable=True).indices
        cell = pairs[recv_perm]
        wire = cell // cols
        weights = meta[:, 2 + cols:].contiguous().view(torch.float64).reshape(-1)
        recv_counts = torch.zeros(self.experts_per_rank, dtype=torch.int64, device=meta.device)
        return dict(recv_cols=cols, recv_cell=cell, recv_perm=recv_perm, pair_splits=pair_splits,
                    recv_counts=recv_counts.scatter_add_(0, expert, torch.ones_like(expert)),
                    recv_src=src[wire], recv_token=meta[wire, 0], recv_topk=meta[wire, 1] + cell % cols,
                    recv_weights=weights[cell].to(weight_dtype))


def _true_positions(mask: torch.Tensor, count: int) -> torch.Tensor:
    """The positions of the ``count`` True entries of the 1-D ``mask``, in order, where
    ``count`` is known on the host: a stable sort puts them first, so no device sync
    (``nonzero`` waits for the device to size its output)."""
    return torch.sort((~mask).to(torch.uint8), stable=True).indices[:count]
