"""An FP8 MoE layer's shared experts in FP8 (Float8Experts.fp8_shared_experts): what kernels.fp8.convert
decides, the results against the routed experts' FP8 path and float64, the launches, torch.compile and MFU."""
from __future__ import annotations

import warnings

import pytest
import torch

import kernels
from kernels.moe.fp8_layer import Float8MoE
from kernels.moe.reference import swiglu
from kernels.outputs import poisoned_outputs
from workbench import train
from workbench.harness.device_ops import device_ops
from workbench.train import flops
from workbench.train.model import GPT

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
    with pytest.warns(RuntimeWarning, match="'moe': delayed scaling .* shared experts stay in high precision"):
        model = kernels.fp8.convert(Block(), "delayed", keep_high_precision=())
    assert not model.moe.fp8_shared_experts
    with pytest.raises(ValueError, match="cannot run in FP8 under delayed scaling"):
        model.moe.fp8_shared_experts = True
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # kept by default: nothing to warn about
        kernels.fp8.convert(Block(), "delayed")


def _shared_and_one_expert(recipe: str, x: torch.Tensor):
    """The FP8 shared experts' output and gradients (of x and their three weights), and those of a
    one-expert top-1 Float8MoE whose expert holds the same weights: its routing weight is exactly 1
    and the router's gradient of x exactly 0 (a softmax over one expert), so the routed FP8 path
    computes the same GEMMs on the same rows in the same order."""
    layer = _moe(recipe)
    one = kernels.fp8.convert(kernels.MoE(DIM, SHARED * HIDDEN, 1, 1), recipe, keep_high_precision=())
    with torch.no_grad():
        for mine, theirs in (("shared_gate", "gate"), ("shared_up", "up"), ("shared_down", "down")):
            getattr(one, theirs).copy_(getattr(layer, mine)[None])
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(5))
    results = []
    for run, weights in ((layer.shared_mlp, (layer.shared_gate, layer.shared_up, layer.shared_down)),
                         (one, (one.gate, one.up, one.down))):
        with poisoned_outputs():
            y = run(x)
            results.append((y, *torch.autograd.grad(y, (x, *weights), dy)))
    return layer, results


@pytest.mark.parametrize("recipe", RECIPES)
def test_fp8_shared_experts_are_the_routed_experts_fp8_gemms_on_one_group(recipe):
    """Bit for bit a one-expert Float8MoE's output and gradients, within FP8's error of float64,
    and not the high-precision result."""
    x = torch.randn(13, DIM, generator=torch.Generator().manual_seed(1)).requires_grad_()
    layer, (shared, routed) = _shared_and_one_expert(recipe, x)
    for a, b in zip(shared, routed):
        assert torch.equal(a, b.reshape(a.shape))
    ref = swiglu(x.detach().double(), *(w.detach().double() for w in (layer.shared_gate, layer.shared_up,
                                                                        layer.shared_down)))
    assert (shared[0].double() - ref).norm() <= 0.1 * ref.norm()   # e4m3: 2^-4 per element, two GEMMs deep
    layer.fp8_shared_experts = False
    assert not torch.equal(shared[0], layer.shared_mlp(x))


@pytest.mark.parametrize("recipe", ["rowwise", "mxfp8"])
def test_fp8_shared_experts_launch_fp8_gemms_and_no_torch_matmul(recipe):
    layer, x = _moe(recipe), torch.randn(9, DIM)
    fp8 = device_ops(lambda: layer.shared_mlp(x))
    layer.fp8_shared_experts = False
    kept = device_ops(lambda: layer.shared_mlp(x))
    assert kept.torch_ops["mm"] == 3 and kept.triton == 0
    assert not {"mm", "matmul", "addmm"} & set(fp8.torch_ops) and fp8.triton >= 4   # 3 GEMMs, SwiGLU, casts


def test_under_autocast_the_fp8_shared_experts_take_the_cast_weights_and_give_master_gradients():
    """The layer hands its shared experts the rows in the autocast dtype; they cast the fp32 weights to
    it (as the routed experts' weights are cast) and quantize those, as they would outside the region."""
    layer, x = _moe("rowwise"), torch.randn(7, DIM)
    with torch.autocast("cpu", torch.bfloat16):
        y, shared = layer(x), layer.shared_mlp(x.bfloat16())
    assert shared.dtype == torch.bfloat16 and torch.equal(shared, layer.shared_mlp(x.bfloat16()))
    y.float().square().sum().backward()
    assert all(w.grad is not None and w.grad.dtype == torch.float32 and w.grad.abs().sum() > 0
               for w in (layer.shared_gate, layer.shared_up, layer.shared_down))


def test_the_layer_with_fp8_shared_experts_compiles_without_graph_breaks():
    layer, x = _moe("rowwise"), torch.randn(11, DIM)
    explained = torch._dynamo.explain(lambda x: layer(x).square().sum())(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_mfu_counts_the_shared_experts_at_the_fp8_peak_when_they_run_in_fp8():
    cfg = train.PRESETS["cpu-smoke"]
    torch.manual_seed(0)
    kept = kernels.fp8.convert(GPT(cfg, "workbench"), "rowwise")
    torch.manual_seed(0)
    fp8 = kernels.fp8.convert(GPT(cfg, "workbench"), "rowwise", keep_high_precision=("first", "last", "*router"))
    shared = cfg.shared_experts * 3 * cfg.dim * cfg.expert_hidden
    assert flops.fp8_step_flops(fp8, cfg) - flops.fp8_step_flops(kept, cfg) == 6 * shared * cfg.batch * cfg.seq > 0


def test_no_rows_give_no_output_and_zero_weight_gradients():
    """As torch's matmuls of empty operands do."""
    layer, x = _moe("rowwise"), torch.empty(0, DIM, requires_grad=True)
    y = layer.shared_mlp(x)
    assert y.shape == (0, DIM)
    grads = torch.autograd.grad(y, (x, layer.shared_gate, layer.shared_up, layer.shared_down), torch.empty(0, DIM))
    assert grads[0].shape == (0, DIM) and all(torch.equal(g, torch.zeros_like(g)) for g in grads[1:])

