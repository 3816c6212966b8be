"""Balancing the router: the selection bias of route, z_loss, capacity and drops, the bias
update of aux-loss-free balancing, and the load per expert-parallel rank."""
from __future__ import annotations

import math

import pytest
import torch

from kernels.moe import expert_counts, route
from kernels.moe.routing import z_loss
from kernels.moe.routing_bias import update_bias
from kernels.moe.routing_capacity import capacity_keep, expert_capacity
from kernels.moe.routing_ranks import contiguous_placement, greedy_placement, rank_loads


def _logits(t, e, seed):
    return torch.randn(t, e, generator=torch.Generator().manual_seed(seed))


def test_bias_selects_but_weights_are_the_unbiased_probabilities():
    logits = _logits(40, 6, 0)
    bias = torch.tensor([0.0, 0.0, 0.5, 0.0, -0.5, 0.0])
    weights, ids = route(logits, 2, normalize=False, bias=bias)
    probs = logits.softmax(-1)
    assert torch.equal(ids.long(), (probs + bias).topk(2, dim=-1).indices)
    assert torch.equal(weights, probs.gather(1, ids.long()))
    assert not torch.equal(ids, route(logits, 2)[1])       # the bias did move tokens
    assert (ids == 2).sum() > (route(logits, 2)[1] == 2).sum()


def test_zero_bias_is_the_plain_router_bitwise():
    logits = _logits(33, 7, 1)
    for normalize in (True, False):
        plain = route(logits, 3, normalize)
        biased = route(logits, 3, normalize, bias=torch.zeros(7))
        assert all(torch.equal(a, b) for a, b in zip(plain, biased))


def test_bias_carries_no_gradient_into_the_weights():
    logits = _logits(5, 4, 2).double().requires_grad_()
    bias = torch.tensor([0.3, 0.0, 0.0, 0.0], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z: route(z, 2, bias=bias.detach())[0], (logits,))
    route(logits, 2, bias=bias)[0].sum().backward()
    assert bias.grad is None or not bias.grad.any()


@pytest.mark.parametrize("bias, message", [
    (torch.zeros(5), "bias has 5 experts but logits has 6"),
    (torch.zeros(6, dtype=torch.int64), "bias"),
    (torch.zeros(2, 3), "bias"),
])
def test_bad_bias_is_refused_by_name(bias, message):
    with pytest.raises((TypeError, ValueError), match=message):
        route(_logits(3, 6, 3), 2, bias=bias)


def test_z_loss_is_the_mean_squared_logsumexp():
    logits = _logits(9, 5, 4)
    expected = sum(math.log(sum(math.exp(v) for v in row)) ** 2 for row in logits.tolist()) / 9
    assert z_loss(logits).item() == pytest.approx(expected, rel=1e-6)
    assert z_loss(logits).dtype == torch.float32
    assert z_loss(logits.bfloat16()).item() == pytest.approx(z_loss(logits.bfloat16().float()).item())


def test_z_loss_sees_a_shift_the_routing_does_not():
    logits = _logits(16, 8, 5)
    shifted = logits + 3.0
    assert torch.equal(route(logits, 2)[1], route(shifted, 2)[1])
    assert z_loss(shifted) > z_loss(logits)
    assert z_loss(torch.zeros(3, 8)).item() == pytest.approx(math.log(8) ** 2)


def test_z_loss_of_no_tokens_is_zero_and_it_has_a_gradient():
    assert z_loss(torch.zeros(0, 4)).item() == 0.0
    logits = _logits(4, 3, 6).double().requires_grad_()
    assert torch.autograd.gradcheck(z_loss, (logits,))


def test_expert_capacity_is_the_exact_ceiling():
    assert expert_capacity(512, 2, 16, 1.0) == 64
    assert expert_capacity(512, 2, 16, 1.25) == 80
    assert expert_capacity(100, 1, 1, 1.1) == 110         # floats would give 111
    assert expert_capacity(10, 1, 3, 1) == 4
    assert expert_capacity(0, 2, 4, 2.0) == 0


@pytest.mark.parametrize("args, name", [((4, 1, 0, 1.0), "num_experts"), ((-1, 1, 2, 1.0), "tokens"),
                                        ((4, 1.5, 2, 1.0), "top_k"), ((4, 0, 2, 1.0), "top_k"),
                                        ((4, 1, 2, 0.0), "capacity_factor"),
                                        ((4, 1, 2, float("nan")), "capacity_factor")])
def test_expert_capacity_refuses_bad_arguments(args, name):
    with pytest.raises(ValueError, match=name):
        expert_capacity(*args)


def test_capacity_keeps_each_experts_first_slots_in_token_order():
    ids = torch.tensor([[0, 1], [1, 0], [0, 2], [1, 0]], dtype=torch.int32)
    assert capacity_keep(ids, 3, 2).tolist() == [[True, True], [True, True],
                                                 [False, True], [False, False]]
    assert capacity_keep(ids, 3, 0).sum() == 0
    assert capacity_keep(ids, 3, 4).all()


def test_drops_are_the_excess_over_capacity():
    _, ids = route(_logits(200, 8, 7) + torch.linspace(0, 2, 8), 2)
    counts = expert_counts(ids, 8)
    for capacity in (0, 10, 50, 80, 400):
        dropped = int((~capacity_keep(ids, 8, capacity)).sum())
        assert dropped == int((counts - capacity).clamp(min=0).sum())


def test_capacity_keep_refuses_bad_capacity():
    with pytest.raises(ValueError, match="capacity"):
        capacity_keep(torch.zeros(2, 1, dtype=torch.int32), 2, -1)


def test_update_bias_moves_against_the_load_error():
    bias = torch.tensor([0.0, 0.1, 0.0, 0.0])
    new = update_bias(bias, torch.tensor([10, 2, 4, 4]), 0.01)   # mean 5
    assert torch.equal(new, torch.tensor([-0.01, 0.11, 0.01, 0.01]))
    assert torch.equal(bias, torch.tensor([0.0, 0.1, 0.0, 0.0]))   # untouched
    assert torch.equal(update_bias(bias, torch.tensor([3, 3, 3, 3]), 0.01), bias)


@pytest.mark.parametrize("counts, gamma, match", [(torch.ones(3, dtype=torch.int64), 0.1, "counts has 3"),
                                                  (torch.ones(4, dtype=torch.int64), -0.1, "gamma"),
                                                  (torch.ones(4, dtype=torch.int64), True, "gamma")])
def test_update_bias_refuses_bad_arguments(counts, gamma, match):
    with pytest.raises(ValueError, match=match):
        update_bias(torch.zeros(4), counts, gamma)


def test_aux_loss_free_balancing_evens_a_skewed_router():
    logits = _logits(512, 8, 8) * 0.1 + torch.linspace(0, 0.3, 8)   # a fixed skewed router
    bias = torch.zeros(8)
    spread = []
    for _ in range(50):
        weights, ids = route(logits, 2, normalize=False, bias=bias)
        counts = expert_counts(ids, 8)
        spread.append(counts.max().item() / counts.float().mean().item())
        bias = update_bias(bias, counts, 0.001)
    assert spread[0] > 2.5 and max(spread[-10:]) < 1.11
    assert torch.equal(weights, logits.softmax(-1).gather(1, ids.long()))   # still unbiased


def test_rank_loads_sum_counts_onto_ranks():
    counts = torch.tensor([5, 1, 0, 7, 2, 2])
    placement = contiguous_placement(6, 3)
    assert placement.tolist() == [0, 0, 1, 1, 2, 2]
    assert rank_loads(counts, placement, 3).tolist() == [6, 7, 4]
    assert rank_loads(counts, torch.tensor([2, 2, 2, 0, 0, 1]), 3).tolist() == [9, 2, 6]


def test_greedy_placement_lowers_the_busiest_rank():
    counts = torch.tensor([40, 30, 20, 10, 5, 3, 1, 1])
    contiguous = rank_loads(counts, contiguous_placement(8, 4), 4)
    greedy = greedy_placement(counts, 4)
    assert greedy.bincount().tolist() == [2, 2, 2, 2]
    assert contiguous.max() == 70 and rank_loads(counts, greedy, 4).max() == 41
    assert rank_loads(counts, greedy, 4).max() >= counts.max()   # the hottest expert is a floor


@pytest.mark.parametrize("call, match", [
    (lambda: contiguous_placement(6, 4), "divisible"),
    (lambda: rank_loads(torch.ones(3, dtype=torch.int64), torch.tensor([0, 1, 3]), 3), r"\[0, 3\)"),
    (lambda: rank_loads(torch.ones(3, dtype=torch.int64), torch.tensor([0, 1]), 3), "placement has 2"),
])
def test_rank_functions_refuse_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()
