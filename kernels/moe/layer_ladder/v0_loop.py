"""v0 loop: route, then for each expert gather its tokens, run three matmuls, scatter back.

Idea:
    The layer as most people first write it, on the product's router
    (:func:`kernels.moe.route`): router logits in float32, softmax and top-k; then a
    Python loop over the experts. For expert e, find the (token, slot) pairs that chose
    it (a host sync), gather those rows of x, run ``silu(x @ gate[e]) * (x @ up[e])``
    and ``@ down[e]`` with the vendor GEMM, and write the result into its slots of a
    ``(T, k, dim)`` buffer. Each token's k slots are then weighted and summed in float32.
    Autograd differentiates all of it.

Why faster:
    It is the start of the ladder, not faster than anything. Per expert it costs a
    host sync (finding the rows), a gather, three GEMM launches and a scatter, 3·E GEMM
    launches in the forward and twice that in the backward, each sized by one expert's
    share of the tokens: with 128 experts and 4096 tokens top-8, 256 rows per GEMM on
    average, far too few to fill an MI300X's 304 CUs.

Expected bound:
    Launch and sync latency when experts get few rows; at many rows per expert the
    vendor GEMM's efficiency per expert (model, not measured here).

Limits:
    Host syncs make it unusable inside a CUDA/HIP graph. The gather's backward is an
    ``index_add``, which on a GPU accumulates with atomics: the gradient of x is not
    bitwise reproducible. Writing into slots (not ``index_add`` into tokens) keeps the
    forward reproducible and lets the harness's poisoned buffer catch an unwritten slot.
"""
from __future__ import annotations

import torch.nn.functional as F

from ...outputs import new_output
from ...registry import rung
from ..routing import route
from .checks import moe_operands
from .spec import DTYPES


@rung(op="moe", rung=0, name="loop", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="library", backward=True)
def moe_loop(x, router, gate, up, down, top_k):
    moe_operands(x, router, gate, up, down, top_k, DTYPES)
    weights, ids = route(F.linear(x.float(), router.float()), top_k)
    slots = new_output((x.shape[0], top_k, down.shape[2]), x.dtype, x.device)
    # exercise begin: experts
    for e in range(router.shape[0]):
        token, slot = (ids == e).nonzero(as_tuple=True)
        if token.numel():
            rows = x[token]
            slots[token, slot] = (F.silu(rows @ gate[e]) * (rows @ up[e])) @ down[e]
    return (slots.float() * weights.unsqueeze(-1)).sum(dim=1).to(x.dtype)
    # exercise end
