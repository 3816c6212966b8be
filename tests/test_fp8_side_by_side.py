"""kernels.fp8.side_by_side: FP8 layers of one x (attention's q, k and v) as one FP8 linear on their
weights side by side, against the layers run apart and float64; what it refuses to join."""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels.fp8 import Float8Linear, side_by_side
from kernels.outputs import poisoned_outputs
from workbench.gpu_report_fp8 import TRAIN_RECIPES
from workbench.harness.device_ops import device_ops

JOINABLE = ("tensorwise", "rowwise", "blockwise", "mxfp8")
OUT = (64, 32, 32)   # q, k and v of 2 query heads and 1 key-value head of 32
K = 64


def _layers(recipe: str, seed: int = 0, out=OUT, k: int = K, device="cpu", **settings) -> tuple[Float8Linear, ...]:
    torch.manual_seed(seed)
    return tuple(Float8Linear(k, n, bias=False, recipe=recipe, **settings).to(device) for n in out)


def _x(dtype=torch.float32, seed: int = 1, shape=(2, 5, K), device="cpu") -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(device, dtype).requires_grad_()


def _exact(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Eighths in [-1.75, 1.75] with 1.75 in every row's every 32 columns and in every column: each
    group any recipe scales (a row, a column, 32 or 128 of either, a 128 x 128 block) has amax
    1.75, so every scale is 1.75 / 448 = 2^-8 (mxfp8's e8m0 too), every FP8 value a multiple of 32
    up to 448 (exact in e4m3 and bf16), and a GEMM's sums of up to 64 products (multiples of 1024,
    below 2^24) exact in fp32: the results are the same bits in any summation order, so the test
    holds whatever BLAS the interpreter's dot runs on."""
    gen = torch.Generator().manual_seed(seed)
    values = torch.randint(-14, 15, (rows, cols), generator=gen) / 8
    i, j = torch.arange(rows)[:, None], torch.arange(cols)[None, :]
    return torch.where(((j - i) % 32 == 0) | (i == j % rows), 1.75, values)


def _run(layers, x, joint: bool, exact: bool = False):
    """Outputs and the gradients of x and each weight for fixed output gradients (:func:`_exact`
    ones with ``exact``), outputs poisoned."""
    with poisoned_outputs():
        ys = side_by_side(layers, x) if joint else tuple(layer(x) for layer in layers)
        gen = torch.Generator().manual_seed(2)
        dys = [(_exact(y.shape[:-1].numel(), y.shape[-1], seed=3 + n).reshape(y.shape) if exact
                else torch.randn(y.shape, generator=gen)).to(y.device, y.dtype) for n, y in enumerate(ys)]
        grads = torch.autograd.grad(ys, (x, *(layer.weight for layer in layers)), dys)
    return ys, grads, dys


def _exactly(layers: tuple[Float8Linear, ...]) -> tuple[Float8Linear, ...]:
    """``layers`` with :func:`_exact` weights."""
    with torch.no_grad():
        for n, layer in enumerate(layers):
            layer.weight.copy_(_exact(*layer.weight.shape, seed=10 + n))
    return layers


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).norm() / want.norm()).item()


def _follows_float64(layers, x) -> None:
    """The joint layer's outputs and every gradient within the bound the single layer's test holds
    (e4m3 rounds each operand to 2^-4: a GEMM's error is a few percent of its norm), each in the
    layers' shapes and dtypes, each weight's gradient contiguous in its parameter's layout."""
    ys, grads, dys = _run(layers, x, joint=True)
    x64 = x.detach().double().requires_grad_()
    w64 = [layer.weight.detach().double().requires_grad_() for layer in layers]
    want = [x64 @ w.t() for w in w64]
    want_grads = torch.autograd.grad(want, (x64, *w64), [dy.double() for dy in dys])
    for got, ref, layer in zip(ys, want, layers):
        assert got.shape == (*x.shape[:-1], layer.out_features) and got.dtype == x.dtype
        assert _rel(got.detach(), ref.detach()) < 0.08
    assert grads[0].dtype == x.dtype
    for got, ref, param in zip(grads, want_grads, (x, *(layer.weight for layer in layers))):
        assert got.shape == param.shape and got.is_contiguous()
        assert _rel(got, ref) < 0.08


@pytest.mark.parametrize("recipe", JOINABLE)
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_the_joint_layer_follows_float64_as_the_layers_apart_do(recipe, dtype):
    _follows_float64(_layers(recipe), _x(dtype))


@pytest.mark.parametrize("recipe", JOINABLE)
@pytest.mark.parametrize("shape", [(0, K), (2, 0, K), (1, K)], ids=["no rows", "no tokens", "one row"])
def test_empty_and_one_row_inputs_do_what_the_layers_apart_do(recipe, shape):
    """Each output in its layer's shape; no rows: zero gradients for x and every weight, as the sums
    over no tokens; one row: within the float64 bound."""
    layers = _layers(recipe)
    x = torch.randn(*shape).requires_grad_()
    if x.numel():
        _follows_float64(layers, x)
        return
    ys, grads, _ = _run(layers, x, joint=True)
    assert [y.shape for y in ys] == [(*shape[:-1], layer.out_features) for layer in layers]
    assert all(g.shape == p.shape and not g.any() for g, p in zip(grads, (x, *(layer.weight for layer in layers))))


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", TRAIN_RECIPES)
def test_on_this_gpu_the_joint_layer_follows_float64(recipe):
    """The real backend's FP8 kernels at a GQA block's widths (q 2048, k and v 512 of K 2048) and
    4096 tokens, bf16 x: the CPU test's bound, at 32 times its K (not yet measured on a GPU). The
    recipes the FP8 step's benchmark trains with (the single layer's GPU test,
    tests/test_fp8_training.py, takes every recipe)."""
    device = kernels.backend.current().device
    _follows_float64(_layers(recipe, out=(2048, 512, 512), k=2048, device=device),
                     _x(torch.bfloat16, shape=(2, 2048, 2048), device=device))


@pytest.mark.parametrize("recipe", ("rowwise", "mxfp8", "blockwise"))
def test_scales_along_the_weights_rows_or_k_give_each_layers_own_results(recipe):
    """Rowwise and mxfp8 scale each weight row, or 32 of its K, so joined they quantize every weight
    as apart: the outputs are the layers' own, bit for bit, and so are the weights' gradients
    (dy's columns and x's are scaled along the tokens, the same joined or apart). Blockwise too
    where each out_features is a multiple of its 128-row blocks. x's gradient is one dgrad GEMM
    over the joint dy: within float64's bound, not the sum of three (test above). Operands of
    :func:`_exact`: the same bits in any order of the GEMMs' sums."""
    out = (128, 128) if recipe == "blockwise" else OUT
    layers = _exactly(_layers(recipe, out=out))
    x = _exact(10, K, seed=1).reshape(2, 5, K).to(torch.bfloat16).requires_grad_()
    joint, joint_grads, dys = _run(layers, x, joint=True, exact=True)
    apart, apart_grads, _ = _run(layers, x, joint=False, exact=True)
    x64 = x.detach().double().reshape(-1, K)
    for y, dw, dy, layer in zip(joint, joint_grads[1:], dys, layers):   # the premise: every sum exact
        assert torch.equal(y, (x.double() @ layer.weight.double().t()).to(y.dtype))
        assert torch.equal(dw, (dy.double().reshape(-1, dy.shape[-1]).t() @ x64).float())
    for a, b in zip((*joint, *joint_grads[1:]), (*apart, *apart_grads[1:])):
        assert torch.equal(a, b)


def test_tensorwise_takes_one_weight_scale_over_the_joint_weight():
    """One scale per tensor spans the joint weight, as a fused QKV weight's does: where each
    weight's amax is the same (:func:`_exact` operands), joined and apart cast every weight alike and
    the outputs agree bit for bit; where one weight's amax is 2 (the others' 1.75), theirs are cast
    with its scale."""
    layers, x = _exactly(_layers("tensorwise")), _exact(10, K, seed=1).reshape(2, 5, K)   # every amax 1.75
    joint = side_by_side(layers, x)
    assert all(torch.equal(a, layer(x)) for a, layer in zip(joint, layers))
    with torch.no_grad():
        layers[0].weight[0, 0] = 2.0
    joint = side_by_side(layers, x)
    assert not torch.equal(joint[1], layers[1](x))
    scale = torch.tensor(2.0) / torch.finfo(layers[1].fp8_dtype).max   # the joint weight's
    w1 = (layers[1].weight / scale).to(layers[1].fp8_dtype).float() * scale
    x_scale = x.detach().abs().amax() / torch.finfo(layers[1].fp8_dtype).max
    x8 = (x.detach() / x_scale).to(layers[1].fp8_dtype).float() * x_scale
    torch.testing.assert_close(joint[1].detach(), x8 @ w1.t(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("recipe", ("rowwise", "tensorwise"))
def test_one_quantization_of_x_and_one_gemm_forward_one_of_dy_and_two_gemms_backward(recipe):
    """Device ops: the joint forward makes what one layer of all the out_features makes, plus the
    weights' copy; its backward what that layer's does, and no add of x's gradients."""
    layers, x = _layers(recipe), _x(torch.bfloat16)
    (whole,) = _layers(recipe, out=(sum(OUT),))
    whole_fwd = device_ops(lambda: whole(x))
    joint_fwd = device_ops(lambda: side_by_side(layers, x))
    apart_fwd = device_ops(lambda: [layer(x) for layer in layers])
    assert joint_fwd.triton == whole_fwd.triton < apart_fwd.triton
    assert dict(joint_fwd.torch_ops) == {"cat": 1}
    y, ys = whole(x), side_by_side(layers, x)
    whole_bwd = device_ops(lambda: torch.autograd.grad(y, (x, whole.weight), torch.ones_like(y),
                                                       retain_graph=True))
    joint_bwd = device_ops(lambda: torch.autograd.grad(ys, (x, *(layer.weight for layer in layers)),
                                                       [torch.ones_like(t) for t in ys], retain_graph=True))
    assert joint_bwd.triton == whole_bwd.triton
    assert dict(joint_bwd.torch_ops) == {"ones_like": 3, "cat": 1}   # the grads given; split's backward


def test_layers_that_cannot_share_a_gemm_are_refused():
    """None (the caller runs each alone): delayed scaling's histories are each layer's own; a bias,
    another recipe, format or scale rule, or another class."""
    x = _x()
    assert side_by_side(_layers("delayed"), x) is None
    biased = Float8Linear(K, 32, bias=True, recipe="rowwise")
    assert side_by_side((*_layers("rowwise")[:2], biased), x) is None
    assert side_by_side((*_layers("rowwise")[:2], *_layers("tensorwise")[:1]), x) is None
    assert side_by_side((*_layers("rowwise")[:2], *_layers("rowwise", grad_format="hybrid")[:1]), x) is None
    assert side_by_side((*_layers("mxfp8")[:2], *_layers("mxfp8", scale_rule="ocp")[:1]), x) is None
    assert side_by_side((*_layers("rowwise")[:2], torch.nn.Linear(K, 32, bias=False)), x) is None


def test_torch_compile_traces_the_joint_layer_without_graph_breaks():
    layers, x = _layers("rowwise"), _x(torch.bfloat16)

    def loss(x):
        return sum(y.float().square().sum() for y in side_by_side(layers, x))

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")(x)
    eager = loss(x)
    assert torch.equal(compiled, eager)
    params = (x, *(layer.weight for layer in layers))
    for a, b in zip(torch.autograd.grad(compiled, params), torch.autograd.grad(eager, params)):
        assert torch.equal(a, b)


def test_the_training_steps_converted_projections_run_as_one(monkeypatch):
    """workbench.train.ops.side_by_side joins converted q, k and v (one FP8 linear: kernels.fp8.side_by_side)."""
    from workbench.train import layers as train_layers, ops
    from workbench.train.presets import preset

    cfg = preset("cpu-smoke")
    attn = kernels.fp8.convert(train_layers.Attention(cfg, ops.resolve("workbench")), "rowwise",
                               keep_high_precision=())
    joined = []
    real = kernels.fp8.side_by_side
    monkeypatch.setattr(kernels.fp8, "side_by_side", lambda *a: joined.append(real(*a)) or joined[-1])
    x = torch.randn(1, 3, cfg.dim)
    q, k, v = ops.side_by_side((attn.q, attn.k, attn.v), x)
    assert len(joined) == 1 and joined[0] is not None
    torch.testing.assert_close(q, attn.q(x))   # fp32 sums of another GEMM shape: their order may differ
