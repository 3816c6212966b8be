"""Under autocast, kernels' Linear takes an fp32 master weight into its autograd node and its
weight-gradient GEMM writes fp32 (kernels/gemm/wgrad.py): no bf16 rounding of the gradient and
no cast back to fp32 (issue 18). Judged against float64 on the operands the GEMMs see, beside
torch's autocast F.linear, whose weight gradient is a bf16 GEMM result cast to fp32."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels import plans, registry
from kernels.gemm import linear as gemm_linear, v6_persistent
from kernels.gemm.ops import best_rung
from kernels.outputs import poisoned_outputs
from torch._dynamo.backends.common import aot_autograd
from functorch.compile import make_boxed_func
from workbench.harness.check import compare
from workbench.harness.device_ops import device_ops
from rounding_units import UNIT

BF16 = torch.bfloat16
U32 = UNIT[torch.float32]   # fp32's unit roundoff
U16 = 2.0 ** -8    # bf16's
SHAPES = {   # x's shape, out_features
    "2-D odd": ((5, 37), 29),
    "3-D": ((2, 3, 37), 29),
    # 80 rows: the weight gradient's two 32 x 32 tiles split along its K (the rows) on the
    # interpreter's 4 programs, so the stream-K fix-up stores the fp32 C
    "split tail": ((2, 40, 37), 29),
}


def rand(*shape, dtype=torch.float32, seed=0, requires_grad=False):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype).requires_grad_(requires_grad)


def _step(fn, x, weight, bias, dy):
    """``fn(x, weight, bias)`` under bf16 autocast and its gradients for ``dy``, every output poisoned."""
    leaves = [t for t in (x, weight, bias) if t is not None and t.requires_grad]
    with torch.autocast("cpu", dtype=BF16), poisoned_outputs():
        y = fn(x, weight, bias)
        grads = torch.autograd.grad(y, leaves, dy)
    return y, dict(zip((id(t) for t in leaves), grads))


def _wgrad_bound(dy2: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """fp32 summation's error bound per element of ``dy2ᵀ @ x2``: rows · u · Σ|products|."""
    return dy2.shape[0] * U32 * (dy2.double().abs().t() @ x2.double().abs())


def _bf16_gemm_bound(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The error bound per element of a bf16 GEMM ``a @ b`` (fp32 accumulation, one rounding to
    bf16) against the float64 product of the same operands: the summation's, then bf16's rounding
    of the sum."""
    sums = _wgrad_bound(a.t(), b)
    return U16 * ((a.double() @ b.double()).abs() + sums) + sums


@pytest.mark.parametrize("x_dtype", (torch.float32, BF16), ids=str)
@pytest.mark.parametrize("bias", (True, False), ids=("bias", "no bias"))
@pytest.mark.parametrize("shape", SHAPES)
def test_an_fp32_master_weight_gets_the_fp32_gemms_gradient(shape, bias, x_dtype):
    """The weight's gradient is fp32, within fp32 summation's bound of the float64 product of the
    operands the GEMM reads (bf16 dy and x), and closer to it than torch's bf16-rounded one; y,
    x's and the bias's gradients pass the harness rule beside torch's, each in torch's dtype."""
    x_shape, n = SHAPES[shape]
    x = rand(*x_shape, dtype=x_dtype, seed=1, requires_grad=True)
    weight = rand(n, x_shape[-1], seed=2, requires_grad=True)
    b = rand(n, seed=3, requires_grad=True) if bias else None
    dy = rand(*x_shape[:-1], n, dtype=BF16, seed=4)
    y, ours = _step(gemm_linear.linear, x, weight, b, dy)
    base, theirs = _step(F.linear, x, weight, b, dy)
    assert y.dtype == base.dtype == BF16 and type(y.grad_fn).__name__ == "_LinearBackward"
    assert {k: g.dtype for k, g in ours.items()} == {k: g.dtype for k, g in theirs.items()}

    x2, dy2 = x.detach().to(BF16).reshape(-1, x_shape[-1]), dy.reshape(-1, n)
    if shape == "split tail":
        split = v6_persistent.plan(dy2.t(), x2)
        assert split.schedule.sk_tiles > 0 and split.fixup_settings is not None   # the fix-up stores C
    exact = dy2.double().t() @ x2.double()
    error, torch_error = ((g[id(weight)].double() - exact).abs() for g in (ours, theirs))
    assert (error <= _wgrad_bound(dy2, x2)).all(), error.max()
    assert error.max() < torch_error.max() / 16, (error.max(), torch_error.max())

    w64 = weight.detach().to(BF16).double()
    y64 = x2.double() @ w64.t() + (b.detach().to(BF16).double() if bias else 0.0)
    _passes(y.detach().reshape(-1, n), y64, base.detach().reshape(-1, n), "forward")
    _passes(ours[id(x)].reshape(-1, x_shape[-1]).to(BF16), dy2.double() @ w64,
            theirs[id(x)].reshape(-1, x_shape[-1]).to(BF16), "backward")
    if bias:
        _passes(ours[id(b)].to(BF16), dy2.double().sum(0), theirs[id(b)].to(BF16), "backward")


@pytest.mark.parametrize("region, weight_dtype", [(torch.float16, torch.float32), (BF16, torch.float16)], ids=str)
def test_any_region_writes_the_gradient_in_the_weights_dtype(region, weight_dtype):
    """An fp16 region's fp32 weight, a bf16 region's fp16 weight: the gradient comes in the weight's
    dtype, the GEMM's fp32 sum rounded once to it, closer to float64 than torch's (rounded to the
    region's dtype first)."""
    x, dy = rand(6, 37, seed=21, requires_grad=True), rand(6, 29, dtype=region, seed=22)
    weight = rand(29, 37, dtype=weight_dtype, seed=23, requires_grad=True)
    exact = dy.double().t() @ x.detach().to(region).double()
    errors = []
    for fn in (gemm_linear.linear, F.linear):
        with torch.autocast("cpu", dtype=region), poisoned_outputs():
            grad_w, = torch.autograd.grad(fn(x, weight), weight, dy)
        assert grad_w.dtype == weight_dtype
        errors.append((grad_w.double() - exact).abs().max())
    assert errors[0] < errors[1] / 4, errors


def _passes(out, reference, baseline, direction):
    fields = compare(out, reference, baseline, BF16, direction)
    assert fields["passed"], fields


def test_the_backward_casts_no_weight_gradient():
    """One Linear forward and backward under autocast, bf16 x, fp32 weight: the forward casts the
    weight once, inside the node; the backward runs its two GEMMs' launches and no torch op (before,
    autograd's backward of the weight's cast ran one ``_to_copy``). A call that builds its plan
    (every call, with plans paused) casts no more: the checks' stand-in is an allocation."""
    layer = kernels.nn.Linear(37, 29, bias=False)
    x, dy = rand(5, 37, dtype=BF16, seed=5, requires_grad=True), rand(5, 29, dtype=BF16, seed=6)
    with torch.autocast("cpu", dtype=BF16):
        forward = device_ops(lambda: layer(x))
        with plans.paused():
            missed = device_ops(lambda: layer(x))
        y = layer(x)
    assert dict(missed.torch_ops) == {"_to_copy": 1}, missed
    backward = device_ops(lambda: torch.autograd.grad(y, (x, layer.weight), dy, retain_graph=True))
    assert dict(forward.torch_ops) == {"_to_copy": 1} and forward.triton, forward
    assert dict(backward.torch_ops) == {} and backward.triton, backward


def test_a_weight_that_needs_no_gradient_is_cast_and_x_still_gets_its_own():
    x, weight, dy = rand(5, 37, seed=7, requires_grad=True), rand(29, 37, seed=8), rand(5, 29, dtype=BF16, seed=9)
    y, ours = _step(gemm_linear.linear, x, weight, None, dy)
    base, theirs = _step(F.linear, x, weight, None, dy)
    assert type(y.grad_fn).__name__ == "_LinearBackward" and list(ours) == [id(x)]
    assert ours[id(x)].dtype == torch.float32
    w16 = weight.to(BF16)   # x's gradient: a bf16 GEMM of dy and the cast weight, cast to x's fp32
    exact = dy.double() @ w16.double()
    for grads in (ours, theirs):   # torch's too: the bound is the GEMM's, not ours
        assert ((grads[id(x)].double() - exact).abs() <= _bf16_gemm_bound(dy, w16)).all()
    _, cast_first = _step(gemm_linear.linear, x, weight.to(BF16), None, dy)   # the path it takes: bits
    assert torch.equal(ours[id(x)], cast_first[id(x)])


def test_a_weight_laid_out_column_by_column_and_an_empty_batch():
    """A transposed view as the weight gets its gradient in its own shape; zero rows of x give a
    zero fp32 weight gradient (the sum over no tokens), as torch's."""
    weight = rand(37, 29, seed=10).t().requires_grad_()
    for rows in (6, 0):
        x, dy = rand(rows, 37, dtype=BF16, seed=11, requires_grad=True), rand(rows, 29, dtype=BF16, seed=12)
        _, ours = _step(gemm_linear.linear, x, weight, None, dy)
        grad = ours[id(weight)]
        assert grad.shape == weight.shape and grad.dtype == torch.float32
        exact = dy.double().t() @ x.detach().double()
        assert ((grad.double() - exact).abs() <= _wgrad_bound(dy, x.detach())).all()


def test_a_graph_of_the_backward_gets_a_differentiable_weight_gradient():
    """``create_graph=True``: the weight's gradient is differentiable (the GEMM with autograd, then a
    cast), and its own gradient is float64's within the bound of its roundings, as torch's is."""
    x, dy = rand(4, 37, dtype=BF16, seed=13, requires_grad=True), rand(4, 29, dtype=BF16, seed=14)
    weight = rand(29, 37, seed=15, requires_grad=True)
    grads = []
    for fn in (gemm_linear.linear, F.linear):
        with torch.autocast("cpu", dtype=BF16):
            grad_w, = torch.autograd.grad(fn(x, weight), weight, dy, create_graph=True)
        assert grad_w.dtype == torch.float32 and grad_w.requires_grad
        grads.append(torch.autograd.grad(grad_w.square().sum(), x)[0])
    # x's gradient is 2 dy @ grad_w: float64's, within what the roundings on the way can move it
    # (grad_w's GEMM, 2 grad_w's cast to bf16, then the bf16 GEMM with dy), torch's too
    rows, k = dy.shape
    exact_w = dy.double().t() @ x.detach().double()
    err_w = _bf16_gemm_bound(dy.t(), x.detach())
    most_w = (exact_w.abs() + err_w) * (1 + U16)
    dy_abs = dy.double().abs()
    bound = 2 * dy_abs @ (err_w + U16 * most_w) + (U16 + k * U32 * (1 + U16)) * 2 * (dy_abs @ most_w)
    exact = 2 * dy.double() @ exact_w
    for grad in grads:
        assert ((grad.double() - exact).abs() <= bound).all()


def test_a_best_rung_without_a_launch_plan_gives_its_result_in_the_weights_dtype(monkeypatch):
    planless = dataclasses.replace(best_rung("gemm", BF16), rung=99, name="planless", plan=None)
    monkeypatch.setitem(registry._RUNGS, "gemm", [*registry._RUNGS["gemm"], planless])
    plans.invalidate()
    try:
        assert best_rung("gemm", BF16) is planless
        x, dy = rand(5, 37, dtype=BF16, seed=16, requires_grad=True), rand(5, 29, dtype=BF16, seed=17)
        weight = rand(29, 37, seed=18, requires_grad=True)
        _, ours = _step(gemm_linear.linear, x, weight, None, dy)
        assert torch.equal(ours[id(weight)], planless(dy.t(), x.detach()).float())
    finally:
        plans.invalidate()


def test_the_master_weight_custom_ops_pass_opcheck():
    x, weight = rand(5, 37, dtype=BF16, seed=24, requires_grad=True), rand(29, 37, seed=25, requires_grad=True)
    for bias in (rand(29, dtype=BF16, seed=26, requires_grad=True), None):
        torch.library.opcheck(torch.ops.kernels.linear_master_weight.default, (x, weight, bias))
    torch.library.opcheck(torch.ops.kernels.matmul_to.default,
                          (rand(29, 5, dtype=BF16, seed=27), rand(5, 37, dtype=BF16, seed=28), torch.float32))


def test_a_compiled_linear_under_autocast_agrees_with_eager():
    """The traced path (fullgraph, no graph break) takes the master weight too: its custom ops give
    eager's bits, the fp32 weight gradient included, and its backward graph casts no weight gradient."""
    layer = kernels.nn.Linear(37, 29)
    x, dy = rand(2, 3, 37, dtype=BF16, seed=19, requires_grad=True), rand(2, 3, 29, dtype=BF16, seed=20)
    graphs = []

    def keep(graph, _):
        graphs.append(graph.code)
        return make_boxed_func(graph)

    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep))
    results = []
    for fn in (layer, compiled):
        with torch.autocast("cpu", dtype=BF16):
            y = fn(x)
        results.append((y, *torch.autograd.grad(y, (x, layer.weight, layer.bias), dy)))
    for ours, theirs in zip(*results):
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)
    forward, backward = graphs
    assert "kernels.linear_master_weight" in forward and "kernels.matmul_to" in backward
    assert backward.count("aten._to_copy") == 1   # the bias's gradient, as before; none for the weight


@pytest.mark.gpu
def test_on_this_gpu_the_weight_gradient_is_the_fp32_gemms():
    """gpu-dense-1b's q projection (2048 -> 2048) over 4096 tokens under bf16 autocast on the real
    backend: the fp32 master weight's gradient within fp32 summation's bound of the float64
    product of the bf16 operands, and at least 16x closer to it than torch's autocast F.linear's,
    as on the CPU."""
    device = kernels.backend.current().device
    x = rand(4096, 2048, seed=1).to(device).requires_grad_()
    weight = (rand(2048, 2048, seed=2) / 45).to(device).requires_grad_()
    dy = rand(4096, 2048, dtype=BF16, seed=3).to(device)
    grads = []
    for fn in (gemm_linear.linear, F.linear):
        with torch.autocast(torch.device(device).type, dtype=BF16):
            y = fn(x, weight, None)
        grads.append(torch.autograd.grad(y, weight, dy)[0])
    ours, theirs = grads
    x2 = x.detach().to(BF16)
    exact = dy.double().t() @ x2.double()
    error, torch_error = ((g.double() - exact).abs() for g in (ours, theirs))
    assert ours.dtype == torch.float32
    assert (error <= _wgrad_bound(dy, x2)).all(), error.max()
    assert error.max() < torch_error.max() / 16, (error.max(), torch_error.max())
