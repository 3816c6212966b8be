"""An FP8 MoE layer's shared experts in FP8 (Float8Experts.fp8_shared_experts): what kernels.fp8.convert
decides, the results against Float8Linear layers and float64, the launches, autocast, torch.compile and the
expert-parallel layer (MFU: tests/test_fp8_moe.py)."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

import kernels
from kernels.fp8 import Float8Linear
from kernels.moe import swiglu_op
from kernels.moe.ep_fp8_layer import Float8ExpertParallelMoE
from kernels.moe.fp8_layer import Float8MoE
from kernels.moe.reference import swiglu
from kernels.outputs import poisoned_outputs
from workbench.harness.device_ops import device_ops

DIM, HIDDEN, EXPERTS, TOP_K, SHARED = 16, 32, 4, 2, 2
RECIPES = ("tensorwise", "rowwise", "blockwise", "mxfp8")   # delayed keeps them in high precision


class Block(torch.nn.Module):
    def __init__(self, shared: int = SHARED):
        super().__init__()
        self.inp = torch.nn.Linear(12, DIM)
        self.moe = kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K, shared)
        self.out = torch.nn.Linear(DIM, 6)


def _moe(recipe: str, seed: int = 0) -> Float8MoE:
    torch.manual_seed(seed)
    return kernels.fp8.convert(kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K, SHARED), recipe, keep_high_precision=())


def test_convert_keeps_the_shared_experts_unless_told_and_names_them():
    assert "*shared_experts" in kernels.fp8.KEEP_HIGH_PRECISION
    assert not kernels.fp8.convert(Block(), "rowwise").moe.fp8_shared_experts
    fp8 = kernels.fp8.convert(Block(), "rowwise", keep_high_precision=("first", "last", "*router"))
    assert fp8.moe.fp8_shared_experts and "fp8_shared_experts=True" in repr(fp8.moe)
    assert list(fp8.state_dict()) == list(Block().state_dict())   # no state of their own
    asked = []
    kernels.fp8.convert(Block(), "rowwise", keep_high_precision=lambda name, m: asked.append((name, m)) or False)
    assert ("moe.shared_experts", kernels.MoE) in [(name, type(m)) for name, m in asked]
    assert kernels.fp8.convert(kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K, SHARED), "rowwise",
                               keep_high_precision=("*router",)).fp8_shared_experts          # a bare layer's
    assert not kernels.fp8.convert(kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K, SHARED), "rowwise",
                                   keep_high_precision=("shared_experts",)).fp8_shared_experts
    assert not kernels.fp8.convert(Block(shared=0), "rowwise", keep_high_precision=()).moe.fp8_shared_experts


def test_delayed_scaling_keeps_the_shared_experts_with_a_warning():
    """Its histories cover the routed experts' operands only: convert warns, the setter refuses."""
    with pytest.warns(RuntimeWarning, match="'moe': the shared experts cannot run in FP8 under delayed scaling"):
        model = kernels.fp8.convert(Block(), "delayed", keep_high_precision=())
    assert not model.moe.fp8_shared_experts
    with pytest.raises(ValueError, match="cannot run in FP8 under delayed scaling"):
        model.moe.fp8_shared_experts = True
    with pytest.raises(ValueError, match="no shared experts"):
        kernels.fp8.convert(Block(shared=0), "rowwise").moe.fp8_shared_experts = True
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # kept by default: nothing to warn about
        kernels.fp8.convert(Block(), "delayed")


def _linears_of(layer: Float8MoE):
    """Float8Linear layers of ``layer``'s settings holding its shared weights as Linears store them, and
    the MLP they make: gate and up side by side (kernels.fp8.side_by_side), SwiGLU the routed experts'
    pass, then down."""
    recipe = layer.recipe
    grad_format = next(f for f in ("e4m3", "hybrid")   # the format whose dtype the recipe gives as the layer's
                       if kernels.fp8.get(recipe).grad_dtype(layer.fp8_dtype, f) == layer.grad_fp8_dtype)
    linears = []
    for w in (layer.shared_gate, layer.shared_up, layer.shared_down):
        linear = Float8Linear(w.shape[0], w.shape[1], bias=False, recipe=recipe, fp8_dtype=layer.fp8_dtype,
                              grad_format=grad_format, scale_rule=layer.scale_rule)
        linear.weight = torch.nn.Parameter(w.detach().t().contiguous())
        linears.append(linear)

    def mlp(x):
        g, u = kernels.fp8.side_by_side(tuple(linears[:2]), x)
        return linears[2](swiglu_op.swiglu(g, u))

    return linears, mlp


def _shared_and_as_linears(recipe: str, x: torch.Tensor):
    """The FP8 shared experts' output and gradients (of x and their three weights), and those of
    :func:`_linears_of`'s MLP (its weight gradients transposed, as the shared weights are stored)."""
    layer = _moe(recipe)
    linears, mlp = _linears_of(layer)
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(5), dtype=x.dtype)
    results = []
    for run, weights in ((layer.shared_mlp, (layer.shared_gate, layer.shared_up, layer.shared_down)),
                         (mlp, tuple(linear.weight for linear in linears))):
        with poisoned_outputs():
            y = run(x)
            results.append((y, *torch.autograd.grad(y, (x, *weights), dy)))
    results[1] = (*results[1][:2], *(g.t() for g in results[1][2:]))
    return layer, results


@pytest.mark.parametrize("recipe", RECIPES)
def test_fp8_shared_experts_are_float8_linears_of_the_layers_recipe(recipe):
    """Bit for bit the output and gradients of Float8Linear layers holding the same weights, within FP8's
    error of float64, and not the high-precision result."""
    x = torch.randn(13, DIM, generator=torch.Generator().manual_seed(1)).requires_grad_()
    layer, (shared, linears) = _shared_and_as_linears(recipe, x)
    for a, b in zip(shared, linears):
        assert torch.equal(a, b)
    ref = swiglu(x.detach().double(), *(w.detach().double() for w in (layer.shared_gate, layer.shared_up,
                                                                        layer.shared_down)))
    assert (shared[0].double() - ref).norm() <= 0.1 * ref.norm()   # e4m3: 2^-4 per element, two GEMMs deep
    layer.fp8_shared_experts = False
    assert not torch.equal(shared[0], layer.shared_mlp(x))


LAUNCHES = {"tensorwise": 20, "rowwise": 26, "blockwise": 14, "mxfp8": 14}
"""Triton launches of the FP8 shared experts' forward and backward: two FP8 linears' (gate and up as
one), each its quantizes and three GEMMs (forward, dgrad, wgrad) as a Float8Linear of the recipe
makes them, and SwiGLU's two passes."""


@pytest.mark.parametrize("recipe", RECIPES)
def test_fp8_shared_experts_launch_fp8_gemms_and_no_torch_matmul(recipe):
    layer, x = _moe(recipe), torch.randn(9, DIM, requires_grad=True)
    linears, mlp = _linears_of(layer)

    def step(run=layer.shared_mlp, weights=(layer.shared_gate, layer.shared_up, layer.shared_down)):
        return torch.autograd.grad(run(x).sum(), (x, *weights))

    fp8 = device_ops(step)
    assert fp8.triton == device_ops(lambda: step(mlp, tuple(linear.weight for linear in linears))).triton
    layer.fp8_shared_experts = False
    kept = device_ops(step)
    assert kept.torch_ops["mm"] >= 3 and kept.triton == 0
    assert not {"mm", "matmul", "addmm", "bmm"} & set(fp8.torch_ops), fp8
    assert (fp8.triton, dict(fp8.torch_ops)) == (LAUNCHES[recipe], {"cat": 2, "sum": 1, "ones_like": 1}), fp8
    # the weights' concat and the split's backward; the loss's sum and its gradient


def test_under_autocast_the_fp8_shared_experts_quantize_the_master_weights():
    """The layer hands its shared experts the rows in the autocast dtype; they quantize the fp32 weights
    from fp32, as FP8 Linears do under the region (bit for bit theirs), and give fp32 weight gradients."""
    x = torch.randn(7, DIM, generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", torch.bfloat16):
        layer, (shared, linears) = _shared_and_as_linears("rowwise", x.bfloat16().requires_grad_())
    assert shared[0].dtype == torch.bfloat16
    for a, b in zip(shared, linears):
        assert torch.equal(a, b)
    assert all(g.dtype == torch.float32 and g.abs().sum() > 0 for g in shared[2:])


def test_the_layer_hands_them_its_rows_in_the_autocast_dtype():
    """Through the layer's forward under autocast: the shared experts see bf16 rows and give what
    Float8Linear layers of the same weights give for them."""
    layer, x = _moe("rowwise"), torch.randn(7, DIM)
    seen, real = [], layer.shared_mlp
    layer.shared_mlp = lambda rows: seen.append((rows, real(rows))) or seen[-1][1]
    _, mlp = _linears_of(layer)
    with torch.autocast("cpu", torch.bfloat16):
        layer(x)
        (rows, out), = seen
        assert rows.dtype == torch.bfloat16 and torch.equal(out, mlp(rows))


def test_the_layer_with_fp8_shared_experts_compiles_without_graph_breaks():
    layer, x = _moe("rowwise"), torch.randn(11, DIM)
    explained = torch._dynamo.explain(lambda x: layer(x).square().sum())(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_their_compiled_backward_gives_the_eager_gradients():
    """torch.compile(fullgraph=True) of the shared experts forward and backward (the transposed weight
    views, the concat and split, SwiGLU's passes): bit for bit eager's."""
    layer, x = _moe("rowwise"), torch.randn(11, DIM, requires_grad=True)
    params = (x, layer.shared_gate, layer.shared_up, layer.shared_down)

    def loss(x):
        return layer.shared_mlp(x).square().sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")(x)
    eager = loss(x)
    assert torch.equal(compiled, eager)
    for a, b in zip(torch.autograd.grad(compiled, params), torch.autograd.grad(eager, params)):
        assert torch.equal(a, b)


def test_no_rows_give_no_output_and_zero_weight_gradients():
    """As torch's matmuls of empty operands do."""
    layer, x = _moe("rowwise"), torch.empty(0, DIM, requires_grad=True)
    y = layer.shared_mlp(x)
    assert y.shape == (0, DIM)
    grads = torch.autograd.grad(y, (x, layer.shared_gate, layer.shared_up, layer.shared_down), torch.empty(0, DIM))
    assert grads[0].shape == (0, DIM) and all(torch.equal(g, torch.zeros_like(g)) for g in grads[1:])


def test_the_expert_parallel_layer_runs_them_as_the_single_process_layer_does(one_rank):
    """convert gives the expert-parallel FP8 layer FP8 shared experts by the same rule; on one rank,
    where its rows are the single-process layer's, the same output (tests/test_ep_moe_k_sum.py: rowwise
    without FP8 dispatch, bit for bit) and the same shared experts' gradients."""
    torch.manual_seed(0)
    full = kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K, SHARED)
    ep = kernels.MoE.from_full(full, one_rank)
    single = kernels.fp8.convert(full, "rowwise", keep_high_precision=("*router",))
    parallel = kernels.fp8.convert(ep, "rowwise", keep_high_precision=("*router",))
    assert type(parallel) is Float8ExpertParallelMoE and parallel.fp8_shared_experts
    parallel.fp8_dispatch = False
    x = torch.randn(10, DIM)
    results = []
    for layer in (single, parallel):
        y = layer(x)
        results.append((y, *torch.autograd.grad(y.square().sum(), (layer.shared_gate, layer.shared_up,
                                                                     layer.shared_down))))
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_under_fully_shard_they_run_on_the_gathered_weights(one_rank):
    """FSDP2 (here on one rank: its DTensor parameters, gathered for the forward and backward) gives the
    unsharded layer's output and shared weights' gradients."""
    from torch.distributed.fsdp import fully_shard

    plain = _moe("rowwise")
    sharded = fully_shard(copy.deepcopy(plain))
    x = torch.randn(6, DIM)
    outputs = [layer(x) for layer in (plain, sharded)]
    for y in outputs:
        y.square().sum().backward()
    assert torch.equal(*outputs)
    for name in ("shared_gate", "shared_up", "shared_down"):
        assert torch.equal(getattr(sharded, name).grad.full_tensor(), getattr(plain, name).grad)
