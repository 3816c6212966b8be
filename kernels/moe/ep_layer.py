"""``kernels.MoE(..., ep_group=group)``: the MoE layer with its experts split over ranks.

Rank r of the W ranks of ``ep_group`` holds the weights of experts ``[r·E/W, (r+1)·E/W)``
only; the router and the shared experts are replicated. Each rank feeds its own tokens:
it routes them (the same float32 router), sends every token-slot to the rank of its
expert (:mod:`.ep_exchange`, one all-to-all), runs v3's two fused kernels on the rows it
received for its experts, sends the rows back (a second all-to-all) and sums each
token's k rows, weighted, with the Triton k-sum v3 and ``Float8MoE`` end with
(:func:`.layer_ladder.slot_sum.slot_sum`, weighted, on rows already in slot order: no
float32 copy of the (T·k, dim) slot rows; its backward likewise, below). What an owner runs on
its rows is one object per forward (:class:`V3Experts` here); ``kernels.fp8.convert``
makes the layer a :class:`kernels.moe.ep_fp8_layer.Float8ExpertParallelMoE`, whose owners
run FP8 grouped GEMMs inside the same exchange, plans and backward, and whose senders may
send FP8 rows instead (the object's ``wire``).

Equal to the single-process layer up to the order of fp32 sums, and why not bitwise:
    - The experts: an owner's rows for expert e are the single-process layer's rows for
      e, in the same order (:mod:`.ep_exchange`), and every kernel (v3's forward, the
      grouped GEMMs and dW of the backward) tiles an expert's rows from that expert's
      first row, so each tile holds the same rows as in the single-process layer. v3
      multiplies the routing weight into each row in its down kernel, rounds it to the
      dtype and sums a token's k rows in fp32 in slot order; here the down kernel runs
      with weight 1 (``acc·1`` is exact), and after the all-to-all back the k-sum
      multiplies each row by its weight in fp32 and adds them in the same order: in fp32
      the same operations, so the same bits for the same rows (tested), and in fp16/bf16
      the row is rounded before its weight instead of after. The FP8 layer's combine is
      ``Float8MoE``'s k-sum, slot by slot in the same order. The backward likewise
      weights on the sender: the owner gets ``w·dy`` rounded to the dtype (written with the
      weights' gradient by ``Float8MoE``'s combine backward,
      :func:`.layer_ladder.combine_backward.combine_backward`, in slot order), where v3
      weights h for ddown and dh after the dX GEMM, and returns each slot's input
      gradient rounded to the dtype, whose k rows the sender sums in fp32 with the
      k-sum, where v3 sums all 2·k dX products before one rounding: in fp32 a rounding
      more or less each, within the bound below.
    - What is not the same sequence of operations: the token-wise dense work (the router
      GEMM, the shared experts) runs on this rank's T rows instead of all ranks' rows,
      and a chunk's tiles hold other rows than the unchunked tiles. On a GPU a row's
      result does not depend on its neighbours (an MFMA reduces each output over K in a
      fixed order). On the CPU it can: the interpreter's tile dots and torch's CPU GEMMs
      go through BLAS kernels chosen by the CPU and the row count (OpenBLAS's Haswell and
      SkylakeX sgemm round differently, MKL takes another path for one or two rows), and
      CPU ATen evaluates ``exp`` with SIMD in a tensor's body and scalar libm in its
      tail. So the tests hold this layer (and chunked against unchunked) to a few fp32
      ulps of each tensor's largest value, not to its bits.

Host syncs and collectives (:mod:`.ep_exchange`): the forward runs one all-to-all of
row counts (all chunks at once) and, per chunk, one all-to-all of rows out and one back;
it sums nothing across ranks (``expert_counts`` are this rank's). Dropless (the default)
it reads the row counts on the host once, in the plan, because ``all_to_all_single``
takes host split sizes; with ``ep_capacity`` it reads nothing on the host (a test traps
``item``/``tolist``/``cpu``/... through forward and backward) and drops the slots past the
capacity. The backward adds no read of its own.

Backward: the forward's plans are reused, and when a gradient is needed the forward
keeps each slot's unweighted expert output on the sender and, at each owner, the rows
it received with their g, u and h from v3's gate/up kernel
(:func:`.layer_ladder.v3_fused.gate_up_saving`). One all-to-all per chunk carries each
slot's output gradient, weighted, to the owner, which runs v3's backward on what it
kept (:func:`.layer_ladder.v3_backward.sorted_backward`, weight 1): one dX and one dW
grouped GEMM per expert GEMM, six launches per backward whatever the chunks and no
forward GEMM, on all chunks' rows at once in the single-process layer's row order (the
saved g, u and h permuted with the rows), so each expert's weight gradient is one
grouped GEMM over its rows, as in the single-process layer. One all-to-all per chunk
brings each slot's input gradient back: T·k rows of ``dim`` each way, as in the
forward. Capacity padding rows are in no grouped GEMM; the elementwise work runs over
them and their gradients land on no slot. Memory: the forward keeps T·k·dim elements
in the rows' dtype and T·k float32 routing weights on the sender, and R·(dim +
3·hidden) elements in the rows' dtype at an owner that received R rows (padding
included); the backward merges the owner's part into a permuted copy. The routing
weights' gradient is a dot of the output gradient with the saved outputs, on the
sender, in fp32 in the pass that writes the weighted output gradient. The sender's
k-sums, forward and backward, are Triton passes in slot order (no atomics, the same
bits every run): for k > 1 no torch op computes over the (T·k, dim) slot rows, and in
fp16/bf16 none writes them in float32 (tests/test_ep_moe_k_sum.py). Local expert weight gradients are the
single-process layer's for those experts, to rounding as above. The router's and shared experts' gradients cover this
rank's tokens only: they are replicated parameters, and like any data-parallel
gradient they must be summed over the ranks
(:meth:`ExpertParallelMoE.replicated_parameters`); that sum adds per-rank partial sums,
a different association than the single-process sum over all tokens. The backward's
all-to-alls are collectives: every rank of the group must run backward through each
forward, as with any distributed layer. Eager mode only (not wrapped for
``torch.compile``).

Overlap: with ``ep_chunks = C`` the tokens are split into C chunks; the dispatch of chunk
i+1 is issued (``async_op=True``) before the experts compute chunk i, and each chunk's
combine is issued as soon as it is computed. With ``record_events = True`` every
forward leaves a timeline in ``events`` (:mod:`kernels.comm.overlap`): host stamps on
gloo, where the asynchronous all-to-alls run on the process group's worker threads
while this thread computes; device events on a GPU, where each all-to-all is issued
from the timeline's communication stream and the compute stream waits for it there.
Not run on a GPU yet. On
CPU under the Triton interpreter compute is nearly all of the time, so there is little
to hide (the efficiency is near 1 with or without chunks), and every chunk pays the
kernels' launch and per-program overhead again, so chunking makes a CPU forward slower.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import autocast
from .. import backend as _backend
from ..comm.overlap import Timeline
from . import ep_exchange
from .layer_base import MoELayer
from .layer_ladder import v3_fused
from .layer_ladder.checks import moe_operands
from .layer_ladder.combine_backward import combine_backward
from .layer_ladder.slot_sum import slot_sum
from .layer_ladder.spec import DTYPES
from .layer_ladder.swiglu_rows import unit_columns
from .layer_ladder.v3_backward import sorted_backward
from .routing_fused import routed

_EXPERT_WEIGHTS = ("gate", "up", "down")


def _experts_forward(rows, offsets, gate, up, down, save: bool):
    """v3's two kernels on expert-major rows, weight 1: (the unweighted expert outputs, g, u,
    h), g and u empty unless ``save`` (rows past ``offsets[-1]``, capacity padding, are left
    unwritten in all four)."""
    if rows.shape[0] == 0:
        empty = rows.new_zeros((0, gate.shape[2]))
        return rows.new_zeros((0, down.shape[2])), empty, empty, empty
    here = _backend.current()
    cfg1, cfg2 = v3_fused.config(here.name, here.arch, rows.dtype)
    identity = torch.arange(rows.shape[0], device=rows.device)
    h, g, u = v3_fused.gate_up_saving(rows, gate, up, identity, offsets, 1, save, cfg1)
    ones = torch.ones(rows.shape[0], dtype=torch.float32, device=rows.device)
    return v3_fused.down_scatter(h, down, identity, ones, offsets, cfg2), g, u, h


def _experts_backward(rows, grad_y, g, u, h, offsets, gate, up, down, needs):
    """v3's backward (:func:`.layer_ladder.v3_backward.sorted_backward`) on the owner's rows
    and their saved g, u and h, with weight 1 (the sender weighted ``grad_y``): one dX and
    one dW grouped GEMM per expert GEMM, no forward GEMM. Returns (d rows, d gate, d up,
    d down), None for a weight whose ``needs`` (gate, up, down) is False; d rows always
    (other ranks' inputs need them), each row's two dX products summed in fp32 and rounded
    once; the sender sums a token's k rows."""
    d_rows, _, dgate, dup, ddown = sorted_backward(grad_y, rows, gate, up, down, g, u, h, offsets,
                                                   None, (True, False, *needs))
    return slot_sum(d_rows[0], 1, d_rows[1]), dgate, dup, ddown


class V3Experts:
    """The owner's expert computation of the high-precision layer: the tokens travel as they
    are (:meth:`wire`), v3's two kernels forward (:func:`_experts_forward`), v3's backward on
    the rows and the g, u and h they saved (:func:`_experts_backward`). The FP8 layer
    (:class:`kernels.moe.ep_fp8_layer.Float8ExpertParallelMoE`) hands the run another object
    with these three methods, per forward (its wire rows: FP8 bytes and scales, which its
    forward and backward take as the rows), and the exchange around them stays this module's."""
    forward = staticmethod(_experts_forward)
    backward = staticmethod(_experts_backward)

    @staticmethod
    def wire(x: torch.Tensor) -> torch.Tensor:
        """This rank's tokens (T, dim) as the dispatch sends them: unchanged."""
        return x


@dataclass
class _Run:
    """What one forward's autograd node needs besides tensors."""
    group: object
    num_experts: int
    chunks: int
    capacity: int | None
    timeline: Timeline | None
    experts: object              # V3Experts, or a forward's FP8 owner (:mod:`.ep_fp8_layer`)
    # whether autograd records the call (grad mode on where it is made): inside the forward grad mode
    # is off, and ctx.needs_input_grad says only which inputs require a gradient, under no_grad too
    recorded: bool = True
    dropped: torch.Tensor | None = None


def _merged(plans) -> tuple[torch.Tensor, torch.Tensor]:
    """(perm, offsets): the permutation that puts all chunks' expert-major rows, concatenated,
    in the single-process layer's order (expert, source, chunk, token; padding last), and
    the offsets of that order. The weight gradients then sum each expert's rows in one
    grouped GEMM, as the single-process layer's backward does, not chunk by chunk."""
    chunks = len(plans)
    key = torch.cat([plan.keys * chunks + c for c, plan in enumerate(plans)])
    offsets = torch.stack([plan.offsets for plan in plans]).sum(0, dtype=torch.int32)
    return torch.sort(key, stable=True).indices, offsets


def _bounds(t: int, chunks: int) -> list[tuple[int, int]]:
    """``torch.tensor_split``'s chunks of t rows as (start, end); some may be empty."""
    edges = [c * (t // chunks) + min(c, t % chunks) for c in range(chunks + 1)]
    return list(zip(edges[:-1], edges[1:]))


def _issue(run: _Run, chunk: int, phase: str, rows, plan, back=False, per_row=1):
    """:func:`.ep_exchange.start`, timed by the run's timeline when it has one."""
    def issue():
        return ep_exchange.start(rows, plan, run.group, back=back, per_row=per_row)
    return issue() if run.timeline is None else run.timeline.comm(chunk, phase, issue, (rows,))


def _pipelined_forward(x, weights, ids, gate, up, down, run: _Run, save: bool):
    """Dispatch chunk c+1 while chunk c computes; combine each chunk as soon as it is done.
    Returns (out, plans, each chunk's (expert-major rows as they travelled, g, u, h) with g
    and u empty unless ``save``, every slot's unweighted output)."""
    k = ids.shape[1]
    bounds = _bounds(ids.shape[0], run.chunks)
    plans = ep_exchange.plans([ids[a:b] for a, b in bounds], run.num_experts, run.group,
                              run.capacity)
    run.dropped = torch.stack([plan.dropped for plan in plans]).sum()
    wire = run.experts.wire(x)      # once for all T tokens, before the k-fold gather of the slots

    def dispatch(c):
        return _issue(run, c, "dispatch", wire[bounds[c][0]:bounds[c][1]], plans[c], per_row=k)

    pending, combines, kept = dispatch(0), [], []
    for c in range(run.chunks):
        following = dispatch(c + 1) if c + 1 < run.chunks else None
        received, work = pending
        work.wait()
        rows = ep_exchange.finish(received, plans[c])
        with contextlib.nullcontext() if run.timeline is None else run.timeline.compute(c):
            y, *activations = run.experts.forward(rows, plans[c].offsets, gate, up, down, save)
        kept.append((rows, *activations))
        combines.append(_issue(run, c, "combine", y, plans[c], back=True))
        pending = following
    y_by_slot = []
    for (out, work), plan in zip(combines, plans):
        work.wait()
        y_by_slot.append(ep_exchange.finish(out, plan, back=True))
    y_by_slot = torch.cat(y_by_slot)
    return slot_sum(y_by_slot, k, w=weights), plans, kept, y_by_slot


def _exchange_all(tensors, plans, group, back=False):
    """Each chunk's rows through its plan: all all-to-alls issued, then all finished."""
    issued = [ep_exchange.start(t, plan, group, back=back) for t, plan in zip(tensors, plans)]
    done = []
    for (out, work), plan in zip(issued, plans):
        work.wait()
        done.append(ep_exchange.finish(out, plan, back=back))
    return done


class _Experts(torch.autograd.Function):
    """Forward: :func:`_pipelined_forward`, keeping each chunk's rows, g, u and h at the owner
    when a gradient is needed. Backward: on the sender the weighted sum's gradient
    (:func:`.layer_ladder.combine_backward.combine_backward`, slots in slot order) and the
    k-sum of the input gradients (:func:`.layer_ladder.slot_sum.slot_sum`); between them the
    forward's plans, one exchange of the output gradient out and one of the input gradient
    back, and at the owners the dX and dW launches of the run's expert computation on the
    kept rows and activations (:func:`_experts_backward`, or the FP8 layer's), all chunks'
    rows merged in the single-process layer's order."""

    @staticmethod
    def forward(ctx, x, weights, ids, gate, up, down, run):
        out, plans, kept, y_by_slot = _pipelined_forward(x, weights, ids, gate, up, down, run,
                                                         run.recorded and any(ctx.needs_input_grad))
        ctx.save_for_backward(weights, gate, up, down, y_by_slot, *(t for c in kept for t in c))
        ctx.run, ctx.plans = run, plans
        return out

    @staticmethod
    def backward(ctx, grad_out):
        weights, gate, up, down, y_by_slot, *kept = ctx.saved_tensors
        run, plans, (t, k) = ctx.run, ctx.plans, weights.shape
        # the weighted sum's backward, slots in slot order: each slot's output gradient w·dy in
        # the rows' dtype and the weights' gradient dy·y, fp32 in registers
        slots = torch.arange(t * k, device=y_by_slot.device)
        grad_y, dweights = combine_backward(unit_columns(grad_out), y_by_slot, weights, slots)
        grad_rows = _exchange_all([grad_y[a * k:b * k] for a, b in _bounds(t, run.chunks)],
                                  plans, run.group)
        perm, offsets = _merged(plans)
        rows, g, u, h = (torch.cat(kept[i::4])[perm] for i in range(4))   # per chunk: rows, g, u, h
        d_merged, dgate, dup, ddown = run.experts.backward(
            rows, torch.cat(grad_rows)[perm], g, u, h, offsets, gate, up, down,
            ctx.needs_input_grad[3:6])
        d_rows = torch.empty_like(d_merged)
        d_rows[perm] = d_merged
        d_slot = torch.cat(_exchange_all(d_rows.split([plan.rows for plan in plans]), plans,
                                         run.group, back=True))
        dx = d_slot if k == 1 else slot_sum(d_slot, k)          # permute's backward: fp32, rounded once
        return dx, dweights, None, dgate, dup, ddown, None


class ExpertParallelMoE(MoELayer):
    """:class:`kernels.MoE` over ``ep_group``: build it as ``kernels.MoE(..., ep_group=g)``
    (fresh weights: every rank draws all E experts' weights, as the single-process layer
    would, then keeps its own, so ranks seeded alike hold slices of one full layer) or
    from a full layer with ``kernels.MoE.from_full(layer, ep_group)``. ``load_state_dict`` takes a full layer's
    state dict (it keeps this rank's experts) or an expert-parallel one.

    ``ep_chunks``: chunks of the forward's token pipeline (1: no overlap).
    ``ep_capacity``: None (default) for the dropless exchange, which reads the row counts
    on the host once per forward, or n > 0 for the fixed-capacity exchange with no host
    sync, which drops a rank's slots past n per destination rank and chunk
    (:mod:`.ep_exchange`); ``ep_dropped`` then holds the last forward's dropped slots of
    this rank as a device int64 (0 for dropless). Set it as an argument or an attribute
    (``from_full`` takes ``ep_chunks`` only).

    Set ``record_events = True`` (on every rank alike: it adds a barrier) and each
    forward leaves its timeline in ``events`` (:class:`kernels.comm.overlap.Timeline`:
    device events on a GPU, host stamps elsewhere). ``expert_counts`` are the token-slots
    this rank's tokens sent to each of the E experts: summed over the ranks they are the
    single-process layer's counts on the concatenated batch (the forward sums nothing
    across ranks itself: that would be one more collective per layer). Likewise
    ``aux_loss`` is this rank's tokens' loss, which is the loss each data-parallel rank
    adds to its own training loss, its router gradient summed with the others' like
    every replicated gradient.
    """

    def __init__(self, dim: int, hidden: int, num_experts: int, top_k: int,
                 shared_experts: int = 0, *, ep_group, ep_chunks: int = 1,
                 ep_capacity: int | None = None, normalize: bool = True, device=None,
                 dtype=None):
        if not isinstance(ep_group, dist.ProcessGroup):
            raise TypeError(f"ep_group must be a torch.distributed ProcessGroup, got "
                            f"{type(ep_group).__name__}")
        if isinstance(ep_chunks, bool) or not isinstance(ep_chunks, int) or ep_chunks < 1:
            raise ValueError(f"ep_chunks must be an int >= 1, got {ep_chunks!r}")
        world = dist.get_world_size(ep_group)
        if isinstance(num_experts, int) and num_experts % world:
            raise ValueError(f"num_experts={num_experts} must be divisible by the ep_group's "
                             f"world size {world}: each rank owns num_experts / world experts")
        super().__init__(dim, hidden, num_experts, top_k, shared_experts, normalize=normalize,
                         device=device, dtype=dtype)
        self.ep_group, self.ep_chunks, self.ep_rank = ep_group, ep_chunks, dist.get_rank(ep_group)
        self.ep_capacity = ep_capacity
        per_rank = num_experts // world
        self.local_experts = range(self.ep_rank * per_rank, (self.ep_rank + 1) * per_rank)
        for name in _EXPERT_WEIGHTS:
            full = getattr(self, name)
            setattr(self, name, torch.nn.Parameter(full.detach()[self._slice].clone()))
        self.record_events = False
        self.events: list[dict] | None = None
        self.ep_dropped: torch.Tensor | None = None

    @property
    def ep_capacity(self) -> int | None:
        return self._ep_capacity

    @ep_capacity.setter
    def ep_capacity(self, value) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"ep_capacity must be None (dropless) or an int >= 1, got {value!r}")
        self._ep_capacity = value

    @property
    def _slice(self) -> slice:
        return slice(self.local_experts.start, self.local_experts.stop)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name in _EXPERT_WEIGHTS:
            value = state_dict.get(prefix + name)
            if value is not None and value.shape[0] == self.num_experts != len(self.local_experts):
                state_dict[prefix + name] = value[self._slice]
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def replicated_parameters(self) -> list[torch.nn.Parameter]:
        """The router's and shared experts' weights: every rank holds them whole, and their
        gradients (of this rank's tokens) must be summed over the ranks."""
        return [p for name, p in self.named_parameters() if name not in _EXPERT_WEIGHTS]

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, local_experts={self.local_experts.start}.."
                f"{self.local_experts.stop - 1}, ep_chunks={self.ep_chunks}, "
                f"ep_capacity={self.ep_capacity}")

    def _owner_experts(self):
        """What this forward's owner runs on its rows (:class:`V3Experts`; the FP8 layer's own)."""
        return V3Experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 1 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (..., dim={self.dim}), got {tuple(x.shape)}")
        flat = x.reshape(-1, self.dim)
        rows, gate, up, down = autocast.operands(flat, self.gate, self.up, self.down)
        # the local experts' weights against their rows of the router (top_k is checked at init),
        # uncast: its logits are float32 (router_logits)
        moe_operands(rows, self.router.weight[self._slice], gate, up, down, 1, DTYPES, router_dtypes=DTYPES)
        weights, ids, self.expert_counts, self.aux_loss = routed(self.router_logits(rows), self.top_k,
                                                                 self.normalize)
        run = _Run(self.ep_group, self.num_experts, self.ep_chunks, self.ep_capacity,
                   Timeline(self.ep_group, device=rows.device) if self.record_events else None,
                   self._owner_experts(), torch.is_grad_enabled())
        out = _Experts.apply(rows, weights, ids, gate, up, down, run).to(x.dtype)
        self.ep_dropped = run.dropped
        if run.timeline is not None:
            self.events = run.timeline.events
        if self.shared_experts:
            out = out + self.shared_mlp(rows)
        return out.reshape(x.shape)
