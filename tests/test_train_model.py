"""workbench.train's model pieces against small hand computations."""
from __future__ import annotations

import dataclasses
import math
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

import kernels
from fp8_quantizations import AtenCalls
from kernels.moe.reference import swiglu
from workbench.train import PRESETS, ffn, flops, layers, ops
from workbench.train.data import batch
from workbench.train.model import GPT
from workbench.harness.device_ops import device_ops

SMOKE = PRESETS["cpu-smoke"]


def test_rmsnorm_matches_the_formula():
    norm = layers.RMSNorm(3, eps=1e-6)
    norm.weight.data = torch.tensor([1.0, 2.0, 0.5])
    x = torch.tensor([[3.0, -4.0, 12.0]])   # mean square 169/3
    expected = x / math.sqrt(169 / 3 + 1e-6) * norm.weight
    torch.testing.assert_close(norm(x), expected)


def _norm_pair():
    """The workbench and torch RMSNorm with one random weight, and an x (2, 5, 40) that needs a gradient."""
    torch.manual_seed(0)
    ours, theirs = layers.RMSNorm(40, 1e-6, "workbench"), layers.RMSNorm(40, 1e-6)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(40) * 0.5 + 1)
        theirs.weight.copy_(ours.weight)
    return ours, theirs, (torch.randn(2, 5, 40) * 3).requires_grad_()


def test_the_workbench_norm_writes_the_autocast_dtype_and_the_torch_norm_keeps_xs():
    """Under bf16 autocast the workbench norm's y is bf16, the dtype its matmuls read (within a bf16
    unit of the torch norm's fp32 y, which they cast), its gradient read in bf16 and x's
    fp32; outside autocast both keep x's dtype. The torch side, the eager baseline, is as it was."""
    ours, theirs, x = _norm_pair()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, want = ours(x), theirs(x)
    assert (y.dtype, want.dtype) == (torch.bfloat16, torch.float32)
    ulp = torch.finfo(torch.bfloat16).eps * want.detach().abs()
    assert ((y.double() - want.detach().double()).abs() <= ulp).all()
    dy = torch.randn_like(y)
    dx, dw = torch.autograd.grad(y, (x, ours.weight), dy)
    want_dx, want_dw = torch.autograd.grad(want, (x, theirs.weight), dy.float())
    assert (dx.dtype, dw.dtype) == (torch.float32, torch.float32)
    torch.testing.assert_close(dx, want_dx, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dw, want_dw, rtol=1e-4, atol=1e-5)
    assert ours(x).dtype == theirs(x).dtype == torch.float32


def test_the_norms_add_gives_the_residual_sum_and_its_norm_on_both_sides():
    """``RMSNorm.add(x, branch)``: the torch side ``x + branch`` and its norm, bit for bit; the
    workbench side (``kernels.add_rms_norm``, one launch) the same sum bit for bit, y in the bf16
    autocast dtype within a bf16 unit of the torch side's fp32 y, and the gradients of x, the bf16
    branch and the weight within fp32's bounds, h used downstream; ``branch`` None: x and its norm."""
    ours, theirs, x = _norm_pair()
    branch = torch.randn(2, 5, 40, dtype=torch.bfloat16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (h, y), (want_h, want) = ours.add(x, branch), theirs.add(x, branch)
        counted = device_ops(lambda: ours.add(x, branch))
    assert counted.total == counted.triton == 1
    assert torch.equal(h, want_h) and (y.dtype, want.dtype) == (torch.bfloat16, torch.float32)
    assert ((y.double() - want.detach().double()).abs() <= torch.finfo(torch.bfloat16).eps * want.detach().abs()).all()
    dh, dy = torch.randn_like(h), torch.randn_like(y)
    got = torch.autograd.grad((h, y), (x, branch, ours.weight), (dh, dy))
    expected = torch.autograd.grad((want_h, want), (x, branch, theirs.weight), (dh, dy.float()))
    assert [g.dtype for g in got] == [torch.float32, torch.bfloat16, torch.float32]
    for a, b in zip(got, expected):   # the bf16 branch's: two fp32 sums a few units apart, each rounded
        unit = torch.finfo(a.dtype).eps if a.dtype == torch.bfloat16 else 1e-4   # to bf16: one bf16 unit
        torch.testing.assert_close(a, b, rtol=unit, atol=1e-5)
    for norm in (ours, theirs):
        same, normed = norm.add(x, None)
        assert same is x and torch.equal(normed, norm(x))


@pytest.mark.parametrize("kernels_", ["torch", "workbench"])
def test_blocks_hand_their_branch_on_and_sum_as_before(kernels_):
    """A block returns its FFN's output for the next norm to add (the last for the final norm):
    the logits are those of ``x = x + attn(norm(x)); x = x + ffn(norm(x))`` per block and
    ``head(norm(x))``, bit for bit on both sides (the workbench side's adds are the same fp32
    adds, done in the norm's launch, whose norm is ``kernels.rms_norm``'s)."""
    torch.manual_seed(0)
    model = GPT(SMOKE, kernels=kernels_)
    tokens = torch.randint(0, SMOKE.vocab, (1, 16))
    cos, sin = model.rope(16)
    with torch.no_grad():
        x = model.embed(tokens)
        for block in model.blocks:
            x = x + block.attn(block.attn_norm(x), cos, sin)
            x = x + block.ffn(block.ffn_norm(x))
        want, got = model.head(model.norm(x)), model(tokens)
    assert torch.equal(got, want)


def test_rope_rotates_each_pair_by_position_times_frequency():
    cos, sin = layers.rope_tables(seq=3, head_dim=4, theta=100.0)
    x = torch.tensor([1.0, 0.0, 0.0, 1.0]).expand(1, 1, 3, 4)
    out = layers.apply_rope(x, cos, sin)
    for p in range(3):
        a0, a1 = p * 1.0, p * 100.0 ** -0.5   # frequencies theta^(-0/4), theta^(-2/4)
        expected = torch.tensor([math.cos(a0), math.sin(a0), -math.sin(a1), math.cos(a1)])
        torch.testing.assert_close(out[0, 0, p], expected)


def test_rope_keeps_norms_and_makes_scores_depend_on_offset_only():
    cos, sin = layers.rope_tables(seq=8, head_dim=8, theta=10000.0)
    q, k = torch.randn(8), torch.randn(8)
    rq = layers.apply_rope(q.expand(1, 1, 8, 8), cos, sin)[0, 0]
    rk = layers.apply_rope(k.expand(1, 1, 8, 8), cos, sin)[0, 0]
    torch.testing.assert_close(rq.norm(dim=-1), q.norm().expand(8))
    torch.testing.assert_close(rq[5] @ rk[3], rq[4] @ rk[2])


def test_the_model_makes_its_rope_tables_once_and_keeps_them_out_of_checkpoints():
    """GPT.rope slices the tables made at construction (no device op per forward), with the
    values rope_tables gives at that length; a longer sequence gets tables made for it; the
    tables are no state, so checkpoints hold what they held before."""
    model = GPT(SMOKE)
    for seq in (1, 7, SMOKE.seq):
        cos, sin = model.rope(seq)
        want = layers.rope_tables(seq, SMOKE.head_dim, SMOKE.rope_theta)
        assert cos.data_ptr() == model.rope_cos.data_ptr() and cos.is_contiguous()
        assert torch.equal(cos, want[0]) and torch.equal(sin, want[1])
    longer = model.rope(SMOKE.seq + 3)
    want = layers.rope_tables(SMOKE.seq + 3, SMOKE.head_dim, SMOKE.rope_theta)
    assert torch.equal(longer[0], want[0]) and torch.equal(longer[1], want[1])
    assert not any("rope" in name for name in model.state_dict())
    assert device_ops(lambda: model.rope(SMOKE.seq)).total == 0
    made = device_ops(lambda: layers.rope_tables(SMOKE.seq, SMOKE.head_dim, SMOKE.rope_theta))
    assert made.total == 8   # what a forward spent on them, per model.py's comment


def _projections(kind: str, impl: str) -> tuple[torch.nn.Module, tuple[str, ...]]:
    """A layer whose projections of one x run side by side, and their names."""
    if kind == "qkv":
        return layers.Attention(SMOKE, ops.resolve(impl)), ("q", "k", "v")
    return layers.SwiGLU(SMOKE.dim, SMOKE.ffn_hidden, impl), ("gate", "up")


@pytest.mark.parametrize("kind", ["qkv", "gate_up"])
@pytest.mark.parametrize("impl", ["torch", "workbench"])
def test_projections_of_one_x_are_one_gemm_with_each_projections_results(impl, kind):
    """ops.side_by_side (Attention's q, k and v; SwiGLU's gate and up): one GEMM (and one copy
    of the weights) forward, each projection's result and weight gradient; x's gradient is that
    GEMM's, not the sum of several."""
    torch.manual_seed(0)
    layer, names = _projections(kind, impl)
    modules = tuple(getattr(layer, name) for name in names)
    weights = tuple(m.weight for m in modules)
    x = torch.randn(2, 5, SMOKE.dim, requires_grad=True)
    fused = ops.side_by_side(modules, x)
    apart = tuple(m(x) for m in modules)
    grads = [torch.randn_like(t) for t in apart]
    got = torch.autograd.grad(fused, (x, *weights), grads)
    want = torch.autograd.grad(apart, (x, *weights), grads)
    for a, b in zip((*fused, *got), (*apart, *want)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    ops_fwd = device_ops(lambda: ops.side_by_side(modules, x))
    assert ops_fwd.torch_ops["cat"] == 1
    assert (ops_fwd.triton, sum(ops_fwd.torch_ops.values())) == ((1, 1) if impl == "workbench" else (0, 2))


def test_the_layers_run_their_projections_side_by_side():
    """Attention and SwiGLU call ops.side_by_side on the projections of one x."""
    seen = []
    real = ops.side_by_side

    def spy(projections, x):
        seen.append(len(projections))
        return real(projections, x)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ops, "side_by_side", spy)
        for kind in ("qkv", "gate_up"):
            layer, _ = _projections(kind, "torch")
            x = torch.randn(1, 3, SMOKE.dim)
            layer(x, *layers.rope_tables(3, SMOKE.head_dim, SMOKE.rope_theta)) if kind == "qkv" else layer(x)
    assert seen == [3, 2]


def test_side_by_side_joins_each_class_with_its_own_kind():
    """A projection of another class (an FP8 layer from kernels.fp8.convert, here a subclass that
    counts its calls) keeps its own forward, which the joint GEMM would bypass, while the others
    still share one GEMM; a bias, which the joint GEMM would drop, keeps its projection apart."""
    class Counted(torch.nn.Linear):
        calls = 0

        def forward(self, x):
            Counted.calls += 1
            return super().forward(x)

    torch.manual_seed(0)
    attn = layers.Attention(SMOKE, ops.resolve("torch"))
    counted = Counted(SMOKE.dim, attn.k.out_features, bias=False)
    counted.weight = attn.k.weight
    x = torch.randn(2, 3, SMOKE.dim)
    q, k, v = ops.side_by_side((attn.q, counted, attn.v), x)
    assert Counted.calls == 1 and torch.equal(k, attn.k(x))
    torch.testing.assert_close((q, v), (attn.q(x), attn.v(x)), rtol=1e-5, atol=1e-6)
    counted_ops = device_ops(lambda: ops.side_by_side((attn.q, counted, attn.v), x))
    assert counted_ops.torch_ops["cat"] == 1 and sum(counted_ops.torch_ops.values()) == 3   # cat, 2 GEMMs
    biased = torch.nn.Linear(SMOKE.dim, attn.k.out_features)
    assert torch.equal(ops.side_by_side((attn.q, biased), x)[1], biased(x))


def test_a_projection_kept_in_high_precision_leaves_the_converted_ones_joined():
    """Block 0's q after kernels.fp8.convert (the first Linear stays high precision): k and v still
    run as one FP8 linear, the launches and results of kernels.fp8.side_by_side on the two."""
    torch.manual_seed(0)
    attn = kernels.fp8.convert(layers.Attention(SMOKE, ops.resolve("workbench")), "rowwise",
                               keep_high_precision=("q",))
    assert type(attn.q) is kernels.nn.Linear and type(attn.k) is kernels.fp8.Float8Linear
    x = torch.randn(2, 3, SMOKE.dim)
    q, k, v = ops.side_by_side((attn.q, attn.k, attn.v), x)
    assert torch.equal(q, attn.q(x))
    assert all(torch.equal(a, b) for a, b in zip((k, v), kernels.fp8.side_by_side((attn.k, attn.v), x)))
    joined = device_ops(lambda: ops.side_by_side((attn.q, attn.k, attn.v), x))
    alone = device_ops(lambda: (attn.q(x), kernels.fp8.side_by_side((attn.k, attn.v), x)))
    assert (joined.triton, dict(joined.torch_ops)) == (alone.triton, dict(alone.torch_ops))


def test_model_shapes_and_the_loss_at_init_is_near_log_vocab():
    torch.manual_seed(0)
    model = GPT(SMOKE)
    tokens, targets = batch(SMOKE, seed=0, step=0)
    assert tokens.shape == targets.shape == (SMOKE.batch, SMOKE.seq)
    assert model(tokens).shape == (SMOKE.batch, SMOKE.seq, SMOKE.vocab)
    assert [b.moe for b in model.blocks] == [False, True]
    assert abs(model(tokens, targets).item() - math.log(SMOKE.vocab)) < 0.5


def test_data_follow_the_successor_table_and_split_the_global_batch():
    cfg = dataclasses.replace(SMOKE, seq=64)
    tokens, targets = batch(cfg, seed=3, step=5)
    assert torch.equal(tokens[:, 1:], targets[:, :-1])
    whole = batch(dataclasses.replace(cfg, batch=4), seed=3, step=5)[0]
    halves = [batch(cfg, seed=3, step=5, rank=r, world=2)[0] for r in (0, 1)]
    assert torch.equal(torch.cat(halves), whole)
    assert not torch.equal(batch(cfg, seed=3, step=6)[0], tokens)


def test_kernel_switch_resolves_strings_and_partial_mappings():
    assert ops.resolve("workbench") == dict.fromkeys(ops.OPS, "workbench")
    assert ops.resolve({"attention": "workbench"}) == {"gemm": "torch", "attention": "workbench",
                                                       "moe": "torch", "norm": "torch", "rope": "torch",
                                                       "swiglu": "torch", "loss": "torch"}
    assert ops.label(ops.resolve({"moe": "torch"})) == "torch"
    with pytest.raises(ValueError, match="unknown op"):
        ops.resolve({"softmax": "torch"})
    with pytest.raises(ValueError, match="must be one of"):
        ops.resolve({"gemm": "cublas"})


def test_gemm_switch_builds_kernels_linear_with_the_same_parameters():
    torch.manual_seed(0)
    plain = GPT(SMOKE, "torch")
    torch.manual_seed(0)
    switched = GPT(SMOKE, {"gemm": "workbench"})
    assert type(switched.head) is kernels.nn.Linear
    for (name, a), (_, b) in zip(plain.state_dict().items(), switched.state_dict().items()):
        assert torch.equal(a, b), name


def test_torch_moe_matches_a_per_token_loop():
    torch.manual_seed(0)
    moe = ffn.TorchMoE(dim=8, hidden=12, num_experts=4, top_k=2, shared_experts=1)
    x = torch.randn(2, 5, 8)
    out = moe(x)
    expected = []
    for token in x.reshape(-1, 8):
        probs = F.softmax(moe.router.weight @ token, dim=-1)
        top = probs.topk(2)
        y = swiglu(token, moe.shared_gate, moe.shared_up, moe.shared_down)
        for w, e in zip(top.values / top.values.sum(), top.indices):
            y = y + w * (F.silu(token @ moe.gate[e]) * (token @ moe.up[e])) @ moe.down[e]
        expected.append(y)
    torch.testing.assert_close(out, torch.stack(expected).reshape(2, 5, 8))
    assert moe.expert_counts.sum() == 10 * 2
    assert moe.aux_loss.item() >= 0.5 and moe.aux_loss.requires_grad


def test_moe_aux_loss_is_one_for_perfectly_even_routing():
    moe = ffn.TorchMoE(dim=4, hidden=4, num_experts=4, top_k=1)
    moe.router.weight.data = torch.eye(4) * 50   # token i goes to expert i, probability ~1
    moe(torch.eye(4))
    assert moe.expert_counts.tolist() == [1, 1, 1, 1]
    assert moe.aux_loss.item() == pytest.approx(1.0, abs=1e-6)


def test_moe_parameters_have_the_promised_names_and_shapes():
    moe = ffn.moe_ffn(SMOKE, "torch")
    e, d, h = SMOKE.experts, SMOKE.dim, SMOKE.expert_hidden
    shapes = {k: tuple(v.shape) for k, v in moe.named_parameters()}
    assert shapes["router.weight"] == (e, d)
    assert shapes["gate"] == shapes["up"] == (e, d, h) and shapes["down"] == (e, h, d)


def test_both_moe_implementations_hold_the_same_parameters():
    torch_side, workbench_side = ffn.moe_ffn(SMOKE, "torch"), ffn.moe_ffn(SMOKE, "workbench")
    assert type(workbench_side).__name__ == "MoE"
    workbench_side.load_state_dict(torch_side.state_dict())   # strict: same names and shapes
    x = torch.randn(3, SMOKE.dim)
    torch.testing.assert_close(workbench_side(x), torch_side(x), rtol=1e-5, atol=1e-5)


def test_active_parameters_equal_the_dense_models_matmul_weights():
    cfg = dataclasses.replace(SMOKE, experts=0)
    model = GPT(cfg)
    weights = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and n != "embed.weight")
    assert flops.active_params(cfg) == weights


def test_active_parameters_of_moe_count_only_routed_and_shared_experts():
    moe_layer = SMOKE.dim * SMOKE.experts + (2 + 1) * 3 * SMOKE.dim * SMOKE.expert_hidden
    dense_layer = 3 * SMOKE.dim * SMOKE.ffn_hidden
    attention = 2 * 32 * 32 + 2 * 32 * 16
    assert flops.active_params(SMOKE) == 2 * attention + dense_layer + moe_layer + 32 * 64


@pytest.mark.parametrize("name, low, high", [("gpu-moe-small", 0.5e9, 1.0e9),
                                              ("gpu-dense-1b", 0.9e9, 1.3e9)])
def test_gpu_presets_have_their_stated_size(name, low, high):
    cfg = PRESETS[name]
    with torch.device("meta"):
        total = sum(p.numel() for p in GPT(cfg).parameters())
    assert low <= total <= high
    if cfg.experts:
        assert 32 <= cfg.experts <= 64 and 4 <= cfg.top_k <= 8 and cfg.seq == 2048


@pytest.mark.parametrize("fp8", [None, "rowwise"])
def test_every_gradient_arrives_in_its_parameters_layout(fp8):
    """Autograd's gradient accumulation copies a gradient whose strides differ from its
    parameter's into the parameter's layout: one more pass over that gradient every step.
    With the workbench's kernels (and an FP8 recipe) every gradient of the model comes as
    its parameter lies, as torch's own layers give them."""
    model = GPT(SMOKE, ops.resolve("workbench"))
    if fp8:
        kernels.fp8.convert(model, fp8)
    strided = []
    for name, p in model.named_parameters():
        p.register_hook(lambda g, name=name, p=p: strided.append(name) if g.stride() != p.stride() else None)
    tokens, targets = batch(SMOKE, 0, 0, 0, 1, torch.device("cpu"))
    model(tokens, targets).backward()
    assert all(p.grad is not None for p in model.parameters())
    assert strided == []


COPIES = ("clone", "copy", "copy_", "_to_copy")   # the aten ops that write a tensor's values anew


def test_the_workbench_attention_backward_runs_the_copies_sdpas_does():
    """The attention's v is a (B, S, Hkv, D) projection viewed by heads and transposed: a dV in
    v's layout, as SDPA's, goes back through the view without a copy; a contiguous one costs
    one per layer per step. So the model's backward runs the same aten copies with either
    attention (q's and k's, contiguous after RoPE, on both sides)."""
    copies = {}
    for impl in ("torch", "workbench"):
        torch.manual_seed(0)
        model = GPT(SMOKE, ops.resolve({"attention": impl}))
        loss = model(*batch(SMOKE, 0, 0, 0, 1, torch.device("cpu")))
        with AtenCalls() as seen:
            loss.backward()
        copies[impl] = Counter(call for call in seen.calls if call[0] in COPIES)
    assert copies["torch"] and copies["workbench"] == copies["torch"]


def test_the_compiled_torch_moe_breaks_no_graph_to_load_its_grouped_gemm_baseline(monkeypatch):
    """The grouped GEMM package is loaded lazily, on the first ``kernels.get``: where that first
    call was in a forward dynamo traced, the compiled baseline's graph broke at the import, and
    stayed broken there after it. The layer loads it when it is built (checked: without that,
    the import is one of the breaks)."""
    from kernels import registry

    monkeypatch.setattr(registry, "_loaded", registry._loaded - {"grouped_gemm"})   # as in a fresh process
    moe = ffn.TorchMoE(dim=8, hidden=12, num_experts=4, top_k=2)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(moe)(torch.randn(2, 5, 8))
    frames = [frame.name for reason in explained.break_reasons for frame in reason.user_stack]
    assert "_load" not in frames and "import_module" not in frames


def test_the_compiled_torch_moe_under_bf16_autocast_is_one_graph_with_torchs_grouped_mm():
    """A compiled training step's PyTorch MoE (bf16 under autocast) is one graph: it calls
    ``torch._grouped_mm`` as compiled MoE code does, not the per-expert loop, whose reads of the
    offsets broke the graph and waited for the device once per GEMM, and counts the slots per
    expert into a tensor of a static shape (``bincount``'s shape depends on the ids: a break).
    Its output and gradients are the eager layer's, within bf16's rounding (the gradients' sums
    run in another order: x's differ by 4.5e-4 here)."""
    torch.manual_seed(0)
    moe = ffn.TorchMoE(dim=16, hidden=32, num_experts=4, top_k=2)
    x = torch.randn(2, 5, 16)
    torch._dynamo.reset()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        explained = torch._dynamo.explain(moe)(x)
    assert explained.graph_break_count == 0, explained.break_reasons
    runs = []
    for layer in (moe, torch.compile(moe, backend="aot_eager")):
        torch._dynamo.reset()
        moe.zero_grad()
        leaf = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = layer(leaf)
        out.float().sum().backward()
        runs.append((out.detach(), leaf.grad, *(p.grad.clone() for p in (moe.gate, moe.up, moe.down))))
    torch.testing.assert_close(runs[1][0], runs[0][0])                       # bf16's default tolerance
    for compiled, eager in zip(runs[1][1:], runs[0][1:]):
        torch.testing.assert_close(compiled, eager, rtol=1.6e-2, atol=2e-3)   # fp32 grads of a bf16 step


@pytest.mark.parametrize("kernels_", ["torch", "workbench"])
def test_the_whole_step_s_model_under_bf16_autocast_compiles_to_one_graph(kernels_):
    """``--compile`` of either kernel set: no graph break anywhere in the model's forward, so
    the compiled PyTorch baseline is not slowed by breaks of this package's making."""
    cfg = PRESETS["cpu-smoke"]
    torch.manual_seed(0)
    model = GPT(cfg, ops.resolve(kernels_))
    tokens, targets = batch(cfg, 0, 0, 0, 1, torch.device("cpu"))
    torch._dynamo.reset()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        explained = torch._dynamo.explain(model)(tokens, targets)
    assert explained.graph_break_count == 0, explained.break_reasons
