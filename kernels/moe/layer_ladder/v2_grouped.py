"""v2 grouped: route, permute by expert, three grouped GEMMs, unpermute.

Idea:
    Replace v0's loop over experts by data movement that sorts the work instead.
    :func:`kernels.moe.permute` sorts the T·k token-slots by expert (one stable sort)
    and gathers x into that order; the expert ids' offsets are the row ends that
    :func:`kernels.grouped_gemm` takes; gate and up are two grouped GEMMs over all
    experts at once, SwiGLU is elementwise, down is a third; :func:`kernels.moe.unpermute`
    gathers the rows back per token and sums each token's k outputs, weighted, in
    float32. The offsets never visit the host (``check_offsets=False``): the ids came
    from :func:`kernels.moe.route`, so they are in range by construction.

Why faster:
    Outside the grouped GEMMs, a fixed number of launches whatever E is: the router
    GEMM, a sort, a gather, an elementwise SwiGLU, a gather-and-sum, and no host sync
    of its own. Each grouped GEMM sees all T·k rows at once and can fill the GPU even
    when single experts get few rows; once it is one kernel (the grouped GEMM ladder,
    :mod:`kernels.moe.grouped_gemm`) the whole layer is free of host syncs and can be
    captured in a CUDA/HIP graph. Where ``kernels.grouped_gemm`` runs a per-expert loop
    (its ladder's v0), that loop reads the offsets on the host and launches per expert.
    The backward is as deterministic as the forward: permute and unpermute move data
    by permutations and sum over a fixed axis, no atomics.

Expected bound:
    The grouped GEMMs' (compute bound at large T·k per expert, weight-bandwidth bound
    when experts get few rows), plus the memory traffic of the permuted copies of x
    and of the (T·k, hidden) activations, which a fused kernel would avoid (model).

Limits:
    gate and up run as two grouped GEMMs, since the layer stores them apart; one
    GEMM over (E, dim, 2·hidden) would read x_sorted once. The permuted copies and
    the (T, k, dim) per-slot outputs live in HBM. Its speed is the grouped GEMM's: on
    this branch that is whatever :func:`kernels.grouped_gemm` runs.
"""
from __future__ import annotations

import torch.nn.functional as F

from ...registry import rung
from ..grouped_gemm.ops import grouped_gemm
from ..permutation import permute, unpermute
from ..routing import route
from .checks import moe_operands
from .spec import DTYPES


def routed_experts(x, weights, ids, gate, up, down):
    """The experts' part of the layer for a given routing: x (T, dim), weights and ids
    (T, k) -> (T, dim), through permute, grouped GEMMs and unpermute."""
    # exercise begin: grouped
    x_sorted, offsets, permutation = permute(x, ids, gate.shape[0], check_ids=False)
    hidden = (F.silu(grouped_gemm(x_sorted, gate, offsets, check_offsets=False))
              * grouped_gemm(x_sorted, up, offsets, check_offsets=False))
    return unpermute(grouped_gemm(hidden, down, offsets, check_offsets=False), permutation, weights,
                     check_permutation=False)
    # exercise end


@rung(op="moe", rung=2, name="grouped", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="library", backward=True)
def moe_grouped(x, router, gate, up, down, top_k):
    moe_operands(x, router, gate, up, down, top_k, DTYPES)
    weights, ids = route(F.linear(x.float(), router.float()), top_k)
    return routed_experts(x, weights, ids, gate, up, down)
