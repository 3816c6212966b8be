"""``kernels.moe.routing_fused.route_fused`` against ``route``, ``expert_counts`` and ``aux_loss`` (the
torch functions it stands for in the layers) and its gradient against float64 autograd of the
same formula: ties, bias, normalize, every top_k, odd E, no tokens, views, poisoned outputs,
its custom ops under opcheck and torch.compile, device ops, errors."""
from __future__ import annotations

import pytest
import torch

from kernels.moe import aux_loss, expert_counts, route
from kernels.moe import routing_fused
from kernels.moe.routing_fused import route_fused, routed
from kernels.outputs import poisoned_outputs
from workbench.harness.device_ops import device_ops
from rounding_units import UNIT

# Determinism (a run's bits on any GPU) is no atomics in the compiled kernels
# (tests/test_moe_routing_fused_isa.py): the interpreter runs programs one by one, so two runs here
# could not differ. The ids and counts are the torch functions' (equal). The weights and aux are held against their
# formula in float64 at those ids, within a bound of fp32 rounding computed from the shape, not a
# tolerance read off one machine's torch softmax (whose exp differs by CPU instruction set): each
# probability is exp over a sum of E exps, within (E + 4) units of 2^-24; normalized weights, twice
# that; the aux, E products of sums over T tokens, within (T + E + 4) units.
U = UNIT[torch.float32]   # fp32's unit roundoff


def _logits(tokens, experts, seed, scale=3.0):
    return torch.randn(tokens, experts, generator=torch.Generator().manual_seed(seed)) * scale


def _torch(logits, top_k, normalize=True, bias=None):
    weights, ids = route(logits, top_k, normalize, bias)
    counts = expert_counts(ids, logits.shape[1])
    return weights, ids, counts, aux_loss(logits, ids, counts)


def _assert_same_routing(ours, expected, logits, normalize=True):
    """``ours`` (route_fused's) against ``expected`` (:func:`_torch`'s): ids and counts equal, the
    weights and aux within the fp32 bound above of their float64 values at those ids."""
    weights, ids, counts, aux = ours
    assert (weights.dtype, ids.dtype, counts.dtype, aux.dtype) == (torch.float32, torch.int32, torch.int64,
                                                                    torch.float32)
    assert weights.shape == expected[0].shape and aux.shape == ()
    assert torch.equal(ids, expected[1]) and torch.equal(counts, expected[2])
    tokens, experts = logits.shape
    probs = torch.softmax(logits.double(), dim=-1)
    exact = probs.gather(1, ids.long())
    if normalize:
        exact = exact / exact.sum(-1, keepdim=True)
    torch.testing.assert_close(weights.double(), exact, rtol=2 * (experts + 4) * U, atol=1e-300)
    if tokens:
        slots = counts.double() / (tokens * ids.shape[1])
        exact_aux = experts * (slots * probs.mean(0)).sum()
        torch.testing.assert_close(aux.double(), exact_aux, rtol=(tokens + experts + 4) * U, atol=1e-300)


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("tokens, experts, top_k", [(37, 8, 2), (130, 7, 3), (1, 5, 5), (29, 64, 8),
                                                    (9, 256, 1), (300, 12, 4), (3, 100, 6), (17, 1, 1),
                                                    (600, 40, 3)])   # 38 programs: 3 blocks of partials
def test_the_routing_is_route_expert_counts_and_aux_loss(tokens, experts, top_k, normalize):
    logits = _logits(tokens, experts, seed=tokens + experts)
    with poisoned_outputs():
        ours = route_fused(logits, top_k, normalize)
    _assert_same_routing(ours, _torch(logits, top_k, normalize), logits, normalize)


@pytest.mark.parametrize("top_k", range(1, 9))
def test_every_top_k_up_to_8(top_k):
    logits = _logits(21, 11, seed=top_k)
    _assert_same_routing(route_fused(logits, top_k), _torch(logits, top_k), logits)


def test_ties_go_to_the_lowest_expert_id_first():
    ids = route_fused(torch.zeros(2, 5), 3)[1]
    assert ids.tolist() == [[0, 1, 2], [0, 1, 2]]
    ids = route_fused(torch.tensor([[1.0, 3.0, 3.0, 1.0, 3.0]]), 4)[1]
    assert ids.tolist() == [[1, 2, 4, 0]]
    many = torch.zeros(3, 64)
    many[:, ::3] = 1.0
    _assert_same_routing(route_fused(many, 8), _torch(many, 8), many)
    assert route_fused(many, 8)[1].tolist() == [list(range(0, 24, 3))] * 3


def test_a_bias_moves_the_choice_not_the_weights():
    logits = _logits(40, 10, seed=3)
    bias = torch.randn(10, generator=torch.Generator().manual_seed(4)) * 0.3
    ours = route_fused(logits, 3, bias=bias)
    _assert_same_routing(ours, _torch(logits, 3, bias=bias), logits)
    assert not torch.equal(ours[1], route_fused(logits, 3)[1])   # the bias changed some choices
    strided = torch.randn(10, 3, generator=torch.Generator().manual_seed(5))[:, 1]     # stride 3
    _assert_same_routing(route_fused(logits, 2, False, strided), _torch(logits, 2, False, strided), logits, False)


def test_no_tokens_give_zero_counts_and_a_zero_aux_loss():
    for experts in (1, 6, 200):
        weights, ids, counts, aux = route_fused(torch.empty(0, experts), 1)
        assert weights.shape == ids.shape == (0, 1)
        assert torch.equal(counts, torch.zeros(experts, dtype=torch.int64)) and aux.item() == 0.0
    logits = torch.empty(0, 6, requires_grad=True)
    weights, _, _, aux = route_fused(logits, 2)
    (weights.sum() + aux).backward()
    assert logits.grad.shape == (0, 6)


def test_a_nan_row_ranks_nan_first_as_torchs_sort():
    logits = _logits(4, 6, seed=6)
    logits[1, 2] = float("nan")
    ours, expected = route_fused(logits, 2), _torch(logits, 2)
    assert torch.equal(ours[1], expected[1]) and torch.equal(ours[2], expected[2])
    assert ours[0][1].isnan().all() and expected[0][1].isnan().all()
    rows = [0, 2, 3]   # the other rows' weights: their float64 formula at the ids, as _assert_same_routing
    exact = torch.softmax(logits[rows].double(), dim=-1).gather(1, ours[1][rows].long())
    torch.testing.assert_close(ours[0][rows].double(), exact / exact.sum(-1, keepdim=True),
                               rtol=2 * (6 + 4) * U, atol=1e-300)


@pytest.mark.parametrize("view", ["transposed", "column slice", "expanded"])
def test_views_give_the_contiguous_result(view):
    base = _logits(33, 10, seed=7)
    logits = {"transposed": base.t().contiguous().t(), "column slice": _logits(33, 20, seed=7)[:, 5:15],
              "expanded": base[:1].expand(33, 10)}[view]
    ours = route_fused(logits, 3)
    assert all(torch.equal(a, b) for a, b in zip(ours, route_fused(logits.contiguous(), 3)))
    _assert_same_routing(ours, _torch(logits, 3), logits)


def _exact_gradient(logits, ids, counts, dweights, daux, normalize):
    """dlogits of ``Σ dweights·weights + daux·aux`` in float64 autograd, the chosen ids and counts
    held fixed (they are integers)."""
    x = logits.double().requires_grad_()
    probs = x.softmax(-1)
    weights = probs.gather(1, ids.long())
    if normalize:
        weights = weights / weights.sum(-1, keepdim=True)
    tokens, experts = logits.shape
    fraction = counts.double() / max(ids.numel(), 1)
    aux = experts * (fraction * probs.sum(0) / max(tokens, 1)).sum()
    (grad,) = torch.autograd.grad((weights * dweights.double()).sum() + aux * daux.double(), x)
    return grad


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("tokens, experts, top_k", [(37, 8, 2), (5, 33, 8), (1, 3, 3), (70, 6, 1)])
def test_the_gradient_is_float64_autograds(tokens, experts, top_k, normalize):
    logits = _logits(tokens, experts, seed=8 + top_k)
    gen = torch.Generator().manual_seed(9)
    dweights, daux = torch.randn(tokens, top_k, generator=gen), torch.randn((), generator=gen) * 5
    x = logits.clone().requires_grad_()
    with poisoned_outputs():
        weights, ids, counts, aux = route_fused(x, top_k, normalize)
        (grad,) = torch.autograd.grad((weights, aux), x, (dweights, daux))
    exact = _exact_gradient(logits, ids, counts, dweights, daux, normalize)
    assert grad.dtype == torch.float32 and grad.is_contiguous()
    torch.testing.assert_close(grad.double(), exact, rtol=1e-5, atol=1e-6)


def test_the_gradient_takes_each_part_alone_and_strided_dweights():
    """The aux loss's gradient alone, the weights' alone, and dweights broadcast from one row
    (stride 0, as a ``sum``'s gradient comes)."""
    logits = _logits(19, 9, seed=10)
    ids, counts = route_fused(logits, 3)[1:3]
    for dweights, daux in [(torch.zeros(19, 3), torch.tensor(2.0)), (torch.randn(19, 3), torch.tensor(0.0)),
                           (torch.randn(1, 3).expand(19, 3), torch.tensor(0.5))]:
        x = logits.clone().requires_grad_()
        weights, _, _, aux = route_fused(x, 3)
        (grad,) = torch.autograd.grad((weights, aux), x, (dweights, daux))
        torch.testing.assert_close(grad.double(), _exact_gradient(logits, ids, counts, dweights, daux, True),
                                   rtol=1e-5, atol=1e-6)
    x = logits.clone().requires_grad_()   # one output in the loss: the other's gradient never comes
    weights, _, _, aux = route_fused(x, 3)
    dweights = torch.randn(19, 3)
    for output, gradient, parts in [(weights, dweights, (dweights, torch.tensor(0.0))),
                                    (aux, torch.tensor(3.0), (torch.zeros(19, 3), torch.tensor(3.0)))]:
        (grad,) = torch.autograd.grad(output, x, gradient, retain_graph=True)
        torch.testing.assert_close(grad.double(), _exact_gradient(logits, ids, counts, *parts, True),
                                   rtol=1e-5, atol=1e-6)


def test_the_custom_ops_pass_opcheck():
    logits = _logits(6, 10, seed=13)
    torch.library.opcheck(torch.ops.kernels.moe_route.default, (logits.clone().requires_grad_(), None, 3, True))
    torch.library.opcheck(torch.ops.kernels.moe_route.default, (logits, torch.randn(10), 2, False))
    weights, ids, counts, aux = torch.ops.kernels.moe_route(logits, None, 3, True)
    torch.library.opcheck(torch.ops.kernels.moe_route_backward.default,
                          (torch.randn(6, 3), torch.tensor(0.5), logits, ids, counts, 3, True))


def test_torch_compile_keeps_both_ops_in_one_graph():
    def step(logits):
        weights, ids, counts, aux = route_fused(logits * 2, 3)
        return weights, ids, counts, aux

    logits = _logits(12, 10, seed=14)
    explained = torch._dynamo.explain(step)(logits)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    called = set()

    def record(gm, _):
        called.update(node.target for node in gm.graph.nodes if node.op == "call_function")
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend=aot_autograd(fw_compiler=record, bw_compiler=record))
    x, y = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    dweights = torch.randn(12, 3, generator=torch.Generator().manual_seed(15))
    ours, expected = compiled(x), step(y)
    assert all(torch.equal(a.detach(), b.detach()) for a, b in zip(ours, expected))
    (gx,) = torch.autograd.grad((ours[0], ours[3]), x, (dweights, torch.tensor(1.0)))
    (gy,) = torch.autograd.grad((expected[0], expected[3]), y, (dweights, torch.tensor(1.0)))
    assert torch.equal(gx, gy)
    assert {torch.ops.kernels.moe_route.default, torch.ops.kernels.moe_route_backward.default} <= called


def test_device_ops_are_two_launches_forward_and_one_backward():
    logits = _logits(30, 8, seed=16)
    forward = device_ops(lambda: route_fused(logits, 2))
    assert (forward.triton, dict(forward.torch_ops)) == (2, {})
    x = logits.clone().requires_grad_()
    weights, _, _, aux = route_fused(x, 2)
    dweights, daux = torch.randn(30, 2), torch.tensor(1.0)
    backward = device_ops(lambda: torch.autograd.grad((weights, aux), x, (dweights, daux), retain_graph=True))
    assert (backward.triton, dict(backward.torch_ops)) == (1, {})
    # what it stands for: route, expert_counts and aux_loss, 18 torch ops forward and 15 backward
    assert device_ops(lambda: _torch(logits, 2)).total == 18
    weights, _, _, aux = _torch(x, 2)
    torch_backward = device_ops(lambda: torch.autograd.grad((weights, aux), x, (dweights, daux), retain_graph=True))
    assert torch_backward.total == 15


def test_a_layer_routes_with_the_torch_functions_where_the_op_does_not_fit():
    logits = _logits(10, 12, seed=17)
    ours = device_ops(lambda: routed(logits, 9, True))
    assert ours.triton == 0
    assert all(torch.equal(a, b) for a, b in zip(routed(logits, 9, True), _torch(logits, 9)))
    assert device_ops(lambda: routed(logits, 8, True)).triton == 2


@pytest.mark.parametrize("logits, top_k, kwargs, error, match", [
    (torch.randn(3, 257), 2, {}, ValueError, "257 experts; route_fused holds .* at most 256"),
    (torch.randn(3, 12), 9, {}, ValueError, "top_k=9: route_fused chooses at most 8"),
    (torch.randn(3, 4), 5, {}, ValueError, "top_k=5 must be between 1 and the number of experts"),
    (torch.randn(3, 4), 0, {}, ValueError, "top_k=0 must be between 1"),
    (torch.randn(3, 4), 2.0, {}, TypeError, "top_k must be an int"),
    (torch.randn(3, 4).bfloat16(), 2, {}, TypeError, "logits has dtype bfloat16; this kernel takes float32"),
    (torch.randn(3, 4).double(), 2, {}, TypeError, "logits has dtype float64"),
    (torch.randn(12), 2, {}, ValueError, "logits must be 2-D"),
    (torch.randn(3, 4), 2, {"normalize": 1}, TypeError, "normalize must be a bool"),
    (torch.randn(3, 4), 2, {"bias": torch.randn(5)}, ValueError, "bias has 5 experts but logits has 4"),
    (torch.randn(3, 4), 2, {"bias": torch.randn(1, 4)}, ValueError, "bias must be 1-D"),
    (torch.randn(3, 4), 2, {"bias": torch.arange(4)}, TypeError, "bias has dtype int64"),
])
def test_bad_inputs_are_refused(logits, top_k, kwargs, error, match):
    with pytest.raises(error, match=match):
        route_fused(logits, top_k, **kwargs)


def test_kernels_moe_exports_it_beside_the_torch_router():
    import kernels.moe
    from kernels.moe import routing_fused

    assert kernels.moe.route_fused is routing_fused.route_fused and "route_fused" in kernels.moe.__all__


@pytest.mark.gpu
def test_on_this_gpu_gpu_moe_smalls_routing_is_the_torch_functions():
    """gpu-moe-small's router (16384 tokens, 32 experts, top 4) on the real backend against the
    torch functions on the same GPU, by the CPU test's rules, and its gradient against float64.
    Each token's logits are a permutation of values 0.25 apart (plus noise below 0.01): no two of
    a token's probabilities come within rounding of each other, so the GPU's exp cannot flip an
    id, and the ids and counts must be equal."""
    import kernels

    device = kernels.backend.current().device
    tokens, experts, top_k = 16384, 32, 4
    gen = torch.Generator().manual_seed(11)
    order = torch.rand(tokens, experts, generator=gen).argsort(dim=1)
    logits = (torch.linspace(-4.0, 3.75, experts)[order] + 0.01 * torch.rand(tokens, experts, generator=gen))
    dweights, daux = torch.randn(tokens, top_k, generator=gen), torch.tensor(5.0)
    logits, dweights, daux = (t.to(device) for t in (logits, dweights, daux))
    x = logits.clone().requires_grad_()
    with poisoned_outputs():
        ours = route_fused(x, top_k)
        (grad,) = torch.autograd.grad((ours[0], ours[3]), x, (dweights, daux))
    _assert_same_routing(tuple(t.detach() for t in ours), _torch(logits, top_k), logits)
    exact = _exact_gradient(logits, ours[1], ours[2], dweights, daux, True)
    torch.testing.assert_close(grad.double(), exact, rtol=1e-5, atol=1e-6)
