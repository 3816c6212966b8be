"""``kernels.fp8.convert`` on a model with a ``kernels.MoE``: the experts become a Float8MoE
sharing the parameters, the router stays high precision unless the patterns say otherwise,
the layer's forward and backward run nine FP8 grouped launches (three forward, two per
expert GEMM in the backward), it compiles without graph breaks, and a few training steps stay within a stated
bound of the high-precision run.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import kernels
import kernels.fp8
from kernels.fp8.linear import Float8Linear
from kernels.moe.fp8_layer import Float8MoE
from kernels.moe.grouped_gemm_fp8 import dw as dw_module
from kernels.moe.grouped_gemm_fp8 import v0_one_launch
from workbench import train
from workbench.train import flops
from workbench.train.model import GPT

FP8 = torch.float8_e4m3fn
DIM, HIDDEN, EXPERTS, TOP_K = 16, 32, 4, 2   # one interpreter tile wide


class Block(torch.nn.Module):
    """Linear in, MoE, Linear out: convert's default keeps the first and last Linear and the router."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(12, DIM)
        self.moe = kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K)
        self.out = torch.nn.Linear(DIM, 6)

    def forward(self, x):
        return self.out(self.moe(torch.relu(self.inp(x))))


def _block(seed=0):
    torch.manual_seed(seed)
    return Block()


def test_convert_swaps_the_experts_shares_parameters_and_keeps_the_router():
    model = _block()
    params = dict(model.named_parameters())
    kernels.fp8.convert(model, "rowwise", fp8_dtype=FP8)
    assert type(model.moe) is Float8MoE and (model.moe.recipe, model.moe.fp8_dtype) == ("rowwise", FP8)
    assert type(model.moe.router) is torch.nn.Linear            # "*router" and first/last kept
    assert type(model.inp) is torch.nn.Linear and type(model.out) is torch.nn.Linear
    assert all(p is params[name] for name, p in model.named_parameters())
    assert list(model.state_dict()) == list(_block().state_dict())
    assert kernels.fp8.converted(model) == {"moe": "rowwise"}

    kept = kernels.fp8.convert(_block(), keep_high_precision=("*moe", "*router"))
    assert type(kept.moe) is kernels.MoE and type(kept.moe.router) is torch.nn.Linear
    with pytest.warns(RuntimeWarning, match="experts' gradients are e4m3, not 'hybrid'"):   # tensorwise's default
        everything = kernels.fp8.convert(_block(), "tensorwise", keep_high_precision=(), fp8_dtype=FP8)
    assert type(everything.moe) is Float8MoE and type(everything.moe.router) is Float8Linear
    x = torch.randn(9, DIM)
    logits = everything.moe.router_logits(x)   # through the FP8 router, in float32
    assert logits.dtype == torch.float32 and not torch.equal(logits, F.linear(x, everything.moe.router.weight))
    bare = kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K)
    assert type(kernels.fp8.convert(bare)) is Float8MoE


def test_fp8_flops_count_the_routed_experts_of_the_training_model():
    """``workbench train --fp8 --kernels workbench``: the MoE layer of the CPU preset becomes a
    Float8MoE, and MFU takes its routed experts' three GEMMs (gate, up, down) at the FP8 peak."""
    cfg = train.PRESETS["cpu-smoke"]
    model = kernels.fp8.convert(GPT(cfg, "workbench"), "rowwise")
    moe = model.blocks[1].ffn
    assert type(moe) is Float8MoE and type(moe.router) is torch.nn.Linear
    linears = sum(m.weight.numel() for m in model.modules() if isinstance(m, Float8Linear))
    experts = cfg.top_k * 3 * cfg.dim * cfg.expert_hidden
    assert flops.fp8_step_flops(model, cfg) == 6 * (linears + experts) * cfg.batch * cfg.seq


def test_a_recipe_without_grouped_gemm_warns_and_leaves_the_experts():
    with pytest.warns(RuntimeWarning, match="'delayed' has no grouped GEMM"):
        model = kernels.fp8.convert(_block(), "delayed", keep_high_precision=("*router",))
    assert type(model.moe) is kernels.MoE and type(model.inp) is not torch.nn.Linear
    with pytest.raises(TypeError, match="takes a kernels.MoE"):
        Float8MoE.from_moe(torch.nn.Linear(2, 2))


def test_forward_and_backward_are_nine_fp8_grouped_launches_close_to_high_precision(monkeypatch):
    """One launch per expert GEMM forward (gate, up, down), two per expert GEMM backward."""
    layer = kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K)
    fp8_layer = Float8MoE.from_moe(copy.deepcopy(layer), "rowwise", FP8)
    launches = []
    forward, dw = v0_one_launch.grouped_mm_fp8, dw_module.grouped_dw_fp8
    monkeypatch.setattr(v0_one_launch, "grouped_mm_fp8", lambda *a: launches.append("mm") or forward(*a))
    monkeypatch.setattr(dw_module, "grouped_dw_fp8", lambda *a: launches.append("dw") or dw(*a))
    x = torch.randn(2, 7, DIM)
    outs = []
    for module in (layer, fp8_layer):
        xi = x.clone().requires_grad_()
        out = module(xi)
        out.square().sum().backward()
        outs.append((out, xi.grad, module.down.grad))
    assert launches == ["mm"] * 3 + ["mm", "dw"] * 3
    assert torch.equal(layer.expert_counts, fp8_layer.expert_counts)    # same routing
    for hp, fp8 in zip(*outs):     # e4m3: 2^-4 per element, averaged over the sums
        assert (fp8 - hp).norm() <= 0.1 * hp.norm()


def test_the_fp8_layer_compiles_without_graph_breaks():
    layer = Float8MoE.from_moe(kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K), "rowwise", FP8)
    x = torch.randn(11, DIM)

    def loss(x):
        return layer(x).square().sum()

    explained = torch._dynamo.explain(loss)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    # the backward under torch.compile: tests/test_grouped_gemm_fp8_backward.py (the op;
    # compiling this whole layer's backward takes ~18 s here)


STEPS, BOUND = 6, 0.01


@pytest.mark.slow   # twelve training steps in the interpreter: about 20 s on 2 busy cores
def test_training_under_convert_stays_within_one_percent_of_high_precision():
    """Six Adam steps of the same model from one seed on the same batch; the FP8 run's loss
    (MoE experts in FP8 by the rowwise recipe, the rest kept by the default patterns) stays
    within 1% (relative) of the float32 run's at every step, the goal issue 22 sets for
    rowwise."""
    high = _block(seed=1)
    fp8 = kernels.fp8.convert(copy.deepcopy(high), "rowwise", fp8_dtype=FP8)
    gen = torch.Generator().manual_seed(2)
    x, target = torch.randn(16, 12, generator=gen), torch.randn(16, 6, generator=gen)
    runs = []
    for model in (high, fp8):
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        losses = []
        for _ in range(STEPS):
            opt.zero_grad()
            loss = F.mse_loss(model(x), target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        runs.append(torch.tensor(losses))
    assert runs[0][-1] < runs[0][0]                   # it trains
    assert ((runs[1] - runs[0]).abs() / runs[0]).max() <= BOUND, runs


def test_a_moe_layer_without_an_fp8_path_warns_and_is_left_as_it_is():
    """Any MoE layer but a plain ``kernels.MoE`` (a subclass, the expert-parallel layer, which
    shares only ``kernels.moe.layer_base.MoELayer`` with it) keeps its experts, with a warning."""
    class Custom(kernels.MoE):
        pass

    model = torch.nn.Sequential(Custom(DIM, HIDDEN, EXPERTS, TOP_K))
    with pytest.warns(RuntimeWarning, match="Custom has no FP8 path"):
        kernels.fp8.convert(model, "rowwise", keep_high_precision=(), fp8_dtype=FP8)
    assert type(model[0]) is Custom


def test_a_model_ending_in_an_moe_layer_keeps_its_last_linear_outside_it():
    """"last" is the last Linear outside the MoE layers: a model ending in an MoE layer keeps
    its own last Linear in high precision, not just the router."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, DIM), torch.nn.Linear(DIM, DIM), torch.nn.ReLU(),
                                kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K))
    kernels.fp8.convert(model, "rowwise", fp8_dtype=FP8)
    assert kernels.fp8.converted(model) == {"3": "rowwise"}          # experts only: 0 first, 1 last
    assert type(model[1]) is torch.nn.Linear and type(model[3].router) is torch.nn.Linear
