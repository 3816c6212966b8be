"""EPDispatcher's combine sums a token's k rows with the MoE's Triton k-sums, as the expert-parallel
layer does (tests/test_ep_moe_k_sum.py): the order-preserving combine's weighted sum is
:func:`kernels.moe.layer_ladder.slot_sum.slot_sum`, and both combines' backward is
:func:`kernels.moe.layer_ladder.combine_backward.combine_backward` at the experts' ranks. On 2
gloo processes, through dispatch, combine and backward: the order-preserving combine runs no torch
op on a (T, k, dim) tensor, for k > 1 no arithmetic torch op over the (T·k, dim) slot rows, and in
bf16 writes none of them in float32. Results against references, kernel outputs poisoned:

- out (order-preserving): each slot's row times its weight and the k products added in slot order
  in the accumulation type (float32; float64 for float64), rounded once: bitwise;
- y's gradient: ``w·dy`` in that type, rounded once to y's dtype: bitwise;
- the weights' gradient ``dy·y``: against float64 within the accumulation type's reassociation
  bound (a sum over dim, blocked in another order than a float64 reference's);
- x's gradient: against float64, as tests/test_ep_dispatch.py's autograd test does.

Odd shapes: T = 19 and 7 on the two ranks (not multiples of the k-sum's 16-token tile), y's dim
129 (past its 128-column tile), k = 1 and 3, naive and dedup handles, fp32, bf16 and fp64 (whose
sums and products the kernels keep in float64: ``kernels.triton_support.accumulated``).
"""
from __future__ import annotations

import itertools

import pytest
import torch

from kernels.comm.launch import run_local
from kernels.outputs import poisoned_outputs

from rows_by_hidden import RowsByHidden

pytestmark = pytest.mark.timeout(300)

TOKENS, X_DIM, Y_DIM, PER_RANK = (19, 7), 5, 129, 2
ARITHMETIC = {"aten.mul", "aten.sum", "aten.add", "aten._to_copy"}
"""Torch ops that would compute over the slot rows rather than move them."""
DTYPES = (torch.float32, torch.bfloat16, torch.float64)


def _data(rank, top_k, dtype):
    """Rank ``rank``'s x, ids, weights (float32) and output gradient; any rank can rebuild any other's."""
    g = torch.Generator().manual_seed(100 * top_k + rank)
    t, experts = TOKENS[rank], PER_RANK * len(TOKENS)
    x = torch.randn(t, X_DIM, generator=g).to(dtype)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(t)])
    weights = torch.rand(t, top_k, generator=g) + 0.1
    grad_out = torch.randn(t, Y_DIM, generator=g).to(dtype)
    return x, ids, weights, grad_out


def _expert(x, expert):
    """A stand-in expert on rows ``x`` of ``expert``: x's columns repeated to Y_DIM, times
    (expert + 1); elementwise, so the reference repeats it bitwise."""
    cols = torch.arange(Y_DIM) % X_DIM
    return x[:, cols] * (expert + 1).to(x.dtype)[:, None]


def _accumulation(dtype):
    return torch.promote_types(dtype, torch.float32)


def _case(rank, top_k, dtype, dedup, reduce):
    """One dispatch, combine and backward; returns the mismatches and the ops the spies saw."""
    from kernels.comm.ep_dispatch import EPDispatcher
    x, ids, weights, grad_out = _data(rank, top_k, dtype)
    t, cd = TOKENS[rank], _accumulation(dtype)
    ep = EPDispatcher(PER_RANK * len(TOKENS), dedup=dedup)
    xg, wg = x.clone().requires_grad_(), weights.clone().requires_grad_()
    with poisoned_outputs(), RowsByHidden((t * top_k, Y_DIM)) as slots, \
            RowsByHidden((t, top_k, Y_DIM)) as by_token:
        recv_x, recv_counts, h = ep.dispatch(xg, ids, wg)
        expert = torch.repeat_interleave(torch.arange(PER_RANK), recv_counts) + rank * PER_RANK
        y = _expert(recv_x, expert)
        out = ep.combine(y, h, reduce_on_sender=reduce)
        dx, dw, dy = torch.autograd.grad(out, (xg, wg, y), grad_out)
    failures = []

    def check(name, ok, detail=""):
        if not ok:
            failures.append(f"{name} {detail}")

    # the references, on this rank's tokens (their rows as any rank computes them)
    rows = _expert(x.repeat_interleave(top_k, dim=0), ids.reshape(-1)).view(t, top_k, Y_DIM)
    if not reduce:
        want = torch.zeros(t, Y_DIM, dtype=cd)
        for j in range(top_k):   # slot order, one rounding at the end
            want += rows[:, j].to(cd) * weights[:, j, None].to(cd)
        check("out", out.dtype == dtype and torch.equal(out, want.to(dtype)),
              f"max diff {(out.double() - want.double()).abs().max()}")
    exact_dw = torch.einsum("td,tkd->tk", grad_out.double(), rows.double())
    # the kernel's fp32 (fp64) dot, then the cast to the weights' float32
    bound = (2 * Y_DIM * torch.finfo(cd).eps * torch.einsum("td,tkd->tk", grad_out.double().abs(), rows.double().abs())
             + exact_dw.abs() * 2 ** -24)
    check("dw", ((dw.double() - exact_dw).abs() <= bound).all(),
          f"max diff {(dw.double() - exact_dw).abs().max()}")
    # y's gradient at this rank's experts: w·dy of each received row's source token
    everyone = [_data(r, top_k, dtype) for r in range(len(TOKENS))]
    src_dy = torch.stack([everyone[s][3][tok] for s, tok in zip(h.recv_src.tolist(), h.recv_token.tolist())]
                         ) if h.num_recv else dy.new_empty(0, Y_DIM)
    want_dy = (src_dy.to(cd) * h.recv_weights.to(cd)[:, None]).to(dtype)
    check("dy", dy.dtype == dtype and torch.equal(dy, want_dy))
    exact_dx = torch.zeros(t, X_DIM, dtype=torch.float64)
    for j in range(top_k):   # d(x[:, cols] · s)/dx: each column's gradient summed into its source column
        s = (ids[:, j] + 1).double()[:, None]
        exact_dx.index_add_(1, torch.arange(Y_DIM) % X_DIM, grad_out.double() * weights[:, j, None].double() * s)
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float64: 1e-12}[dtype]
    check("dx", torch.allclose(dx.double(), exact_dx, rtol=tol, atol=tol * exact_dx.abs().max()),
          f"max diff {(dx.double() - exact_dx).abs().max()}")
    return failures, slots.ops, slots.torch_ops(), slots.float32_outputs(), by_token.ops, h.num_recv


def _cases(rank, world):
    seen = {}
    for top_k, dtype, dedup, reduce in itertools.product((1, 3), DTYPES, (False, True), (False, True)):
        seen[top_k, str(dtype), dedup, reduce] = _case(rank, top_k, dtype, dedup, reduce)
    return seen


def test_combine_sums_with_triton_k_sums_and_its_backward_with_the_combine_kernel():
    for rank, seen in enumerate(run_local(_cases, 2, timeout=280, group_timeout=250)):
        for (top_k, dtype, dedup, reduce), (failures, slot_ops, torch_ops, f32, by_token, recv) in seen.items():
            name = (rank, top_k, dtype, dedup, reduce)
            assert failures == [], (name, failures)
            if reduce:   # the reducing combine keeps its torch sums (kernels.comm.ep_dispatch)
                continue
            assert by_token == [], (name, by_token)
            if top_k > 1:
                assert recv != TOKENS[rank] * top_k, "y has the slot rows' shape: the spy would see the experts' ops"
                assert slot_ops and not torch_ops & ARITHMETIC, (name, torch_ops)
                if dtype == "torch.bfloat16":
                    assert f32 == [], (name, f32)
