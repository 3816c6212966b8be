"""``kernels.fp8.convert`` on a model with a ``kernels.MoE``: the experts become a Float8MoE
sharing the parameters, the router stays high precision unless the patterns say otherwise,
the experts' gradients take the recipe's format (e5m2 under hybrid), the layer's forward and
backward run nine FP8 grouped launches (three forward, two per expert GEMM in the backward),
its per-tensor recipes quantize on the fused kernels only (eighteen launches a step), it compiles without graph breaks, delayed scaling keeps an amax history per expert operand,
a few training steps stay within a stated bound of the high-precision run per recipe, and
FSDP2 on two gloo ranks trains it as one process does.
"""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

import kernels
import kernels.fp8
from kernels.fp8.linear import Float8Linear
from kernels.fp8.recipes.delayed import HISTORY
from kernels.moe import fp8_experts
from kernels.moe.fp8_experts import FP8_TENSORS
from kernels.moe.fp8_layer import Float8MoE
from kernels.moe.grouped_gemm_fp8 import dw as dw_module
from kernels.moe.grouped_gemm_fp8 import quantize, v0_one_launch
from fp8_quantizations import TorchCalls, amax_passes, quantizations
from workbench import train
from workbench.harness.device_ops import device_ops
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
    assert model.moe.grad_fp8_dtype == FP8                        # rowwise's gradients: e4m3
    assert type(model.moe.router) is torch.nn.Linear            # "*router" and first/last kept
    assert type(model.inp) is torch.nn.Linear and type(model.out) is torch.nn.Linear
    assert all(p is params[name] for name, p in model.named_parameters())
    assert list(model.state_dict()) == list(_block().state_dict())
    assert kernels.fp8.converted(model) == {"moe": "rowwise"}

    kept = kernels.fp8.convert(_block(), keep_high_precision=("*moe", "*router"))
    assert type(kept.moe) is kernels.MoE and type(kept.moe.router) is torch.nn.Linear
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # the experts take tensorwise's hybrid gradients: no warning
        everything = kernels.fp8.convert(_block(), "tensorwise", keep_high_precision=(), fp8_dtype=FP8)
    assert type(everything.moe) is Float8MoE and type(everything.moe.router) is Float8Linear
    assert everything.moe.grad_fp8_dtype == torch.float8_e5m2 and "grad=e5m2" in repr(everything.moe)
    fnuz = kernels.fp8.convert(_block(), "delayed", fp8_dtype=torch.float8_e4m3fnuz, grad_format="e4m3")
    assert (fnuz.moe.fp8_dtype, fnuz.moe.grad_fp8_dtype) == (torch.float8_e4m3fnuz,) * 2
    x = torch.randn(9, DIM)
    logits = everything.moe.router_logits(x)   # through the FP8 router, in float32
    assert logits.dtype == torch.float32 and not torch.equal(logits, F.linear(x, everything.moe.router.weight))
    bare = kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K)
    assert type(kernels.fp8.convert(bare)) is Float8MoE
    mx = kernels.fp8.convert(_block(), "mxfp8")
    assert (mx.moe.recipe, mx.moe.fp8_dtype) == ("mxfp8", FP8) and kernels.fp8.converted(mx) == {"moe": "mxfp8"}


def test_each_recipe_takes_its_own_element_format_on_gfx942(fake_gpu):
    """On gfx942 the native e4m3 is fnuz, which MX does not define: every layer converted
    under mxfp8 (Linears and MoE experts) is OCP e4m3fn, under the others fnuz, and an
    mxfp8 conversion asked for fnuz is refused before anything is swapped."""
    fake_gpu("hip", "gfx942", "AMD Instinct MI300X")
    formats = {recipe: {m.fp8_dtype for m in kernels.fp8.convert(_block(), recipe, keep_high_precision=())
                        .modules() if isinstance(m, (Float8Linear, Float8MoE))}
               for recipe in ("rowwise", "mxfp8")}
    assert formats == {"rowwise": {torch.float8_e4m3fnuz}, "mxfp8": {torch.float8_e4m3fn}}
    block = _block()
    with pytest.raises(TypeError, match="mxfp8 recipe's elements are float8_e4m3fn"):
        kernels.fp8.convert(block, "mxfp8", fp8_dtype=torch.float8_e4m3fnuz)
    assert kernels.fp8.converted(block) == {}


def test_fp8_flops_count_the_routed_experts_of_the_training_model():
    """``workbench train --fp8 --kernels workbench``: the MoE layer of the CPU preset becomes a
    Float8MoE, and MFU takes its routed experts' three GEMMs (gate, up, down) at the FP8 peak, and
    its shared experts' where they run in FP8 too."""
    cfg = train.PRESETS["cpu-smoke"]
    model = kernels.fp8.convert(GPT(cfg, "workbench"), "rowwise")
    moe = model.blocks[1].ffn
    assert type(moe) is Float8MoE and type(moe.router) is torch.nn.Linear
    linears = sum(m.weight.numel() for m in model.modules() if isinstance(m, Float8Linear))
    experts = cfg.top_k * 3 * cfg.dim * cfg.expert_hidden
    assert flops.fp8_step_flops(model, cfg) == 6 * (linears + experts) * cfg.batch * cfg.seq
    # with its shared experts in FP8 too (kernels.moe.fp8_experts.Float8Experts.fp8_shared_experts)
    shared = kernels.fp8.convert(GPT(cfg, "workbench"), "rowwise", keep_high_precision=("first", "last", "*router"))
    experts += cfg.shared_experts * 3 * cfg.dim * cfg.expert_hidden
    assert shared.blocks[1].ffn.fp8_shared_experts and cfg.shared_experts
    assert flops.fp8_step_flops(shared, cfg) == 6 * (linears + experts) * cfg.batch * cfg.seq


def test_a_recipe_without_grouped_gemm_warns_and_leaves_the_experts(monkeypatch):
    monkeypatch.setattr(quantize, "RECIPES", ("rowwise",))   # as if tensorwise had no grouped GEMM
    with pytest.warns(RuntimeWarning, match="'tensorwise' has no grouped GEMM"):
        model = kernels.fp8.convert(_block(), "tensorwise", keep_high_precision=("*router",))
    assert type(model.moe) is kernels.MoE and type(model.inp) is not torch.nn.Linear
    with pytest.raises(TypeError, match="takes a kernels.MoE"):
        Float8MoE.from_moe(torch.nn.Linear(2, 2))
    monkeypatch.undo()
    with pytest.raises(TypeError, match="mxfp8 recipe.s elements are float8_e4m3fn"):
        Float8MoE.from_moe(kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K), "mxfp8", torch.float8_e4m3fnuz)


# per recipe: (dense fused op, grouped kernels) quantizations of one training step, and the first three
# grouped ones' inputs (B, T, C): x's (both its operands) or the weights' (each expert a batch entry)
X, GATE, UP = (1, 2 * 7 * TOP_K, DIM), (EXPERTS, DIM, HIDDEN), (EXPERTS, DIM, HIDDEN)
QUANTIZATIONS = {recipe: (0, 8, [X, GATE, UP]) for recipe in ("delayed", "tensorwise", "rowwise")}


@pytest.mark.parametrize("recipe", QUANTIZATIONS)
def test_a_training_step_quantizes_on_the_fused_kernels_only(recipe):
    """Per expert GEMM (gate, up, down), no plain torch pass (delayed's given scales included): every
    token operand (x, hidden, each dy) and every weight both ways in one grouped quantization
    (quantize.token_operands, quantize.weight_operands: rowwise's rows mode, the per-tensor recipes'
    one cast writing both layouts), x once between gate and up, made before their GEMMs (delayed's x
    amax recorded from it), nothing on the dense op: 8 quantizations (x, hidden, 3 weights, 3 dy)."""
    layer = Float8MoE.from_moe(kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K), recipe, FP8)
    x = torch.randn(2, 7, DIM, requires_grad=True)
    with quantizations() as seen:
        layer(x).square().sum().backward()
    kinds = [kind for kind, _, _ in seen]
    fused, grouped, first = QUANTIZATIONS[recipe]
    assert (kinds.count("fused"), kinds.count("grouped"), len(kinds)) == (fused, grouped, fused + grouped)
    assert [shape for kind, shape, _ in seen if kind == "grouped"][:3] == first


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


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_gate_and_up_quantize_x_once_bit_for_bit(recipe, monkeypatch):
    """In a training step gate's and up's GEMMs take x's operands made once before them
    (Float8Experts._shared_operands: one quantization, both ways, its wgrad operand saved once):
    output and every gradient bit for bit what the GEMMs give quantizing x each on their own, in
    fewer launches (tensorwise: x's amax pass (two launches) and its one cast writing both layouts,
    where each GEMM's op made its own so: 3 fewer; rowwise: its one fused quantization (4 launches),
    where each GEMM's took 4: 4 fewer). Without gradients (no
    wgrad operand to share) tensorwise finds x's scale once for both casts instead
    (Float8Experts._cast_scale: one amax pass, not two), bit for bit the casts that find their own."""
    layer = Float8MoE.from_moe(kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K), recipe, FP8)
    x = torch.randn(2, 7, DIM)
    grouped, given = Float8MoE._grouped, []

    def spied(self, a, scale_a, w, scale_w, *args, a_operands=None, **kwargs):
        given.append(a_operands)
        return grouped(self, a, scale_a, w, scale_w, *args, a_operands=a_operands, **kwargs)

    def step():
        xi = x.clone().requires_grad_()
        out = layer(xi)
        out.square().sum().backward()
        results = [out.detach(), xi.grad, *(p.grad for p in layer.parameters())]
        layer.zero_grad(set_to_none=True)
        return results

    monkeypatch.setattr(Float8MoE, "_grouped", spied)
    once, ops_once = step(), device_ops(step)
    assert given[0] is given[1] and given[0] is not None and given[2] is None   # gate's and up's; down's
    monkeypatch.setattr(fp8_experts.Float8Experts, "_shared_operands", lambda *a: None)
    monkeypatch.setattr(fp8_experts.Float8Experts, "_cast_scale", lambda *a: None)   # each cast finds its own
    own, ops_own = step(), device_ops(step)
    assert all(torch.equal(a, b) for a, b in zip(once, own, strict=True))
    assert ops_own.triton - ops_once.triton == {"tensorwise": 3, "rowwise": 4}[recipe]
    assert ops_once.torch_ops == ops_own.torch_ops
    if recipe == "tensorwise":
        monkeypatch.undo()
        with torch.no_grad():
            found_once, ops_found = layer(x), device_ops(lambda: layer(x))
            monkeypatch.setattr(fp8_experts.Float8Experts, "_cast_scale", lambda *a: None)
            assert torch.equal(found_once, layer(x))
            assert device_ops(lambda: layer(x)).triton == ops_found.triton   # 2 launches for x's scale either way


def test_delayed_gate_and_up_quantize_x_once_with_the_histories_bit_for_bit():
    """Under delayed the one cast of x for gate and up (its history's scale) returns x's amax, which
    enters x's history: after a training step from the same state, output, every gradient and every
    history and saturation count bit for bit the unshared path's (gate's GEMM casting x and returning
    its amax, up's casting it again), one launch fewer (x's one cast writing both its operands once, not
    once per GEMM)."""
    torch.manual_seed(0)
    shared = Float8MoE.from_moe(kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K), "delayed", FP8)
    apart = copy.deepcopy(shared)
    apart._shared_operands = lambda *a: None   # each GEMM casts x on its own
    x = torch.randn(2, 7, DIM)

    def step(layer):
        xi = x.clone().requires_grad_()
        out = layer(xi)
        out.square().sum().backward()
        return [out.detach(), xi.grad, *(p.grad for p in layer.parameters()), *layer.buffers()]

    for _ in range(2):   # the first from empty histories, the second from the first's
        assert all(torch.equal(a, b) for a, b in zip(step(shared), step(apart), strict=True))
    assert device_ops(lambda: step(apart)).triton - device_ops(lambda: step(shared)).triton == 1


@pytest.mark.parametrize("recipe", ["rowwise", "delayed"])   # delayed: its histories are updated in the graph
def test_the_fp8_layer_compiles_without_graph_breaks(recipe):
    layer = Float8MoE.from_moe(kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K), recipe, FP8, torch.float8_e5m2)
    x = torch.randn(11, DIM)

    def loss(x):
        return layer(x).square().sum()

    explained = torch._dynamo.explain(loss)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    # the backward under torch.compile: tests/test_grouped_gemm_fp8_backward.py (the op;
    # compiling this whole layer's backward takes ~18 s here)


STEPS = 6
BOUNDS = {"tensorwise": 0.02, "delayed": 0.02, "rowwise": 0.01, "blockwise": 0.01, "mxfp8": 0.005}
"""Largest relative loss difference to the float32 run over the steps. Issue 22 sets 1% for
rowwise, blockwise and mxfp8 and reports tensorwise and delayed as they come; measured here
(torch 2.x, CPU interpreter): tensorwise 0.88%, delayed 0.70%, rowwise 0.62% (0.50% at the
last step), blockwise 0.50%, mxfp8 0.11% (at most 0.113% over the six steps). mxfp8's bound is
half the goal, about four times what it measures: its scales round up (the recipe's
``scale_rule``, :mod:`kernels.fp8.recipes.mxfp8`), so no element saturates. Under the OCP
floor rule, which puts a block's amax in [256, 512) past e4m3's 448, it measured 1.11% and
missed the goal."""


def _losses(model, steps=STEPS) -> list[float]:
    """Adam steps of ``model`` on one fixed batch (the same on every rank)."""
    gen = torch.Generator().manual_seed(2)
    x, target = torch.randn(16, 12, generator=gen), torch.randn(16, 6, generator=gen)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.fixture(scope="module")
def high_precision_losses():
    losses = torch.tensor(_losses(_block(seed=1)))
    assert losses[-1] < losses[0]                   # it trains
    return losses


@pytest.mark.slow   # six interpreted training steps per recipe: 10-20 s each on 2 busy cores
@pytest.mark.parametrize("recipe", BOUNDS)
def test_training_under_convert_stays_within_the_bound_of_high_precision(recipe, high_precision_losses):
    """Six Adam steps of the same model from one seed on the same batch; the FP8 run's loss
    (MoE experts in FP8 by ``recipe`` with its gradient format: e5m2 for tensorwise and
    delayed, the rest kept by the default patterns) stays within the bound (relative) of the
    float32 run's at every step."""
    fp8 = kernels.fp8.convert(_block(seed=1), recipe, fp8_dtype=FP8)
    assert kernels.fp8.converted(fp8) == {"moe": recipe}
    diff = ((torch.tensor(_losses(fp8)) - high_precision_losses).abs() / high_precision_losses).max()
    assert 0 < diff <= BOUNDS[recipe], (recipe, diff)


def test_delayed_experts_keep_an_amax_history_per_operand(monkeypatch):
    """Five histories of the forward's operands (routed rows, SwiGLU's output, gate, up, down)
    and three of the output gradients (tests/test_fp8_moe_delayed_dy.py) as buffers that the
    amax sync reduces; the scales each GEMM gets come from them (the current amax while
    they are empty), one entry per training step (x once, though gate and up both read it),
    none in eval mode; a weight that outgrows its history saturates (and the activation it
    makes), is counted and warned about by name."""
    layer = Float8MoE.from_moe(kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K), "delayed", FP8, torch.float8_e5m2)
    histories = [getattr(layer, f"fp8_amax_history_{name}") for name in FP8_TENSORS]
    gradients = [getattr(layer, f"fp8_amax_history_{name}") for name in fp8_experts.GRAD_TENSORS]
    assert set(layer.state_dict()) >= {f"fp8_amax_history_{name}" for name in FP8_TENSORS} | {"fp8_saturated"}
    reduced = kernels.fp8.get("delayed").reduced_buffers(layer)
    assert len(reduced) == 8 and all(a is b for a, b in zip(reduced, histories + gradients, strict=True))
    calls, train = [], fp8_experts.grouped_gemm_fp8_train
    monkeypatch.setattr(fp8_experts, "grouped_gemm_fp8_train", lambda *a, **k: calls.append(a[5:8]) or train(*a, **k))
    fmax, x = torch.finfo(FP8).max, torch.randn(9, DIM)
    layer(x)
    hist = dict(zip(FP8_TENSORS, histories))
    assert hist["x"][0] == x.abs().amax() and hist["gate"][0] == layer.gate.abs().amax()
    assert all(h[0] > 0 and not h[1:].any() for h in histories)       # one entry each
    (g_gate, sx_gate, sw_gate), (_, sx_up, sw_up), (_, s_hidden, sw_down) = calls
    assert g_gate == torch.float8_e5m2
    assert sx_gate is sx_up and sx_gate == hist["x"][0] / fmax and sw_up == hist["up"][0] / fmax
    assert s_hidden == hist["hidden"][0] / fmax and sw_down == hist["down"][0] / fmax
    with torch.no_grad():
        layer.gate.mul_(4)                                              # outgrows its history
    calls.clear()
    layer(x)
    assert calls[0][2] == hist["gate"][1] / fmax                        # last step's amax
    assert layer.fp8_saturated.tolist() == [0, 1, 1, 0, 0, 0, 0, 0]         # gate, and SwiGLU's output with it
    with pytest.warns(RuntimeWarning, match=r"hidden in 1 step\(s\), gate in 1 step"):
        kernels.fp8.warn_saturation(layer)
    before = [h.clone() for h in histories]
    layer.eval()
    layer(x)
    assert all(torch.equal(a, b) for a, b in zip(before, histories))


def test_delayed_experts_record_the_amaxes_their_casts_find():
    """No torch pass reads x, SwiGLU's output or a weight for its amax: each history records
    the amax the forward's fused casts found, bitwise the torch pass's (every input dtype);
    the amax pass for an empty history reads them (and the backward's output gradients) in the
    first step only (its ``unless``, the history, all 0 then)."""
    from kernels.gemm_fp8 import quantize_kernel
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        layer = Float8MoE.from_moe(kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K).to(dtype), "delayed", FP8)
        unless, tensor_partials = [], quantize_kernel.tensor_partials

        def counted(t, history=None):
            if history is not None:
                unless.append(float(history.max()))
            return tensor_partials(t, history)
        quantize_kernel.tensor_partials = counted
        try:
            for step in range(2):
                x = torch.randn(2, 5, DIM, dtype=dtype) * 3.0 ** step
                with TorchCalls() as seen:
                    layer(x).float().square().sum().backward()
                weights = {name: getattr(layer, name).detach() for name in ("gate", "up", "down")}
                for name, w in weights.items():
                    got = getattr(layer, f"fp8_amax_history_{name}")[0]
                    assert got.view(torch.int32) == w.abs().amax().float().view(torch.int32), name
                shapes = {tuple(w.shape) for w in weights.values()} | {(10 * TOP_K, DIM), (10 * TOP_K, HIDDEN)}
                assert amax_passes(seen.calls, shapes) == []
        finally:
            quantize_kernel.tensor_partials = tensor_partials
        assert len(unless) == 16 and unless[:8] == [0.0] * 8 and min(unless[8:]) > 0, unless   # 5 + 3 a step


def _fsdp2_on_two_ranks(rank, world):
    """Two steps of the converted block (delayed: hybrid gradients, amax histories synced by
    convert's hook) with its MoE layer and the whole model under ``fully_shard``, every
    rank on the same batch: the losses and the full parameters after the steps, and two
    expert histories (a weight's, an output gradient's) after a sync from rank-dependent values."""
    from torch.distributed.fsdp import fully_shard

    model = kernels.fp8.convert(_block(seed=1), "delayed", fp8_dtype=FP8)
    fully_shard(model.moe)
    fully_shard(model)
    losses = _losses(model, FSDP_STEPS)
    histories = (model.moe.fp8_amax_history_down, model.moe.fp8_amax_history_dy_up)
    with torch.no_grad():
        for h in histories:
            h.fill_(rank + 1.0)                             # ranks that disagree ...
    kernels.fp8.sync_amax(model)                            # ... agree on the max after the sync
    synced = torch.cat(histories).unique().tolist()
    return losses, {name: p.full_tensor() for name, p in model.named_parameters()}, synced


FSDP_STEPS = 2


@pytest.mark.slow   # two spawned processes importing torch, two interpreted steps each: ~30 s on 2 busy cores
def test_fsdp2_on_two_gloo_ranks_trains_the_fp8_experts_as_one_process_does():
    """FSDP2 shards the experts' (G, K, N) weights over the ranks, gathers them for the FP8
    grouped GEMMs and reduce-scatters their gradients; with the same batch on both ranks
    the losses and weights match the unsharded run to float32 rounding. The experts' amax
    histories, the output gradients' included, are all-reduced with the rest (:func:`kernels.fp8.sync_amax`)."""
    from kernels.comm.launch import run_local

    single = kernels.fp8.convert(_block(seed=1), "delayed", fp8_dtype=FP8)
    expected = _losses(single, FSDP_STEPS)
    results = run_local(_fsdp2_on_two_ranks, 2, timeout=240)
    for losses, params, synced in results:
        assert synced == [2.0]                             # the amax sync covers the experts' histories
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=1e-5, atol=1e-7)
        for name, p in single.named_parameters():
            torch.testing.assert_close(params[name], p.detach(), rtol=1e-5, atol=1e-6)


def test_a_moe_layer_without_an_fp8_path_warns_and_is_left_as_it_is():
    """A subclass of ``kernels.MoE`` (or of the expert-parallel layer) keeps its experts, with a
    warning: its own forward may not be what the FP8 layer would run."""
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
