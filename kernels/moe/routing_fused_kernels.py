"""The MoE router's Triton kernels: softmax, top-k, counts and the aux loss in two launches
forward, one backward (:mod:`.routing_fused` wraps them).

:func:`kernels.moe.route`, :func:`~kernels.moe.expert_counts` and :func:`~kernels.moe.aux_loss`
are 18 torch ops forward and 15 backward per MoE layer call, each a launch on a GPU (vLLM's and
aiter's ``topk_softmax`` fuse the forward the same way). Here:

- :func:`_route_kernel`: a program takes BLOCK_T tokens, each row of E <= :data:`MAX_EXPERTS`
  logits whole in registers (BLOCK_E, E's next power of 2), and computes the fp32 softmax, then
  the top_k experts by repeated argmax (the largest score, ``probability + bias``, first; among
  equal scores the lowest id, which is what ``route``'s stable descending sort selects and in
  that order; a NaN score counts as the largest, as torch's sort ranks it), the weights (the chosen
  probabilities, over their sum when normalizing), and its tokens' per-expert sums of probability
  and of slots into its own row of an fp32 (programs, 2, E) buffer of partials (a slot count is at
  most BLOCK_T, exact in fp32).
- :func:`_totals_kernel`: one program adds the partial rows in a fixed order (no atomics: the
  same inputs give the same bits) into the int64 counts and the aux loss
  ``E · Σ_e (counts_e / (T·k)) · (Σ_t p_te / T)`` (0 for no tokens, as ``aux_loss``).
- :func:`_backward_kernel`: per token, the gradient of the probabilities (the weights' through
  the normalization, zero for unchosen experts, plus the aux loss's ``daux · E · f_e / T`` for
  every expert), then through the softmax, from the softmax recomputed from the logits.

``tests/test_moe_routing_fused_isa.py`` compiles :func:`aot`'s launches (E = 128, top 8, the
size of Qwen3-MoE's router) for gfx942 and gfx950: no spills of either kind, no scratch, no
atomics; :data:`WAVES_PER_SIMD` waves per SIMD for the two per-token passes, which read the
logits (and the backward writes dlogits) 16 bytes a thread.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..outputs import new_output
from ..registry import AotKernel
from ..triton_support import aot_launch, cdiv, next_power_of_2, run_args

MAX_EXPERTS = 256   # a row's experts live in one program's registers
MAX_TOP_K = 8       # experts chosen per token by repeated argmax: one pass over the row each
TILE_ELEMENTS = 1024   # logits a per-token program holds: BLOCK_T tokens of BLOCK_E experts
NUM_WARPS = 4
TOTALS = dict(BLOCK_P=16, num_warps=4)
WAVES_PER_SIMD = 8
"""What gfx942 and gfx950 give :func:`_route_kernel` and :func:`_backward_kernel` at :data:`AOT_SHAPE`
(``tests/test_moe_routing_fused_isa.py`` asserts it)."""
AOT_SHAPE = (16384, 128, 8)   # tokens, experts, top_k


@triton.jit
def _softmax(logits_ptr, rows, live, cols, E, stride_t, stride_e):
    """The fp32 softmax of BLOCK_T rows (0 in masked columns) and the mask of the real columns."""
    inside = cols < E
    x = tl.load(logits_ptr + rows[:, None] * stride_t + cols[None, :] * stride_e,
                mask=live[:, None] & inside[None, :], other=float("-inf")).to(tl.float32)
    top = tl.max(x, axis=1)
    top = tl.where(live, top, 0.0)   # a masked row: no -inf - -inf, no 0 / 0
    e = tl.exp(x - top[:, None])
    return e / tl.where(live, tl.sum(e, axis=1), 1.0)[:, None], inside


@triton.jit
def _route_kernel(logits_ptr, bias_ptr, weights_ptr, ids_ptr, partial_ptr, T, E, stride_t, stride_e, stride_bias,
                  TOP_K: tl.constexpr, HAS_BIAS: tl.constexpr, NORMALIZE: tl.constexpr,
                  BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    program = tl.program_id(0)
    rows = program * BLOCK_T + tl.arange(0, BLOCK_T)
    live = rows < T
    rows = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK_E)
    probs, inside = _softmax(logits_ptr, rows, live, cols, E, stride_t, stride_e)
    scores = probs
    if HAS_BIAS:
        scores += tl.load(bias_ptr + cols * stride_bias, mask=inside, other=0.0).to(tl.float32)[None, :]
    scores = tl.where(scores != scores, float("inf"), scores)   # NaN ranks first, as in torch's sort
    open_ = live[:, None] & inside[None, :]   # experts not chosen yet
    slots = tl.arange(0, BLOCK_K)
    weights = tl.zeros((BLOCK_T, BLOCK_K), tl.float32)
    ids = tl.zeros((BLOCK_T, BLOCK_K), tl.int32)
    for k in tl.static_range(TOP_K):
        best = tl.max(tl.where(open_, scores, float("-inf")), axis=1)
        pick = tl.min(tl.where(open_ & (scores == best[:, None]), cols[None, :], BLOCK_E), axis=1)
        chosen = cols[None, :] == pick[:, None]
        weights = tl.where(slots[None, :] == k, tl.sum(tl.where(chosen, probs, 0.0), axis=1)[:, None], weights)
        ids = tl.where(slots[None, :] == k, pick[:, None], ids)
        open_ = open_ & ~chosen
    if NORMALIZE:
        weights = weights / tl.where(live, tl.sum(weights, axis=1), 1.0)[:, None]   # a masked row: no 0 / 0
    out = rows[:, None] * TOP_K + slots[None, :]
    kept = live[:, None] & (slots < TOP_K)[None, :]
    tl.store(weights_ptr + out, weights, mask=kept)
    tl.store(ids_ptr + out, ids, mask=kept)
    taken = (live[:, None] & inside[None, :] & ~open_).to(tl.float32)   # the chosen: open no more
    partial = partial_ptr + program.to(tl.int64) * 2 * E + cols
    tl.store(partial, tl.sum(tl.where(live[:, None], probs, 0.0), axis=0), mask=inside)
    tl.store(partial + E, tl.sum(taken, axis=0), mask=inside)


@triton.jit
def _totals_kernel(partial_ptr, counts_ptr, aux_ptr, P, T, E, TOP_K: tl.constexpr,
                   BLOCK_P: tl.constexpr, BLOCK_E: tl.constexpr):
    cols = tl.arange(0, BLOCK_E)
    inside = cols < E
    parts = tl.arange(0, BLOCK_P)
    probs = tl.zeros((BLOCK_P, BLOCK_E), tl.float32)
    counts = tl.zeros((BLOCK_P, BLOCK_E), tl.int64)
    for start in range(0, P, BLOCK_P):
        mask = ((start + parts) < P)[:, None] & inside[None, :]
        row = partial_ptr + (start + parts).to(tl.int64)[:, None] * 2 * E + cols[None, :]
        probs += tl.load(row, mask=mask, other=0.0)
        counts += tl.load(row + E, mask=mask, other=0.0).to(tl.int64)
    count = tl.sum(counts, axis=0)
    tl.store(counts_ptr + cols, count, mask=inside)
    fraction = count.to(tl.float32) / tl.maximum(T * TOP_K, 1)
    mean_prob = tl.sum(probs, axis=0) / tl.maximum(T, 1)
    tl.store(aux_ptr, E * tl.sum(tl.where(inside, fraction * mean_prob, 0.0), axis=0))


@triton.jit
def _backward_kernel(dweights_ptr, daux_ptr, logits_ptr, ids_ptr, counts_ptr, dlogits_ptr, stride_dw_t, stride_dw_k,
                     T, E, stride_t, stride_e, TOP_K: tl.constexpr, NORMALIZE: tl.constexpr,
                     BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    live = rows < T
    rows = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK_E)
    probs, inside = _softmax(logits_ptr, rows, live, cols, E, stride_t, stride_e)
    dchosen = tl.zeros((BLOCK_T, BLOCK_E), tl.float32)   # each chosen expert's dweight, in its column
    chosen = tl.zeros((BLOCK_T, BLOCK_E), tl.int1)
    total = tl.zeros((BLOCK_T,), tl.float32)   # the chosen probabilities' sum S
    dot = tl.zeros((BLOCK_T,), tl.float32)     # Σ dw·p over the chosen
    for k in tl.static_range(TOP_K):
        pick = tl.load(ids_ptr + rows * TOP_K + k, mask=live, other=0)
        dw = tl.load(dweights_ptr + rows * stride_dw_t + k * stride_dw_k, mask=live, other=0.0)
        this = cols[None, :] == pick[:, None]
        p = tl.sum(tl.where(this, probs, 0.0), axis=1)
        total += p
        dot += dw * p
        dchosen = tl.where(this, dw[:, None], dchosen)
        chosen = chosen | this
    if NORMALIZE:   # w = p / S: dp_j = (dw_j - Σ dw·w) / S for the chosen j
        total = tl.where(live, total, 1.0)   # a masked row: no 0 / 0
        dchosen = (dchosen - (dot / total)[:, None]) / total[:, None]
    # the aux loss's: E · f_e / T for every token's p_e, f_e = counts_e / (T·k)
    counts = tl.load(counts_ptr + cols, mask=inside, other=0).to(tl.float32)
    daux = tl.load(daux_ptr) * E * (counts / (T * TOP_K)) / T
    dprobs = tl.where(chosen, dchosen, 0.0) + daux[None, :]
    dlogits = probs * (dprobs - tl.sum(probs * dprobs, axis=1)[:, None])
    tl.store(dlogits_ptr + rows[:, None] * E + cols[None, :], dlogits, mask=live[:, None] & inside[None, :])


def settings(experts: int, top_k: int, has_bias: bool = False, normalize: bool = True) -> dict:
    """Each launch's constexprs and warps for rows of ``experts`` logits, ``top_k`` chosen, a bias
    or none, normalized or not: ``route``, ``totals`` and ``backward``, on every backend and in
    :func:`aot` (one function, so the ISA tests compile what a call launches). A per-token program
    holds :data:`TILE_ELEMENTS` logits, BLOCK_T tokens of BLOCK_E experts, 4 a thread over
    NUM_WARPS 64-lane waves (one 16-byte load each): few registers per tile, so 8 waves fit per
    SIMD (the ISA test asserts both), and at 16K tokens of 128 experts the 2048 programs cover
    every CU several times over."""
    block_e = next_power_of_2(max(experts, 1))
    tile = dict(TOP_K=top_k, BLOCK_T=max(1, TILE_ELEMENTS // block_e), BLOCK_E=block_e, num_warps=NUM_WARPS)
    return dict(route=dict(tile, BLOCK_K=next_power_of_2(top_k), HAS_BIAS=has_bias, NORMALIZE=normalize),
                totals=dict(TOTALS, TOP_K=top_k, BLOCK_E=block_e), backward=dict(tile, NORMALIZE=normalize))


class Launches:
    """The three launches on (``tokens``, ``experts``) logits laid out ``stride_t``, ``stride_e``
    apart, ``top_k`` chosen per token, a bias ``stride_bias`` apart or none (``stride_bias``
    None), ``normalize``: every argument after the tensors worked out once
    (:func:`kernels.triton_support.run_args`), so a call only allocates and launches."""

    def __init__(self, tokens: int, experts: int, top_k: int, stride_t: int, stride_e: int,
                 stride_bias: int | None, normalize: bool):
        chosen = settings(experts, top_k, stride_bias is not None, normalize)
        self.programs = cdiv(tokens, chosen["route"]["BLOCK_T"])
        self.tokens, self.experts, self.top_k = tokens, experts, top_k
        self.partial_shape = (self.programs, 2, experts)
        self.route_args, self.route_kwargs = run_args(
            _route_kernel, 5, (tokens, experts, stride_t, stride_e, stride_bias or 0), (self.programs,),
            chosen["route"])
        self.totals_args, self.totals_kwargs = run_args(
            _totals_kernel, 3, (self.programs, tokens, experts), (1,), chosen["totals"])
        self.backward_args, self.backward_kwargs = run_args(
            _backward_kernel, 8, (tokens, experts, stride_t, stride_e), (self.programs,), chosen["backward"])

    def forward(self, logits: torch.Tensor, bias: torch.Tensor | None):
        """(weights (T, k) fp32, ids (T, k) int32, counts (E,) int64, aux () fp32)."""
        device = logits.device
        weights = new_output((self.tokens, self.top_k), torch.float32, device)
        ids = new_output((self.tokens, self.top_k), torch.int32, device)
        counts = new_output((self.experts,), torch.int64, device)
        aux = new_output((), torch.float32, device)
        partial = new_output(self.partial_shape, torch.float32, device)
        if self.programs:
            _route_kernel.run(logits, logits if bias is None else bias, weights, ids, partial,
                              *self.route_args, **self.route_kwargs)
        _totals_kernel.run(partial, counts, aux, *self.totals_args, **self.totals_kwargs)
        return weights, ids, counts, aux

    def backward(self, dweights: torch.Tensor, daux: torch.Tensor, logits: torch.Tensor, ids: torch.Tensor,
                 counts: torch.Tensor) -> torch.Tensor:
        """dlogits (T, E) fp32, contiguous."""
        dlogits = new_output((self.tokens, self.experts), torch.float32, logits.device)
        if self.programs:
            _backward_kernel.run(dweights, daux, logits, ids, counts, dlogits, *dweights.stride(),
                                 *self.backward_args, **self.backward_kwargs)
        return dlogits


def aot() -> list[AotKernel]:
    """The forward's two launches and the backward's at :data:`AOT_SHAPE`, contiguous fp32 logits,
    no bias, normalized, for an ahead-of-time compile (:func:`workbench.isa.compile.compile_aot`)."""
    tokens, experts, top_k = AOT_SHAPE
    chosen = settings(experts, top_k, has_bias=False, normalize=True)
    programs = cdiv(tokens, chosen["route"]["BLOCK_T"])
    ints = dict(T=tokens, E=experts, stride_t=experts, stride_e=1, stride_bias=0, P=programs,
                stride_dw_t=top_k, stride_dw_k=1)
    ids = dict(ids_ptr="*i32", counts_ptr="*i64")
    return [aot_launch(kernel, torch.float32, chosen[name], ints, pointers=ids)
            for kernel, name in ((_route_kernel, "route"), (_totals_kernel, "totals"), (_backward_kernel, "backward"))]
