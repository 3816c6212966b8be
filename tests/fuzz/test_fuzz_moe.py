"""Fuzz the MoE layer and its parts: ``kernels.MoE`` against ``MoEReference`` (float64
as the reference, the same dtype as the baseline) forward and backward, and
``kernels.moe.route`` / ``permute`` / ``unpermute`` against plain torch (softmax + topk,
a stable sort, a weighted sum), with the index tensors sliced or offset in their storage."""
from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

import kernels
from fuzzing import (INDEX_LAYOUTS, LAYOUTS, assert_rule, index_tensor, laid_out, rounding_spread, sizes,
                     tensors)
from kernels.moe import MoEReference, permute, route, unpermute
from kernels.moe.layer_ladder.spec import bad_tokens
from moe_twins import run, twin

DTYPES = kernels.spec("moe").dtypes


@st.composite
def layers(draw):
    """(kernels.MoE, x): sizes, routing (normalized weights or not), shared experts and x's
    layout drawn; x (..., dim)."""
    dim, hidden, experts = draw(sizes(1, 12)), draw(sizes(1, 12)), draw(sizes(1, 5))
    top_k, shared, normalize = draw(st.integers(1, experts)), draw(sizes(0, 2)), draw(st.booleans())
    dtype = draw(st.sampled_from(DTYPES))
    torch.manual_seed(draw(st.integers(0, 2 ** 16)))
    layer = kernels.MoE(dim, hidden, experts, top_k, shared, normalize=normalize).to(dtype)
    batch = draw(st.sampled_from([(0,), (1,), (7,), (2, 3)]))
    x = draw(tensors((*batch, dim), dtype))
    # a near-tie between a token's k-th and (k+1)-th expert is a coin toss for any rounding
    assume(not bad_tokens(x.reshape(-1, dim), layer.router.weight, top_k, None).any())
    return layer, x


@given(case=layers())
def test_moe_matches_its_reference(case):
    layer, x = case
    if x.numel() == 0:   # no token: the output may depend on no parameter, no graph to walk
        got, want = layer(x), twin(layer, MoEReference, x.dtype)(x)
        assert got.shape == want.shape and got.dtype == want.dtype
        return
    got = run(layer, x)
    twins = twin(layer, MoEReference, x.dtype), twin(layer, MoEReference, torch.float64)
    base = run(twins[0], x)
    ref = run(twins[1], x.double())
    spread = rounding_spread(lambda near: (run(twins[0], near[0]), run(twins[1], near[0].double())),
                             (x,), got["out"].numel())
    # a top-1 layer with normalized weights (each p / p = 1) has a router gradient that is zero
    # in exact arithmetic: judged against the scale of the layer's other results
    scale = max(float(t.abs().max()) for t in ref.values() if t.numel())
    for name in got:
        assert_rule(name, got[name], ref[name], base[name], x.dtype,
                    "forward" if name == "out" else "backward", spread[name], scale)


def test_moe_under_autocast_returns_its_reference_dtype():
    """Bug 6: under ``autocast(bfloat16)`` the layer returns the dtype its reference returns."""
    torch.manual_seed(0)
    layer = kernels.MoE(8, 6, 4, 2, 1)
    x = torch.randn(5, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = layer(x), twin(layer, MoEReference, torch.float32)(x)
    assert got.dtype == want.dtype and got.shape == want.shape


def _distinct_logits(tokens, experts, seed):
    """Logits whose probabilities have no ties (ties go to the lowest id, torch.topk's
    order among ties is unspecified), so both routings must pick the same experts."""
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(tokens, experts, generator=gen).argsort(-1).float() * 0.7


@given(tokens=sizes(), experts=sizes(1, 6), data=st.data())
def test_route_is_softmax_top_k(tokens, experts, data):
    top_k = data.draw(st.integers(1, experts), label="top_k")
    logits = laid_out(_distinct_logits(tokens, experts, data.draw(st.integers(0, 99))),
                      data.draw(st.sampled_from(LAYOUTS), label="layout"))
    weights, ids = route(logits, top_k)
    (top, expected), (exact, _) = (logits.to(d).softmax(-1).topk(top_k, dim=-1)
                                   for d in (torch.float32, torch.float64))
    assert ids.dtype == torch.int32 and torch.equal(ids.long(), expected)
    assert_rule("weights", weights, exact / exact.sum(-1, keepdim=True),
                top / top.sum(-1, keepdim=True), torch.float32)


@st.composite
def routed(draw):
    """(x (T, K), ids (T, k) in a drawn layout, weights (T, k), experts)."""
    tokens, experts, width = draw(sizes()), draw(sizes(1, 5)), draw(sizes(1, 6))
    top_k = draw(st.integers(1, experts))
    weights, ids = route(_distinct_logits(tokens, experts, draw(st.integers(0, 99))), top_k)
    layout = draw(st.sampled_from(INDEX_LAYOUTS + ("transposed",)))
    x = draw(tensors((tokens, width), torch.float32))
    return x, index_tensor(ids, ids.dtype, layout), weights, experts


@given(case=routed())
def test_permute_sorts_by_expert_and_unpermute_sums_back(case):
    x, ids, weights, experts = case
    x_sorted, offsets, permutation = permute(x, ids, experts)
    expected = torch.sort(ids.reshape(-1), stable=True).indices
    assert torch.equal(permutation, expected)
    assert torch.equal(x_sorted, x[expected // ids.shape[1]])
    counts = torch.bincount(ids.reshape(-1).long(), minlength=experts)
    assert offsets.dtype == torch.int32 and torch.equal(offsets.long(), counts.cumsum(0))
    got = unpermute(x_sorted, laid_out(permutation, "sliced"), weights)
    want, base = ((x.to(d).unsqueeze(1) * weights.to(d).unsqueeze(-1)).sum(1)
                  for d in (torch.float64, torch.float32))
    assert_rule("unpermute", got, want, base, torch.float32)


@pytest.mark.parametrize("permutation", [[0, 0, 2, 3], [1, 1, 1, 1]], ids=["one repeat", "all one"])
def test_unpermute_refuses_a_repeated_index(permutation):
    """Bug 7: a permutation with a repeated entry is no permutation; it must be refused by name."""
    with pytest.raises(ValueError, match="permutation"):
        unpermute(torch.randn(4, 3), torch.tensor(permutation), torch.ones(2, 2))
