"""Launch plans (kernels.plans): a repeated call reuses its op's checks and decisions; a call
that differs in anything a decision reads builds a new plan; the caches are bounded, forget
their plans when tuning choices or the ladders change, and step aside for a tuning pass."""
from __future__ import annotations

import contextlib
import inspect

import pytest
import torch
from triton.runtime.jit import JITFunction, create_function_from_signature

import kernels
from kernels import plans, tuning
from kernels.attention import ops as attention_ops
from kernels.attention import v4_amd_tuned, v5_backward
from kernels.gemm import linear as gemm_linear
from kernels.gemm import ops as gemm_ops
from kernels.gemm import v6_persistent as gemm_v6
from kernels.gemm_fp8 import ops as fp8_ops
from kernels.gemm_fp8 import spec as fp8_spec
from kernels.moe.grouped_gemm import ops as grouped_ops
from kernels.moe.grouped_gemm import spec as grouped_spec
from kernels.moe.grouped_gemm import v4_persistent as grouped_v4
from kernels.moe.layer_ladder import v3_fused
from kernels.moe.reference import moe_reference
from kernels.outputs import poisoned_outputs
from kernels.triton_support import run_args, run_kwargs
from workbench.harness import host_overhead


@pytest.fixture
def builds(monkeypatch):
    """Counts the plans built per site from here on: {"matmul": n, "v6": n, ...}."""
    counts: dict[str, int] = {}

    def counting(name, owner, attr):
        real = getattr(owner, attr)

        def build(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return real(*args, **kwargs)
        monkeypatch.setattr(owner, attr, build)

    plans.invalidate()
    counting("matmul", gemm_ops, "_Plan")
    counting("linear", gemm_linear, "_Checked")
    counting("linear", gemm_linear, "_MasterWeight")
    counting("v6", gemm_v6, "_plan")
    counting("attention", attention_ops, "_Checked")
    counting("varlen", attention_ops, "_CheckedVarlen")
    counting("v4", v4_amd_tuned, "_plan")
    counting("grouped", grouped_ops, "_Checked")
    counting("grouped_v4", grouped_v4, "_plan")
    counting("matmul_fp8", fp8_ops, "_Checked")
    counting("v5 backward", v5_backward, "LaunchPlan")
    counting("moe", v3_fused, "_plan")
    yield counts
    plans.invalidate()


def _matmul_ref(a, b):
    return (a.double() @ b.double()).to(a.dtype)


def test_a_repeated_call_builds_once_and_computes_each_time(builds):
    a, b = torch.randn(33, 20), torch.randn(20, 17)
    for _ in range(3):
        a, b = torch.randn_like(a), torch.randn_like(b)   # fresh values, same metadata
        with poisoned_outputs():
            torch.testing.assert_close(kernels.matmul(a, b), _matmul_ref(a, b))
    assert builds == {"matmul": 1, "v6": 1}


@pytest.mark.parametrize("change", ["shape", "strides", "dtype", "requires_grad", "rank", "rank, flattened by a copy"])
def test_matmul_misses_when_a_decision_input_changes(builds, change):
    a, b = torch.randn(33, 20), torch.randn(20, 17)
    kernels.matmul(a, b)
    before = dict(builds)
    other = {"shape": lambda: (torch.randn(31, 20), b),
             "strides": lambda: (torch.randn(20, 33).t(), b),   # same shape, column-major
             "dtype": lambda: (a.half(), b.half()),
             "requires_grad": lambda: (a.clone().requires_grad_(), b),
             "rank": lambda: (a.reshape(3, 11, 20), b),
             "rank, flattened by a copy": lambda: (torch.randn(11, 3, 20).transpose(0, 1), b)}[change]
    a2, b2 = other()
    with poisoned_outputs():
        c = kernels.matmul(a2, b2)
    torch.testing.assert_close(c, _matmul_ref(a2, b2), **({"atol": 1e-2, "rtol": 1e-2} if change == "dtype" else {}))
    assert builds["matmul"] == before["matmul"] + 1


@pytest.mark.parametrize("change", ["none", "weight strides", "weight requires_grad", "x rank", "no grad"])
def test_linear_keeps_a_plan_per_weight_and_input_metadata(builds, change):
    """kernels.nn.Linear's eager call keeps matmul's checks of x and weight.t() by x's and the
    weight's metadata (kernels.gemm.linear); the weight's transpose follows from the weight's."""
    layer = kernels.nn.Linear(20, 17)
    x = torch.randn(33, 20, requires_grad=True)
    layer(x)
    if change == "weight strides":   # same values, stored (K, N) and viewed (N, K)
        layer.weight = torch.nn.Parameter(layer.weight.detach().t().contiguous().t())
    if change == "weight requires_grad":
        layer.weight.requires_grad_(False)
    x = (torch.randn(3, 11, 20) if change == "x rank" else torch.randn_like(x)).requires_grad_()
    grad = torch.no_grad() if change == "no grad" else contextlib.nullcontext()
    with grad, poisoned_outputs():
        y = layer(x)
    expected = x.double() @ layer.weight.detach().double().t() + layer.bias.detach().double()
    torch.testing.assert_close(y.detach(), expected.float())
    assert builds["linear"] == (1 if change in ("none", "no grad") else 2)


def test_a_plans_launch_passes_run_what_kernel_grid_passes(monkeypatch):
    """triton_support.run_kwargs merges what Triton's ``kernel[grid]`` proxy would pass ``run``."""
    kernel = gemm_v6._streamk_fixup_kernel
    seen = []
    monkeypatch.setitem(kernel.__dict__, "run", lambda *args, **kwargs: seen.append((args, kwargs)))
    constexprs = {"BLOCK_M": 16, "num_warps": 4}
    kernel[(3, 2)](1, 2.0, "x", **constexprs)
    kernel.run(1, 2.0, "x", **run_kwargs((3, 2), constexprs))
    assert seen[0] == seen[1] == ((1, 2.0, "x"), {"grid": (3, 2), "warmup": False, **constexprs})


def test_run_args_bind_each_parameter_as_kernel_grids_keywords_do(monkeypatch):
    """triton_support.run_args passes the constexprs by position: Triton binds them to the same
    parameters as the names ``kernel[grid]`` passes; the compile options stay keywords."""
    kernel = gemm_v6._streamk_fixup_kernel
    seen = []
    monkeypatch.setitem(kernel.__dict__, "run", lambda *args, **kwargs: seen.append((args, kwargs)))
    scalars = (5, 6, 6, 1, 0, 2, 0)
    settings = {"BLOCK_M": 16, "BLOCK_N": 32, "GROUP_M": 4, "HAS_BIAS": True, "INTERP_BF16": False, "num_warps": 4}
    kernel[(3,)]("c", "p", "bias", *scalars, **settings)
    args, kwargs = run_args(kernel, 3, scalars, (3,), settings)
    kernel.run("c", "p", "bias", *args, **kwargs)
    parameters = inspect.signature(kernel.fn).parameters

    def bound(args, kwargs):
        params = {k: v for k, v in kwargs.items() if k in parameters}
        return (inspect.signature(kernel.fn).bind(*args, **params).arguments,
                {k: v for k, v in kwargs.items() if k not in parameters})
    assert bound(*seen[0]) == bound(*seen[1])
    assert kwargs == {"grid": (3,), "warmup": False, "num_warps": 4}
    # and the compiled JIT's binder (the first thing JITFunction.run does with them) agrees,
    # parameters, specialization and compile options
    jit = JITFunction(kernel.fn)

    class NoBackend:   # integers only: no tensor for a backend to specialize
        def get_arg_specialization(self, *args):
            return None
    binder = create_function_from_signature(jit.signature, jit.params, NoBackend())
    options = {k: v for k, v in kwargs.items() if k not in ("grid", "warmup")}
    assert binder(7, 8, 9, *args, **options) == binder(7, 8, 9, *scalars, **settings)


@pytest.mark.parametrize("wrong", ["a constexpr left out", "a scalar left out", "a scalar named"])
def test_run_args_refuse_a_launch_they_cannot_pass_by_position(wrong):
    """Checked when a plan is built: a missing setting, or scalars that stop short of the
    constexprs, would otherwise shift every argument after them; a setting that names a scalar
    would reach run twice."""
    settings = {"BLOCK_M": 16, "BLOCK_N": 32, "GROUP_M": 4, "HAS_BIAS": True, "INTERP_BF16": False}
    scalars = (5, 6, 6, 1, 0, 2, 0)
    if wrong == "a constexpr left out":
        del settings["GROUP_M"]
    elif wrong == "a scalar left out":
        scalars = scalars[:-1]
    else:   # given by position too: run would get it twice
        settings["SPLITS"] = 2
    with pytest.raises(ValueError, match="_streamk_fixup_kernel: 3 tensors and"):
        run_args(gemm_v6._streamk_fixup_kernel, 3, scalars, (3,), settings)


class _Subclass(torch.Tensor):
    """A tensor subclass (its own type in the key): the op runs as the custom op, which torch's
    ``__torch_function__`` answers with this type."""


def _linear_inputs(change):
    """nn.Linear's operands (x (4, 6, 20), weight (17, 20), bias (17,)), as ``change`` alters them."""
    x, weight, bias = torch.randn(4, 6, 20), torch.randn(17, 20), torch.randn(17)
    if change == "x flattens to a copy":   # (4, 6) from strides (20, 80): reshape copies
        x = torch.randn(6, 4, 20).transpose(0, 1)
    if change == "bias strides":
        bias = torch.randn(17, 3)[:, 1]
    if change == "bias broadcast":
        bias = torch.randn(1)
    if change == "weight strides":
        weight = torch.randn(20, 17).t()
    if change == "dtype":
        x, weight, bias = x.double().half(), weight.half(), bias.half()
    if change in ("bias dtype", "autocast, bias dtype"):   # cast to x's and added by torch after the GEMM
        bias = bias.double()
    if change == "requires_grad":
        weight.requires_grad_()
    if change == "type":
        x = x.as_subclass(_Subclass)
    if change == "storage offsets":   # the same metadata inside larger storages: each call's own pointers
        x = torch.randn(3 + x.numel())[3:].view(x.shape)
        weight = torch.randn(5 + weight.numel())[5:].view(weight.shape)
        bias = torch.randn(7 + bias.numel())[7:]
    return x, weight, bias


LINEAR_CHANGES = ["none", "x flattens to a copy", "bias strides", "bias broadcast", "weight strides", "dtype",
                  "bias dtype", "requires_grad", "type", "autocast",
                  "autocast, bias dtype", "storage", "storage offsets"]


@pytest.mark.parametrize("change", LINEAR_CHANGES)
def test_linear_never_reuses_a_stale_plan(builds, change):
    """A plan keeps what follows from its inputs' metadata: the launch's strides, the bias's stride
    and epilogue, whether x's flattening is a view it may skip, the path. Inputs that differ in any
    of them, called twice with fresh values after a plan is kept for the usual ones, compute the
    right result (outputs poisoned); the same metadata (``none``; ``storage``: the same tensors
    moved to new memory with ``set_``; ``storage offsets``: views into larger storages) reuses the
    plan, which launches with each call's own pointers."""
    gemm_linear.linear(*_linear_inputs("none"))
    before = builds["linear"]
    autocast = change.startswith("autocast")
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    for _ in range(2):
        x, weight, bias = _linear_inputs(change)
        if change == "storage":
            for t in (x, weight, bias):
                t.set_(torch.randn(t.shape).untyped_storage(), 0, t.shape, t.stride())
        with poisoned_outputs(), cast:
            y = gemm_linear.linear(x, weight, bias)
        low = torch.bfloat16 if autocast else x.dtype
        expected = (x.as_subclass(torch.Tensor).to(low).double() @ weight.detach().to(low).double().t()
                    + bias.to(low).double()).to(low)
        assert y.dtype == expected.dtype and y.shape == (4, 6, 17)
        assert (y.grad_fn is not None) == weight.requires_grad and type(y) is type(x)
        tolerance = {"atol": 1e-2, "rtol": 1e-2} if low != torch.float32 else {}
        torch.testing.assert_close(y.detach().as_subclass(torch.Tensor), expected, **tolerance)
    # the subclass's call reaches the custom op's implementation with a plain 2-D x: a plan of its own;
    # under autocast the public call keeps one plan, the fp32 weight's (a master weight), which holds the
    # checks of its cast to bf16, and launches it itself (or has torch add a float64 bias)
    assert builds["linear"] == before + {"none": 0, "storage": 0, "storage offsets": 0, "type": 2}.get(change, 1)


@pytest.mark.parametrize("change", ["type", "shape", "strides", "dtype", "device", "requires_grad", "extra"])
def test_the_key_holds_every_piece_of_metadata(change):
    t = torch.zeros(4, 6)
    other = {"type": lambda: torch.nn.Parameter(t, requires_grad=False), "shape": lambda: torch.zeros(4, 5),
             "strides": lambda: torch.zeros(6, 4).t(), "dtype": lambda: t.half(),
             "device": lambda: torch.zeros(4, 6, device="meta"),
             "requires_grad": lambda: t.clone().requires_grad_(), "extra": lambda: t}[change]()
    extra = (True, bool) if change == "extra" else (1, int)
    assert plans.meta(t, extra=(1, int)) != plans.meta(other, extra=extra)
    assert plans.meta(t, extra=(1, int)) == plans.meta(torch.ones(4, 6), extra=(1, int))   # values are not in it


def test_a_new_backend_misses(builds, fake_gpu, monkeypatch):
    a, b = torch.randn(33, 20), torch.randn(20, 17)
    kernels.matmul(a, b)
    cpu_key = plans.meta(a, b)
    fake_gpu("hip", "gfx942", "AMD Instinct MI300X")
    monkeypatch.setattr(tuning, "time_ms", lambda fn: 1.0)
    assert plans.meta(a, b) != cpu_key
    with host_overhead.stubbed_launches() as seen:
        kernels.matmul(a, b)
    assert seen.count >= 1 and builds == {"matmul": 2, "v6": 2}


@pytest.mark.parametrize("change", ["causal", "scale", "strides", "kv heads"])
def test_attention_misses_when_a_decision_input_changes(builds, change):
    q, k, v = torch.randn(1, 4, 19, 16), torch.randn(1, 2, 23, 16), torch.randn(1, 2, 23, 16)
    kernels.flash_attention(q, k, v, causal=True)
    before = dict(builds)
    args = {"causal": lambda: (q, k, v, False, None),
            "scale": lambda: (q, k, v, True, 0.5),
            "strides": lambda: (torch.randn(1, 19, 4, 16).transpose(1, 2), k, v, True, None),
            "kv heads": lambda: (q, torch.randn(1, 4, 23, 16), torch.randn(1, 4, 23, 16), True, None)}[change]()
    q2, k2, v2, causal, scale = args
    with poisoned_outputs():
        o = kernels.flash_attention(q2, k2, v2, causal=causal, scale=scale)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q2.double(), k2.double(), v2.double(), is_causal=causal, scale=scale, enable_gqa=True)
    torch.testing.assert_close(o, expected.float())
    assert builds["attention"] == before["attention"] + 1 and builds["v4"] == before["v4"] + 1


def test_an_argument_equal_to_a_good_one_but_of_another_type_is_refused(builds):
    """``1 == True`` and ``hash(1) == hash(True)``: a key without the types would let a plan
    built for ``causal=True`` answer ``causal=1``."""
    q = k = v = torch.randn(1, 2, 8, 16)
    kernels.flash_attention(q, k, v, causal=True, scale=1.0)
    with pytest.raises(TypeError, match="causal must be a bool, got int"):
        kernels.flash_attention(q, k, v, causal=1, scale=1.0)
    with pytest.raises(TypeError, match="scale must be a float or None, got bool"):
        kernels.flash_attention(q, k, v, causal=True, scale=True)


@pytest.mark.parametrize("change", ["none", "out_dtype", "scale granularity", "strides"])
def test_matmul_fp8_misses_when_a_decision_input_changes(builds, change):
    """A repeat with fresh values reuses the plan; a change of what the launch reads misses."""
    first = fp8_spec.make_inputs((19, 23, 40), seed=1)           # per-row / per-column scales
    kernels.matmul_fp8(*first)
    other = {"none": lambda: (fp8_spec.make_inputs((19, 23, 40), seed=3), torch.bfloat16),
             "out_dtype": lambda: (first, torch.float32),
             "scale granularity": lambda: (fp8_spec.make_inputs((19, 23, 40), seed=2), torch.bfloat16),
             "strides": lambda: (fp8_spec.make_inputs((19, 23, 40), seed=1, layout="col"), torch.bfloat16),
             }[change]
    inputs, out_dtype = other()
    with poisoned_outputs():
        c = kernels.matmul_fp8(*inputs, out_dtype=out_dtype)
    assert c.dtype == out_dtype
    torch.testing.assert_close(c.double(), fp8_spec.reference(*inputs), atol=0.05, rtol=0.02)
    assert builds["matmul_fp8"] == (1 if change == "none" else 2)


def test_attention_backward_keeps_a_plan_and_misses_when_causal_changes(builds):
    q, k, v = (torch.randn(1, h, 11, 16, requires_grad=True) for h in (4, 2, 2))
    for causal in (True, True, False):
        q, k, v = (torch.randn_like(t).requires_grad_() for t in (q, k, v))   # fresh values
        grad_o = torch.randn(1, 4, 11, 16)
        with poisoned_outputs():
            grads = torch.autograd.grad(kernels.flash_attention(q, k, v, causal=causal), (q, k, v), grad_o)
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        o64 = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=causal, enable_gqa=True)
        for got, want in zip(grads, torch.autograd.grad(o64, (q64, k64, v64), grad_o.double())):
            torch.testing.assert_close(got, want.float())
    assert builds["v5 backward"] == 2


def test_varlen_misses_when_its_max_lengths_change(builds):
    q, k, v = torch.randn(40, 4, 16), torch.randn(40, 2, 16), torch.randn(40, 2, 16)
    cu = torch.tensor([0, 15, 40], dtype=torch.int32)
    first = kernels.flash_attention_varlen(q, k, v, cu, cu, 25, 25, causal=True)
    assert kernels.flash_attention_varlen(q, k, v, cu, cu, 25, 25, causal=True).equal(first)
    assert builds["varlen"] == 1
    torch.testing.assert_close(kernels.flash_attention_varlen(q, k, v, cu, cu, 40, 40, causal=True), first)
    assert builds["varlen"] == 2 and builds["v4"] == 2   # a longer max: another grid


def test_grouped_gemm_reads_the_offsets_values_on_every_checked_call(builds):
    x, w = torch.randn(37, 24), torch.randn(3, 24, 20)
    kernels.grouped_gemm(x, w, torch.tensor([10, 10, 37], dtype=torch.int32))
    with pytest.raises(ValueError, match="non-decreasing"):
        kernels.grouped_gemm(x, w, torch.tensor([10, 5, 37], dtype=torch.int32))
    with pytest.raises(ValueError, match="must equal x's row count T=37, got 36"):
        kernels.grouped_gemm(x, w, torch.tensor([10, 10, 36], dtype=torch.int32))
    assert builds["grouped"] == 1   # same metadata: the checks of the values are not in the plan


@pytest.mark.parametrize("change", ["none", "x strides", "w strides", "offsets strides", "dtype", "requires_grad"])
def test_grouped_gemm_never_reuses_a_stale_plan(builds, change):
    """Its launch plan keeps the operands' strides and the constexprs by position
    (triton_support.run_args): inputs that differ in their metadata, called twice with fresh values
    after a plan is kept for the usual ones, compute the right result (outputs poisoned)."""
    def inputs():
        x, w, offsets = _usual_grouped()
        if change == "x strides":
            x = torch.randn(24, 37).t()
        if change == "w strides":
            w = torch.randn(3, 20, 24).transpose(1, 2)
        if change == "offsets strides":
            offsets = torch.tensor([10, 0, 10, 0, 37, 0], dtype=torch.int32)[::2]
        if change == "dtype":
            x, w = x.half(), w.half()
        if change == "requires_grad":
            w.requires_grad_()
        return x, w, offsets
    kernels.grouped_gemm(*_usual_grouped())
    before = builds["grouped"]
    for _ in range(2):
        x, w, offsets = inputs()
        with poisoned_outputs():
            out = kernels.grouped_gemm(x, w, offsets)
        want = grouped_spec.reference(x.double(), w.detach().double(), offsets).to(x.dtype)
        tolerance = {"atol": 1e-2, "rtol": 1e-2} if x.dtype != torch.float32 else {}
        torch.testing.assert_close(out.detach(), want, **tolerance)
        assert (out.grad_fn is not None) == w.requires_grad
    assert builds["grouped"] == before + (0 if change == "none" else 1)


def _usual_grouped():
    return torch.randn(37, 24), torch.randn(3, 24, 20), torch.tensor([10, 10, 37], dtype=torch.int32)


def _moe_layer(dtype=torch.float32):
    torch.manual_seed(0)
    return kernels.MoE(24, 20, 5, 2, 0).to(dtype).requires_grad_(False)


def _moe_check(layer, x):
    """The layer on ``x``, outputs poisoned, against the float64 reference of its weights."""
    with poisoned_outputs():
        out = layer(x)
    weights = (w.detach().double() for w in (layer.router.weight, layer.gate, layer.up, layer.down))
    want = moe_reference(x.detach().double().reshape(-1, 24), *weights, layer.top_k, layer.normalize)
    tol = 1e-4 if x.dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.detach().double(), want.reshape(out.shape), atol=tol, rtol=tol)
    return out


def test_a_repeated_moe_call_builds_its_fused_launches_once(builds):
    """kernels.MoE's fused forward (v3) decides both kernels' configs, grids and arguments once
    per metadata; fresh inputs and weights of the same metadata reuse them, and a tuning pass
    still sees both kernels' keys (the recorded call decides again)."""
    layer = _moe_layer()
    for seed in range(3):
        generator = torch.Generator().manual_seed(seed)
        for w in (layer.router.weight, layer.gate, layer.up, layer.down):
            w.copy_(torch.randn(w.shape, generator=generator) / 4)
        _moe_check(layer, torch.randn(2, 9, 24, generator=generator))
    assert builds["moe"] == 1
    with tuning.recording() as seen:
        _moe_check(layer, torch.randn(2, 9, 24))
    assert [op for op, _ in seen].count("moe/v3") == 2 and builds["moe"] == 2


@pytest.mark.parametrize("change", ["none", "tokens", "dtype", "requires_grad", "grad mode"])
def test_moe_misses_when_a_decision_input_changes(builds, change):
    """A fused forward keys on its inputs' metadata: a new token count, dtype or gradient need
    (x's, or grad mode turned on for an x that needs one) misses and builds again."""
    layer, x = _moe_layer(), torch.randn(2, 9, 24)
    with torch.no_grad() if change == "grad mode" else contextlib.nullcontext():
        layer(x.requires_grad_(change == "grad mode"))
    if change == "dtype":
        layer = layer.half()
    x = {"tokens": lambda: torch.randn(3, 5, 24), "dtype": lambda: torch.randn(2, 9, 24).half(),
         "requires_grad": lambda: torch.randn(2, 9, 24, requires_grad=True),
         "grad mode": lambda: torch.randn(2, 9, 24, requires_grad=True)}.get(change, lambda: torch.randn(2, 9, 24))()
    out = _moe_check(layer, x)
    if x.requires_grad:   # the plan saved g and u: the backward runs on them
        out.sum().backward()
        assert x.grad is not None and torch.isfinite(x.grad).all()
    assert builds["moe"] == (1 if change == "none" else 2)


def test_the_fused_forward_keys_on_save(builds):
    """Whether g and u are kept for a backward is an argument, not metadata: the same tensors
    with ``save`` True after False build a plan that writes them."""
    x, router, gate, up, down, top_k = kernels.spec("moe").make_inputs((13, 24, 20, 5, 2, 0), torch.float32)
    weights, ids = kernels.moe.route(torch.nn.functional.linear(x, router), top_k)
    h = v3_fused.fused_forward(x, weights, ids, gate, up, down, False)[3]
    with poisoned_outputs():
        _, g, u, h_saved, _, _ = v3_fused.fused_forward(x, weights, ids, gate, up, down, True)
    assert g.shape == u.shape == h.shape and builds["moe"] == 2
    torch.testing.assert_close(h_saved, h, rtol=0, atol=0)
    torch.testing.assert_close(torch.nn.functional.silu(g) * u, h)


def test_a_non_tensor_gets_the_usual_error_and_no_plan(builds):
    with pytest.raises(TypeError, match="a must be a torch.Tensor, got list"):
        kernels.matmul([[1.0]], torch.randn(1, 1))
    assert plans.meta([[1.0]], torch.randn(1, 1)) is None


def test_a_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(plans, "SIZE", 3)
    cache = plans.PlanCache()
    for n in range(10):
        assert cache(("key", n), lambda n: f"plan {n}", n) == f"plan {n}"
        assert len(cache) <= 3


def test_an_unsettled_decision_is_used_once(builds):
    cache = plans.PlanCache()

    def build():
        plans.unsettled()   # as tuning.choice does for an untimed, unkept choice
        return object()
    assert cache("k", build) is not cache("k", build)
    assert len(cache) == 0


def test_plans_are_forgotten_with_the_tuning_choices(builds):
    a, b = torch.randn(33, 20), torch.randn(20, 17)
    kernels.matmul(a, b)
    tuning.forget()
    kernels.matmul(a, b)
    assert builds == {"matmul": 2, "v6": 2}


def test_a_tuning_pass_sees_the_key_of_a_planned_call(builds):
    a, b = torch.randn(33, 20), torch.randn(20, 17)
    kernels.matmul(a, b)
    with tuning.recording() as seen:
        kernels.matmul(a, b)
    assert [op for op, _ in seen] == ["gemm/v6"]
    kernels.matmul(a, b)
    assert builds["v6"] == 2   # the recorded call decided again; the one after it kept that plan


def test_a_superseded_learner_copy_releases_its_plan_cache(tmp_path):
    """Each exercise check imports the learner's file afresh; the copy it supersedes leaves
    sys.modules and, once dropped, takes its launch-plan cache with it (plans.invalidate
    would otherwise walk every stale copy, and memory grow per check)."""
    import gc
    import sys

    from workbench.harness.kernel_file import import_file
    from workbench.learn.exercises import source

    path = tmp_path / "attention_v5_attempt.py"
    path.write_text(source.render("kernels.attention.v5_backward"))
    gc.collect()                         # earlier tests' dropped modules, not counted below
    before = len(plans._caches)
    for _ in range(3):
        module, _rungs = import_file(path, "attention")
        assert len(plans._caches) >= before + 1
    del module, _rungs
    gc.collect()
    assert len(plans._caches) == before + 1
    assert sum(getattr(m, "__file__", None) == str(path) for m in list(sys.modules.values())) == 1


def test_varlen_keys_one_set_of_offsets_once_and_still_checks_a_second(builds):
    """Queries and keys packed by the same offsets tensor (self-attention's call) key it once;
    a second tensor, even of equal values, is keyed and checked on its own."""
    q, k, v = torch.randn(40, 4, 16), torch.randn(40, 2, 16), torch.randn(40, 2, 16)
    cu = torch.tensor([0, 15, 40], dtype=torch.int32)
    with poisoned_outputs():
        same = kernels.flash_attention_varlen(q, k, v, cu, cu, 25, 25, causal=True)
        assert kernels.flash_attention_varlen(q, k, v, cu, cu.clone(), 25, 25, causal=True).equal(same)
    assert builds["varlen"] == 2
    want = torch.cat([torch.nn.functional.scaled_dot_product_attention(
        *(t[a:b].transpose(0, 1).double() for t in (q, k, v)), is_causal=True, enable_gqa=True).transpose(0, 1)
        for a, b in ((0, 15), (15, 40))])
    torch.testing.assert_close(same, want.float())
    with pytest.raises(TypeError, match="cu_seqlens_k"):
        kernels.flash_attention_varlen(q, k, v, cu, cu.long(), 25, 25, causal=True)
