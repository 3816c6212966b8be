"""The public GEMM: kernels.matmul (forward, autograd, batch dims, custom op, compile) and nn.Linear.

Judged by the harness rule (workbench.check.compare) against float64, with
torch.matmul in the same dtype as the baseline. Shapes stay <= 64 per dim: each
interpreted program costs ~1 ms.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

import kernels
from kernels import plans, registry
from kernels.gemm import linear as gemm_linear, v6_persistent as gemm_v6
from kernels.gemm.ops import best_rung
from kernels.outputs import poisoned_outputs
from workbench.check import compare

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
matmul = kernels.matmul   # also registers torch.ops.kernels.matmul
SHAPES = [((1, 1), (1, 1)), ((37, 53), (53, 29)), ((2, 3, 17), (17, 9)), ((5, 64), (64, 48))]


def rand(*shape, dtype=torch.float32, seed=0, requires_grad=False):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype).requires_grad_(requires_grad)


def assert_passes(out, reference, baseline, dtype, direction="forward"):
    fields = compare(out, reference, baseline, dtype, direction)
    assert fields["passed"], (f"{direction} {dtype}: error {fields['error']:.2e} > allowed "
                              f"{fields['allowed']:.2e}, {fields['mismatches']} elements off "
                              f"(worst at {fields['worst_index']})")


def test_best_rung_is_the_highest_triton_rung_that_runs_here():
    for dtype in DTYPES:
        chosen = best_rung("gemm", dtype)
        others = [r for r in kernels.variants("gemm", include_ref=False)
                  if r.kind == "triton" and r.runs_here() and r.supports(dtype)]
        assert chosen is others[-1] and chosen.rung == max(r.rung for r in others)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("a_shape,b_shape", SHAPES, ids=str)
def test_forward_and_backward_match_float64(a_shape, b_shape, dtype):
    a = rand(*a_shape, dtype=dtype, seed=1, requires_grad=True)
    b = rand(*b_shape, dtype=dtype, seed=2, requires_grad=True)
    grad = rand(*a_shape[:-1], b_shape[1], dtype=dtype, seed=3)
    out = matmul(a, b)
    assert out.shape == (*a_shape[:-1], b_shape[1]) and out.dtype == dtype
    grad_a, grad_b = torch.autograd.grad(out, (a, b), grad)

    base = torch.matmul(a, b)
    base_grad_a, base_grad_b = torch.autograd.grad(base, (a, b), grad)
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    ref = a64 @ b64
    ref_grad_a, ref_grad_b = torch.autograd.grad(ref, (a64, b64), grad.double())

    assert_passes(out, ref.detach(), base, dtype)
    assert_passes(grad_a, ref_grad_a, base_grad_a, dtype, "backward")
    assert_passes(grad_b, ref_grad_b, base_grad_b, dtype, "backward")


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_non_contiguous_operands_and_broadcast_gradient(dtype):
    a = rand(40, 24, dtype=dtype, seed=4).t().requires_grad_()           # (24, 40), column-major
    b = rand(40, 62, dtype=dtype, seed=5)[:, ::2].requires_grad_()       # (40, 31), column stride 2
    out = matmul(a, b)
    out.sum().backward()                                                 # grad_c is a stride-0 expand
    ones = torch.ones(24, 31, dtype=torch.float64)
    a64, b64 = a.detach().double(), b.detach().double()
    assert_passes(out, a64 @ b64, torch.matmul(a, b), dtype)
    assert_passes(a.grad, ones @ b64.t(), torch.matmul(torch.ones_like(out), b.t()), dtype, "backward")
    assert_passes(b.grad, a64.t() @ ones, torch.matmul(a.t(), torch.ones_like(out)), dtype, "backward")


@pytest.mark.parametrize("a,b,error,match", [
    (rand(4, 5), rand(6, 3), ValueError, "inner dimensions"),
    (rand(4, 5), rand(5, 3, dtype=torch.float16), TypeError, "dtypes differ"),
    (rand(4, 5).to(torch.int32), rand(5, 3).to(torch.int32), TypeError, "int32"),
    (rand(4, 5).to(torch.float8_e4m3fn), rand(5, 3).to(torch.float8_e4m3fn), TypeError, "matmul_fp8|float8"),
    (rand(4, 5), rand(2, 5, 3), ValueError, "b must be 2-D"),
    ([[1.0]], rand(1, 1), TypeError, "a must be a torch.Tensor"),
    (torch.tensor(1.0), rand(1, 3), ValueError, "a must have at least 1 dimension"),
    (rand(4, 5), torch.empty(5, 3, device="meta"), ValueError, "b is on meta"),
], ids=["inner", "dtypes", "int", "fp8", "b-3d", "list", "0-d", "device"])
def test_bad_inputs_are_refused_by_name(a, b, error, match):
    with pytest.raises(error, match=match):
        matmul(a, b)


EMPTY = [((0, 5), (5, 3)), ((4, 0), (0, 3)), ((4, 5), (5, 0)), ((2, 0, 5), (5, 3)),
         ((2, 3, 0), (0, 4)), ((0,), (0, 3)), ((3, 0), (0, 0))]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("a_shape,b_shape", EMPTY, ids=str)
def test_empty_operands_follow_torch(a_shape, b_shape, dtype):
    """M = 0, N = 0, an empty batch: empty results; K = 0: zeros; gradients shaped like
    the operands (zeros where torch's are), as torch.matmul gives them."""
    a = rand(*a_shape, dtype=dtype, requires_grad=True)
    b = rand(*b_shape, dtype=dtype, seed=1, requires_grad=True)
    out, expected = matmul(a, b), torch.matmul(a, b)
    assert out.shape == expected.shape and out.dtype == dtype and torch.equal(out, expected)
    grad = torch.ones_like(out)
    got = torch.autograd.grad(out, (a, b), grad)
    want = torch.autograd.grad(expected, (a, b), grad)
    for g, w in zip(got, want):
        assert g.shape == w.shape and torch.equal(g, w)


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors is a no-op")
def test_linear_takes_an_empty_batch_and_zero_features():
    layer = kernels.nn.Linear(5, 4)
    x = rand(0, 5, requires_grad=True)
    y = layer(x)
    y.sum().backward()
    assert y.shape == (0, 4) and torch.equal(layer.weight.grad, torch.zeros(4, 5))
    no_inputs = kernels.nn.Linear(0, 4)
    assert torch.equal(no_inputs(rand(3, 0)), no_inputs.bias.detach().expand(3, 4))


def test_stride_zero_views():
    """Broadcast (expanded) operands: a stride of 0 is a legal layout, read in place."""
    a = rand(1, 7, seed=2).expand(4, 7)
    b = rand(7, 1, seed=3).expand(7, 5)
    assert a.stride(0) == 0 and b.stride(1) == 0
    assert_passes(matmul(a, b), a.double() @ b.double(), torch.matmul(a, b), torch.float32)


def test_custom_op_passes_opcheck():
    a, b = rand(5, 7, seed=6, requires_grad=True), rand(7, 3, seed=7, requires_grad=True)
    torch.library.opcheck(torch.ops.kernels.matmul.default, (a, b))


def test_torch_compile_traces_without_graph_breaks():
    def loss(x, w):
        return matmul(x, w).relu().sum()

    x, w = rand(2, 6, 8, seed=8), rand(8, 5, seed=9, requires_grad=True)
    explained = torch._dynamo.explain(loss)(x, w)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    value = compiled(x, w)
    value.backward()
    expected = torch.matmul(x, w.detach()).relu().sum()
    assert torch.allclose(value.detach(), expected, rtol=1e-5)
    assert w.grad is not None and w.grad.shape == w.shape


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("bias", (True, False))
def test_linear_matches_torch_linear(dtype, bias):
    torch.manual_seed(0)
    ref = torch.nn.Linear(24, 10, bias=bias, dtype=dtype)
    ours = kernels.nn.Linear.from_torch(ref)
    assert isinstance(ours, torch.nn.Linear) and ours.weight is not ref.weight
    assert torch.equal(ours.weight, ref.weight)
    x = rand(3, 4, 24, dtype=dtype, seed=10)
    w64 = ref.weight.detach().double()
    expected = x.double() @ w64.t() + (ref.bias.detach().double() if bias else 0.0)
    assert_passes(ours(x).detach(), expected, ref(x).detach(), dtype)


BIASES = {"(N,)": lambda n, dtype: rand(n, dtype=dtype, seed=11),
          "strided": lambda n, dtype: rand(2 * n, dtype=dtype, seed=11)[::2],
          "(1,)": lambda n, dtype: rand(1, dtype=dtype, seed=11),
          "0-d": lambda n, dtype: rand(1, dtype=dtype, seed=11)[0],
          "expanded": lambda n, dtype: rand(1, dtype=dtype, seed=11).expand(n)}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", BIASES)
def test_linear_takes_every_bias_layout_torch_does(layout, dtype):
    """The epilogue reads the bias through its stride (0 for a broadcast one); result and every
    gradient against float64, judged by the harness beside F.linear's."""
    x = rand(2, 3, 24, dtype=dtype, seed=12, requires_grad=True)
    weight = rand(10, 24, dtype=dtype, seed=13, requires_grad=True)
    bias = BIASES[layout](10, dtype).requires_grad_()
    grad = rand(2, 3, 10, dtype=dtype, seed=14)
    with poisoned_outputs():
        out = gemm_linear.linear(x, weight, bias)
    got = torch.autograd.grad(out, (x, weight, bias), grad)
    base = torch.nn.functional.linear(x, weight, bias)
    base_grads = torch.autograd.grad(base, (x, weight, bias), grad)
    exact = [t.detach().double().requires_grad_() for t in (x, weight, bias)]
    ref = torch.nn.functional.linear(*exact)
    ref_grads = torch.autograd.grad(ref, exact, grad.double())
    assert_passes(out.detach(), ref.detach(), base.detach(), dtype)
    for g, r, b in zip(got, ref_grads, base_grads):
        assert g.shape == b.shape
        assert_passes(g, r, b, dtype, "backward")


def test_a_best_rung_without_a_launch_plan_gets_the_bias_added_to_its_result(monkeypatch):
    """A rung declared without a plan (a learner's, say) has no epilogue to take the bias: the
    linear adds it to the rung's result, as the three-node form does."""
    planless = dataclasses.replace(best_rung("gemm", torch.float32), rung=99, name="planless", plan=None)
    monkeypatch.setitem(registry._RUNGS, "gemm", [*registry._RUNGS["gemm"], planless])
    plans.invalidate()
    x, weight, bias = rand(3, 5, seed=1), rand(4, 5, seed=2), rand(4, seed=3)
    try:
        assert best_rung("gemm", torch.float32) is planless
        with poisoned_outputs():
            out = gemm_linear.linear(x, weight, bias)
        assert torch.equal(out, kernels.matmul(x, weight.t()).add_(bias))
    finally:
        plans.invalidate()


def test_linear_refuses_a_bias_the_result_does_not_broadcast():
    layer = kernels.nn.Linear(6, 4)
    layer.bias = torch.nn.Parameter(torch.randn(3))
    with pytest.raises(ValueError, match=r"bias must have shape \(4,\)"):
        layer(torch.randn(2, 6))


def test_the_linear_custom_op_passes_opcheck():
    x, w, b = rand(5, 7, seed=6, requires_grad=True), rand(3, 7, seed=7, requires_grad=True), rand(3, seed=8)
    torch.library.opcheck(torch.ops.kernels.linear.default, (x, w, b.requires_grad_()))
    torch.library.opcheck(torch.ops.kernels.linear.default, (x, w, None))


def test_a_compiled_linear_runs_the_epilogue_without_graph_breaks(monkeypatch):
    layer = kernels.nn.Linear(8, 5)
    x = rand(2, 6, 8, seed=8)
    explained = torch._dynamo.explain(layer)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    monkeypatch.setattr(gemm_linear, "_Linear", None)   # the custom op runs, not the eager Function
    out = compiled(x)
    out.sum().backward()
    expected = torch.nn.functional.linear(x, layer.weight.detach(), layer.bias.detach())
    torch.testing.assert_close(out.detach(), expected)
    assert layer.weight.grad is not None and torch.equal(layer.bias.grad, torch.full((5,), 12.0))


def test_linear_trains_a_tiny_regression():
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    y = x @ torch.randn(8, 3) + 0.5
    model = kernels.nn.Linear(8, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(8):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_import_kernels_stays_cheap():
    code = ("import sys, kernels; assert 'kernels.gemm' not in sys.modules; "
            "assert 'triton' not in sys.modules; kernels.matmul; assert 'kernels.gemm.ops' in sys.modules")
    env = {**os.environ, "KERNELS_BACKEND": "interpreter"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


@pytest.mark.parametrize("path", ["plain", "autograd", "custom op", "autocast", "split tail"])
def test_linear_adds_the_bias_before_rounding_to_bf16(path):
    """The bias cancels most of the product here, so the product's rounding to bf16 before the
    bias add (the result's rounding error before v6's bias epilogue) becomes a large share of the
    result, where torch's one rounding at the end gives the nearest bf16 of the exact value. Each
    way a call runs: eager without and with a gradient, the custom op (what a trace runs), autocast,
    and a split tail tile, whose bias the stream-K fix-up adds."""
    dtype = torch.float32 if path == "autocast" else torch.bfloat16
    theirs = torch.nn.Linear(1, 1, dtype=dtype)
    with torch.no_grad():
        theirs.weight.fill_(-0.7027)
        theirs.bias.fill_(0.6614)
    ours = kernels.nn.Linear.from_torch(theirs)
    x = torch.tensor([[1.5410]], dtype=dtype, requires_grad=path == "autograd")
    if path == "split tail":   # one tile split along K = 64 over the programs; the other 63 products are 0
        x, theirs.weight = torch.cat([x, x.new_zeros(1, 63)], 1), torch.nn.Parameter(
            torch.cat([theirs.weight.detach(), theirs.weight.new_zeros(1, 63)], 1))
        ours.weight = theirs.weight
        plan = gemm_v6.plan(x, ours.weight.t())
        assert plan.schedule.sk_tiles == 1 and plan.schedule.splits > 1
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=path == "autocast"), poisoned_outputs():
        got = (torch.ops.kernels.linear(x, ours.weight, ours.bias) if path == "custom op" else ours(x))
        assert torch.equal(got, theirs(x))
    if path == "autograd":
        assert type(got.grad_fn).__name__ == "_LinearBackward"


def test_compiled_matmuls_with_a_backward_guard_on_no_traced_plan():
    """aot_eager traces the backward's GEMMs (the autograd formula calls ``matmul``) with
    functional tensors while the forward's frame, which read the plan cache, is being guarded:
    plans of such tensors are not kept (kernels.plans.meta), so the guard sees only plain keys.
    Before, the cache held keys with FunctionalTensor in them and guard creation failed."""
    def swiglu_mlp(x, gate, up, down):
        return matmul(torch.nn.functional.silu(matmul(x, gate)) * matmul(x, up), down).sum()

    x = rand(9, 24, seed=12)
    weights = [rand(24, 20, seed=13), rand(24, 20, seed=14), rand(20, 24, seed=15)]
    torch._dynamo.reset()
    compiled = torch.compile(swiglu_mlp, fullgraph=True, backend="aot_eager")
    leaves = [w.clone().requires_grad_() for w in weights]
    compiled(x, *leaves).backward()
    plain = [w.clone().requires_grad_() for w in weights]
    swiglu_mlp(x, *plain).backward()
    for got, want in zip(leaves, plain):
        assert torch.allclose(got.grad, want.grad, rtol=1e-5, atol=1e-5)
