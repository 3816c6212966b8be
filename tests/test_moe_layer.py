"""kernels.MoE against kernels.moe.MoEReference: forward and every gradient, each dtype;
the edge cases of routing; the moe op in the harness; errors that name the argument."""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels.moe import MoE, MoEReference, aux_loss, route
from workbench.check import check
from workbench.harness.tolerances import allowed_error

from moe_twins import run, twin


def _layer(dtype=torch.float32, seed=0, **sizes):
    args = dict(dim=24, hidden=20, num_experts=6, top_k=2, shared_experts=0) | sizes
    torch.manual_seed(seed)
    return MoE(**args).to(dtype)


def _error(got, want):
    scale = want.abs().max().clamp_min(1e-30)
    return ((got.double() - want).abs().max() / scale).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shared", [0, 2])
def test_layer_matches_reference_forward_and_backward(dtype, shared):
    layer = _layer(dtype, shared_experts=shared)
    x = torch.randn(3, 7, 24, generator=torch.Generator().manual_seed(2)).to(dtype)
    exact = run(twin(layer, MoEReference, torch.float64), x.double())
    baseline = run(twin(layer, MoEReference, dtype), x)
    got = run(layer, x)
    assert got["out"].shape == x.shape and got["out"].dtype == dtype
    assert set(got) == set(exact) and all(got[n] is not None for n in got)
    for name in got:
        direction = "forward" if name == "out" else "backward"
        bound = allowed_error(dtype, _error(baseline[name], exact[name]), direction)
        assert _error(got[name], exact[name]) <= bound, name


def test_state_dicts_load_across_both_ways():
    layer = _layer(shared_experts=1)
    reference = twin(layer, MoEReference, torch.float32)
    assert list(reference.state_dict()) == list(layer.state_dict())
    back = twin(reference, MoE, torch.float32)
    x = torch.randn(5, 24)
    torch.testing.assert_close(back(x), reference(x))


@pytest.mark.parametrize("sizes, tokens", [
    (dict(num_experts=4, top_k=2), 1),            # one token: most experts empty
    (dict(num_experts=5, top_k=5), 9),            # top_k == num_experts
    (dict(num_experts=1, top_k=1), 8),            # one expert
])
def test_edge_cases_match_reference(sizes, tokens):
    layer = _layer(**sizes)
    x = torch.randn(tokens, 24, generator=torch.Generator().manual_seed(3))
    got, want = run(layer, x), run(twin(layer, MoEReference, torch.float32), x)
    for name in got:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-5)


def test_every_token_to_one_expert():
    layer = _layer(num_experts=5, top_k=1)
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.weight[3] = 10.0
    x = torch.rand(10, 24, generator=torch.Generator().manual_seed(4))   # positive: expert 3 wins
    got, want = run(layer, x), run(twin(layer, MoEReference, torch.float32), x)
    assert layer.expert_counts.tolist() == [0, 0, 0, 10, 0]
    for name in got:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-5)


def test_aux_loss_and_expert_counts_describe_the_last_call():
    layer = _layer()
    assert layer.aux_loss is None and layer.expert_counts is None
    x = torch.randn(2, 13, 24)
    layer(x)
    logits = x.reshape(-1, 24) @ layer.router.weight.t()
    _, ids = route(logits, 2)
    assert layer.expert_counts.dtype == torch.int64 and layer.expert_counts.sum().item() == 52
    torch.testing.assert_close(layer.aux_loss, aux_loss(logits, ids))
    layer.aux_loss.backward()
    assert layer.router.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("top_k", [2, 9])   # 9: past route_fused's 8, the torch functions route
def test_the_aux_loss_and_its_router_gradient_are_the_torch_functions(top_k):
    """The layer's routing (kernels.moe.routing_fused where it fits) against route, expert_counts
    and aux_loss of the same logits: counts equal, the aux loss and its gradient in the router's
    weight within fp32 rounding."""
    layer = _layer(num_experts=10, top_k=top_k)
    x = torch.randn(2, 13, 24, generator=torch.Generator().manual_seed(3))
    layer(x)
    layer.aux_loss.backward()
    router = layer.router.weight.detach().clone().requires_grad_()
    logits = x.reshape(-1, 24) @ router.t()
    _, ids = route(logits, top_k)
    expected = aux_loss(logits, ids)
    expected.backward()
    assert torch.equal(layer.expert_counts, torch.bincount(ids.flatten().long(), minlength=10))
    torch.testing.assert_close(layer.aux_loss, expected, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(layer.router.weight.grad, router.grad, rtol=1e-5, atol=1e-7)


def test_forward_and_backward_are_bitwise_deterministic():
    layer = _layer(torch.bfloat16, shared_experts=1)
    x = torch.randn(31, 24).bfloat16()
    first, second = run(layer, x), run(layer, x)
    assert all(torch.equal(first[n], second[n]) for n in first)


def test_layer_refuses_bad_arguments():
    layer = _layer()
    with pytest.raises(TypeError, match="dtypes differ .*x: float16"):
        layer(torch.randn(3, 24).half())
    with pytest.raises(ValueError, match=r"x must have shape \(..., dim=24\)"):
        layer(torch.randn(3, 23))
    with pytest.raises(ValueError, match="x is on meta"):
        layer(torch.randn(3, 24, device="meta"))
    with pytest.raises(ValueError, match="top_k=7 must be between 1"):
        MoE(8, 8, 6, 7)
    with pytest.raises(ValueError, match="top_k=0 must be between 1"):
        MoEReference(8, 8, 6, 0)
    with pytest.raises(ValueError, match="num_experts must be an int >= 1"):
        MoE(8, 8, 0, 1)


def test_kernels_exposes_the_layer_and_the_op():
    assert kernels.MoE is MoE and kernels.moe.MoEReference is MoEReference
    assert [r.title for r in kernels.variants("moe")] == ["v0 loop", "v2 grouped", "v3 fused", "ref"]


@pytest.mark.parametrize("shape", [(1, 24, 16, 4, 2, 0), (33, 24, 17, 5, 2, 2)])
def test_harness_passes_every_rung_in_bfloat16(shape):
    reports = check("moe", shapes=[shape], dtypes=[torch.bfloat16])
    assert len(reports) == 4 and all(r.passed for r in reports), [r.message for r in reports]


def test_make_inputs_avoids_near_ties_and_routes_as_named():
    spec = kernels.spec("moe")
    from kernels.moe.layer_ladder.spec import MIN_GAP
    x, router, *_, top_k = spec.make_inputs((200, 16, 8, 8, 2, 0), torch.bfloat16, seed=5)
    logits = (x.double() @ router.double().t()).sort(dim=-1, descending=True).values
    assert (logits[:, 1] - logits[:, 2]).min() >= MIN_GAP
    x, router, *_ = spec.make_inputs((50, 16, 8, 5, 1, 2), torch.float16, seed=6)
    assert route(x.float() @ router.float().t(), 1)[1].unique().numel() == 1


def test_layer_compiles_without_graph_breaks_and_runs_the_fused_op():
    """The whole layer under inductor (CPU): routing, v3's custom op (``kernels::moe_fused``,
    whose backward is ``kernels::moe_fused_backward``), the shared experts; as eager."""
    from torch._inductor.compile_fx import compile_fx

    graphs = []

    def inductor(gm, example_inputs):
        graphs.append(gm)
        return compile_fx(gm, example_inputs)

    torch._dynamo.reset()
    layer = _layer(shared_experts=1)
    x = torch.randn(9, 24, generator=torch.Generator().manual_seed(7))
    compiled = run(torch.compile(layer, fullgraph=True, backend=inductor), x)
    eager = run(layer, x)
    for name in eager:
        torch.testing.assert_close(compiled[name], eager[name])
    called = [node.target for gm in graphs for node in gm.graph.nodes if node.op == "call_function"]
    assert torch.ops.kernels.moe_fused.default in called


def test_shared_experts_take_the_rows_cast_once_for_all_experts():
    """Under autocast the rows are cast once, for routed and shared experts together (the same
    bits as autocast's cast of x for each of ``x @ gate`` and ``x @ up``, which cast x twice more
    and both gradients back), the float32 router casts nothing back and forth, the routing's ids
    and counts need no casts, and the expert weights' gradients come in fp32 from their dW
    launches: 17 casts in a forward and backward."""
    from workbench.harness.device_ops import device_ops

    layer = _layer(shared_experts=2)
    x = torch.randn(2, 9, 24, requires_grad=True)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = layer(x)
        out.float().sum().backward()

    assert device_ops(step).torch_ops["_to_copy"] == 17


def test_the_router_computes_in_float32_under_autocast(monkeypatch):
    """The layers' router logits are float32 whatever the autocast region: an autocast matmul
    would compute them in bf16, and top-k on bf16 logits picks other experts at near ties.
    Checked on the logits (the function both layers call, bitwise) and on the routing: under
    autocast, kernels.MoE sends each expert the tokens the float32 router sends it, and the
    reference layer's logits are the function's."""
    from kernels.moe import expert_counts
    from kernels.moe import reference
    from kernels.moe.routing import router_logits

    layer = _layer(shared_experts=1, num_experts=16)
    rows = torch.randn(256, 24, generator=torch.Generator().manual_seed(3)).bfloat16()
    want = rows.float() @ layer.router.weight.t()
    seen = []
    monkeypatch.setattr(reference, "router_logits", lambda x, w: seen.append(router_logits(x, w)) or seen[-1])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = router_logits(rows, layer.router.weight)
        assert torch.equal(layer.router_logits(rows), want)
        layer(rows)
        seen.clear()   # the reference layer's own call alone
        twin(layer, MoEReference, torch.float32)(rows)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert torch.equal(layer.expert_counts, expert_counts(route(want, 2)[1], 16))
    assert len(seen) == 1 and torch.equal(seen[0], want)
