"""kernels.moe.route, aux_loss and expert_counts: the math, ties, determinism, errors."""
from __future__ import annotations

import pytest
import torch

from kernels.moe import aux_loss, expert_counts, route


def test_route_is_softmax_then_top_k_renormalized():
    logits = torch.randn(13, 7, generator=torch.Generator().manual_seed(0))
    weights, ids = route(logits, 3)
    probs = logits.softmax(-1)
    top, expected_ids = probs.topk(3, dim=-1)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    assert torch.equal(ids.long(), expected_ids)
    torch.testing.assert_close(weights, top / top.sum(-1, keepdim=True))
    raw, _ = route(logits, 3, normalize=False)
    torch.testing.assert_close(raw, top)


def test_route_computes_in_float32_for_low_precision_logits():
    logits = torch.randn(9, 5, generator=torch.Generator().manual_seed(1)).bfloat16()
    weights, ids = route(logits, 2)
    expected_w, expected_ids = route(logits.float(), 2)
    assert weights.dtype == torch.float32
    assert torch.equal(ids, expected_ids) and torch.equal(weights, expected_w)


def test_ties_go_to_the_lowest_expert_id():
    _, ids = route(torch.zeros(2, 5), 3)
    assert ids.tolist() == [[0, 1, 2], [0, 1, 2]]
    _, ids = route(torch.tensor([[1.0, 3.0, 3.0, 1.0, 3.0]]), 4)
    assert ids.tolist() == [[1, 2, 4, 0]]
    # 64 experts, every third tied at the top: at a handful of experts an unstable sort keeps
    # ties in order anyway (torch 2.13's CPU sort did up to 16 experts, not from 17 on)
    many = torch.zeros(3, 64)
    many[:, ::3] = 1.0
    _, ids = route(many, 8)
    assert ids.tolist() == [list(range(0, 24, 3))] * 3


def test_top_k_equal_to_num_experts_keeps_every_expert():
    logits = torch.randn(4, 3, generator=torch.Generator().manual_seed(2))
    weights, ids = route(logits, 3)
    assert sorted(ids[0].tolist()) == [0, 1, 2]
    torch.testing.assert_close(weights.sum(-1), torch.ones(4))


def test_route_is_bitwise_deterministic():
    logits = torch.randn(64, 16, generator=torch.Generator().manual_seed(3))
    first, second = route(logits, 4), route(logits.clone(), 4)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_route_gradcheck_in_float64():
    logits = torch.randn(5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    logits.requires_grad_()
    assert torch.autograd.gradcheck(lambda z: route(z, 2)[0], (logits,))
    assert torch.autograd.gradcheck(lambda z: route(z, 2, normalize=False)[0], (logits,))


def test_expert_counts_count_slots_including_empty_experts():
    ids = torch.tensor([[0, 3], [3, 1], [0, 3]], dtype=torch.int32)
    assert expert_counts(ids, 5).tolist() == [2, 1, 0, 3, 0]


def test_aux_loss_is_switch_formula():
    logits = torch.randn(11, 4, generator=torch.Generator().manual_seed(5), requires_grad=True)
    _, ids = route(logits, 2)
    loss = aux_loss(logits, ids)
    fraction = torch.bincount(ids.flatten().long(), minlength=4).float() / ids.numel()
    expected = 4 * (fraction * logits.softmax(-1).mean(0)).sum()
    torch.testing.assert_close(loss, expected)
    assert torch.equal(aux_loss(logits, ids, expert_counts(ids, 4)), loss)   # the layer passes its counts
    loss.backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_aux_loss_is_one_when_perfectly_balanced_and_e_when_collapsed():
    ids = torch.arange(4, dtype=torch.int32).view(4, 1)
    assert aux_loss(torch.zeros(4, 4), ids).item() == pytest.approx(1.0)
    collapsed = torch.zeros(4, 4)
    collapsed[:, 2] = 100.0
    assert aux_loss(collapsed, torch.full((4, 1), 2, dtype=torch.int32)).item() == pytest.approx(4.0)


@pytest.mark.parametrize("top_k", [2, 3])
def test_aux_loss_peaks_at_e_over_k_for_top_k(top_k):
    """A token's k slots go to k distinct experts, so no expert gets more than 1/k of the
    slots: the worst routing (every token's slots on the same k experts, all the
    probability on one of them) gives E/k, and no routing by :func:`route` exceeds it."""
    experts = 6
    ids = torch.arange(top_k, dtype=torch.int32).expand(5, top_k)
    collapsed = torch.zeros(5, experts)
    collapsed[:, 0] = 100.0
    assert aux_loss(collapsed, ids).item() == pytest.approx(experts / top_k)
    generator = torch.Generator().manual_seed(3)
    for _ in range(50):
        logits = torch.randn(7, experts, generator=generator) * 10
        assert aux_loss(logits, route(logits, top_k)[1]).item() <= experts / top_k + 1e-6


@pytest.mark.parametrize("top_k, match", [(5, "top_k=5 must be between 1"), (0, "top_k=0"),
                                          (1.0, "top_k must be an int")])
def test_route_refuses_top_k_out_of_range(top_k, match):
    with pytest.raises((ValueError, TypeError), match=match):
        route(torch.randn(3, 4), top_k)


def test_route_refuses_logits_that_are_not_2d_or_not_float():
    with pytest.raises(ValueError, match="logits must be 2-D"):
        route(torch.randn(2, 3, 4), 1)
    with pytest.raises(TypeError, match="logits has dtype int64"):
        route(torch.ones(2, 3, dtype=torch.int64), 1)


def test_route_aux_loss_and_counts_compile_without_graph_breaks():
    torch._dynamo.reset()

    @torch.compile(fullgraph=True, backend="aot_eager")
    def routed(logits):
        weights, ids = route(logits, 2)
        return weights, ids, aux_loss(logits, ids), expert_counts(ids, logits.shape[1])

    logits = torch.randn(10, 6, generator=torch.Generator().manual_seed(6))
    compiled = routed(logits)
    eager = (*route(logits, 2), aux_loss(logits, route(logits, 2)[1]),
             expert_counts(route(logits, 2)[1], 6))
    for got, want in zip(compiled, eager):
        torch.testing.assert_close(got, want)


def test_checked_counts_and_aux_loss_skip_only_the_second_look():
    """A layer passes ``checked=True`` for route's own ids and the logits route checked: the same
    numbers, bit for bit; a caller that does not say so still gets every error."""
    logits = torch.randn(13, 6, requires_grad=True)
    _, ids = route(logits, 2)
    counts = expert_counts(ids, 6)
    assert expert_counts(ids, 6, checked=True).equal(counts)
    assert aux_loss(logits, ids, counts, checked=True).equal(aux_loss(logits, ids))
    assert aux_loss(logits, ids, checked=True).equal(aux_loss(logits, ids, counts))
    with pytest.raises(ValueError, match="ids has 12 tokens but logits has 13"):
        aux_loss(logits, ids[:12])
    with pytest.raises(TypeError, match="ids has dtype float32"):
        expert_counts(ids.float(), 6)
