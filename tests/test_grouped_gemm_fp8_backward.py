"""FP8 grouped GEMM training: ``grouped_gemm_fp8_train``'s forward, dX and dW against the
float64 product of the operands each GEMM was given (dequantized), in both e4m3 formats,
every recipe and both gradient formats (e4m3, and e5m2 beside it: hybrid), at odd shapes with empty and one-row groups; the dW kernel on
unaligned groups longer than a few tiles with NaN bytes in the padding; empty operands;
bad inputs; launch count (one backward = two grouped launches); no host sync; ``amax=True``
changing no output bit; a given scale validated once per call; the custom ops under opcheck
and torch.compile without graph breaks.

Each GEMM is judged on its own operands, as the harness judges FP8 rungs: quantization
error belongs to the recipe, a kernel is charged for its accumulation and rounding.
A looser check against the high-precision gradients catches a recipe that scales the
wrong dimension.
"""
from __future__ import annotations

import pytest
import torch

from grouped_fp8_training import SIZES, K, N, close, problem, run
from host_sync import no_host_sync
from kernels.gemm_fp8 import FP8_DTYPES
from kernels.gemm_fp8.formats import E5M2_OF
from kernels.gemm_fp8.quantize import reduce_maxima
from kernels.moe.grouped_gemm import spec as grouped_spec
from kernels.moe.grouped_gemm_fp8 import dw as dw_module
from kernels.moe.grouped_gemm_fp8 import grouped_gemm_fp8_dw, grouped_gemm_fp8_train, quantize, v0_one_launch
from kernels.outputs import poisoned_outputs

E4M3FN = torch.float8_e4m3fn


def _deq(q, scale):
    return q.double() * scale.double()


def _expected(x, w, dy, offsets, recipe, fp8, grad=None, scales=(None, None)):
    """float64 forward, dx and dw of the operands each GEMM gets from :mod:`.quantize`."""
    grad, (scale_x, scale_w) = grad or fp8, scales
    x8, sx = quantize.tokens(x, recipe, fp8, scale_x)
    w8, sw = quantize.forward_weight(w, recipe, fp8, scale_w)
    y = grouped_spec.reference(_deq(x8, sx[:, None]), _deq(w8, sw[:, None, :]), offsets)
    dy8, sdy = quantize.tokens(dy, recipe, grad)
    wt8, swt = quantize.dgrad_weight(w, recipe, fp8, scale_w)
    assert dy8.dtype == grad and wt8.dtype == fp8
    dx = grouped_spec.reference(_deq(dy8, sdy[:, None]), _deq(wt8, swt[:, None, :]), offsets)
    ids = quantize.group_of_rows(offsets, x.shape[0])
    xt8, sxt = quantize.wgrad_operand(x, offsets, recipe, fp8, scale_x)
    dyt8, sdyt = quantize.wgrad_operand(dy, offsets, recipe, grad)
    xd = _deq(xt8[:, :x.shape[0]], sxt[ids].t())       # (K, T)
    dyd = _deq(dyt8[:, :x.shape[0]], sdyt[ids].t())    # (N, T)
    dw = torch.stack([xd[:, s:e] @ dyd[:, s:e].t() for s, e in grouped_spec.group_bounds(offsets)])
    return y, dx, dw


def _history_scales(x, w, fp8):
    """Per-tensor scales as an amax history gives them: not this step's (x's twice its amax's,
    w's 1.5 times), so a GEMM that ignored them would quantize differently."""
    fmax = torch.finfo(fp8).max
    return 2 * x.abs().amax() / fmax, 1.5 * w.abs().amax() / fmax


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_forward_with_amax_is_the_plain_forward_and_finds_both_amaxes(dtype):
    """``amax=True`` (delayed's record) changes no output bit, and the maxes of the tile maxima
    it returns are bitwise x's and w's ``abs().amax()``, found by the forward's casts; a pair of
    flags returns those of the casts it names, the others empty; (False, False) the output alone, as
    False."""
    x, w, _, offsets = problem(dtype=dtype)
    scales = _history_scales(x.float(), w.float(), E4M3FN)
    with poisoned_outputs():
        plain = grouped_gemm_fp8_train(x, w, offsets, "delayed", E4M3FN, None, *scales)
        y, maxima = grouped_gemm_fp8_train(x, w, offsets, "delayed", E4M3FN, None, *scales, amax=True)
    found = torch.stack([reduce_maxima(m) for m in maxima])
    want = torch.stack([x.abs().amax(), w.abs().amax()]).float()
    assert torch.equal(y, plain) and torch.equal(found.view(torch.int32), want.view(torch.int32))
    for pair in ((True, False), (False, True)):   # only the casts named write theirs
        with poisoned_outputs():
            y, some = grouped_gemm_fp8_train(x, w, offsets, "delayed", E4M3FN, None, *scales, amax=pair)
        assert torch.equal(y, plain), pair
        for wanted, got, all_of in zip(pair, some, maxima):
            assert torch.equal(got, all_of) if wanted else got.numel() == 0, pair
    with poisoned_outputs():
        alone = grouped_gemm_fp8_train(x, w, offsets, "delayed", E4M3FN, None, *scales, amax=(False, False))
    assert torch.equal(alone, plain)
    with pytest.raises(TypeError, match=r"amax must be a bool or a pair of bools \(x's, w's\), got \[True\]"):
        grouped_gemm_fp8_train(x, w, offsets, "delayed", E4M3FN, None, *scales, amax=[True])


def test_a_given_scale_is_validated_once_per_call(monkeypatch):
    """``grouped_gemm_fp8_train``'s entry checks scale_x and scale_w; the operands its forward
    and backward quantize with them (tokens, forward weight, dgrad weight, wgrad operand)
    do not check them again."""
    from kernels import validate
    x, w, dy, offsets = problem()
    scales = _history_scales(x, w, E4M3FN)
    checked, tensor = [], validate.tensor

    def counted(name, t, *args, **kwargs):
        if any(t is s for s in scales):   # not the GEMMs' scale operands, views of them
            checked.append(name)
        return tensor(name, t, *args, **kwargs)
    monkeypatch.setattr(validate, "tensor", counted)
    run(x, w, dy, offsets, "delayed", E4M3FN, torch.float8_e5m2, scales)
    assert checked == ["scale_x", "scale_w"]


CASES = {"tensorwise-hybrid": ("tensorwise", True), "delayed-hybrid": ("delayed", True),
         "tensorwise-e4m3": ("tensorwise", False), "rowwise-e4m3": ("rowwise", False)}


@pytest.mark.parametrize("recipe,hybrid", CASES.values(), ids=CASES.keys())  # blockwise: ..._blockwise.py
@pytest.mark.parametrize("fp8", FP8_DTYPES, ids=str)
def test_forward_and_both_gradients_match_the_dequantized_product(recipe, hybrid, fp8):
    x, w, dy, offsets = problem()
    grad = E5M2_OF[fp8] if hybrid else fp8
    scales = _history_scales(x, w, fp8) if recipe == "delayed" else (None, None)
    y, dx, dw = run(x, w, dy, offsets, recipe, fp8, grad, scales)
    expected = _expected(x, w, dy, offsets, recipe, fp8, grad, scales)
    for got, want in zip((y, dx, dw), expected):
        assert got.dtype == torch.float32 and got.shape == want.shape
        close(got, want, 1e-5)                  # fp32 accumulation and output
    assert torch.equal(dw[1], torch.zeros(K, N))  # the empty group's expert
    # against the high-precision GEMM: only quantization error (e4m3: 2^-4 relative per
    # element, e5m2: 2^-3), so a recipe that scales along the wrong dimension would show here
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    grouped_spec.reference(x64, w64, offsets).backward(dy.double())
    for got, want in ((dx, x64.grad), (dw, w64.grad)):
        close(got, want, 0.15)


def test_bf16_operands_give_bf16_results_and_gradients():
    x, w, dy, offsets = problem(dtype=torch.bfloat16, seed=1)
    y, dx, dw = run(x, w, dy, offsets, "rowwise", E4M3FN)
    for got, want in zip((y, dx, dw), _expected(x, w, dy, offsets, "rowwise", E4M3FN)):
        assert got.dtype == torch.bfloat16
        close(got, want, 1e-2)                  # one bf16 rounding of an fp32 sum


def test_dw_kernel_masks_unaligned_groups_and_never_reads_the_padding():
    """Groups that start mid-way through 16 tokens and span more than two 32-token tiles
    (the interpreter's), a one-token group, an empty one, and a token count padded with
    e4m3fn NaN bytes, which must never reach a product."""
    sizes, k, n = [7, 75, 0, 1, 40], 19, 21
    gen = torch.Generator().manual_seed(3)
    t = sum(sizes)
    offsets = grouped_spec.offsets_from_sizes(torch.tensor(sizes))
    xt = torch.full((k, t + 13), 0x7F, dtype=torch.uint8).view(E4M3FN)     # 0x7F: NaN
    dyt = torch.full((n, t + 13), 0x7F, dtype=torch.uint8).view(E4M3FN)
    xt[:, :t] = (torch.randn(k, t, generator=gen) * 50).to(E4M3FN)
    dyt[:, :t] = (torch.randn(n, t, generator=gen) * 50).to(E4M3FN)
    sx, sdy = torch.rand(len(sizes), k, generator=gen) + 0.5, torch.rand(len(sizes), n, generator=gen) + 0.5
    with poisoned_outputs():
        dw = grouped_gemm_fp8_dw(xt, sx, dyt, sdy, offsets)
    bounds = grouped_spec.group_bounds(offsets)
    expected = torch.stack([(xt[:, s:e].double() * sx[g, :, None]) @ (dyt[:, s:e].double() * sdy[g, :, None]).t()
                            for g, (s, e) in enumerate(bounds)])
    close(dw, expected, 1e-6)


EMPTY = {"T=0": ([0, 0], 5, 3), "K=0": ([2, 1], 0, 3), "N=0": ([2, 1], 5, 0), "G=0": ([], 5, 3)}


@pytest.mark.parametrize("recipe", ("rowwise", "blockwise"))   # blockwise: K = 0 or G = 0 leave no block
@pytest.mark.parametrize("sizes,k,n", EMPTY.values(), ids=EMPTY.keys())
def test_empty_operands_give_zeros_of_the_operands_shapes(sizes, k, n, recipe):
    x, w, dy, offsets = problem(sizes, k, n)
    y, dx, dw = run(x, w, dy, offsets, recipe, E4M3FN)
    assert torch.equal(y, torch.zeros(sum(sizes), n))
    assert torch.equal(dx, torch.zeros_like(x)) and torch.equal(dw, torch.zeros_like(w))


@pytest.mark.parametrize("change,error,match", [
    (dict(recipe="nonsense"), ValueError, "trains with the recipes tensorwise, delayed, rowwise, blockwise"),
    (dict(fp8_dtype=torch.float8_e5m2), TypeError, "fp8_dtype must be one of"),
    (dict(grad_dtype=torch.float8_e5m2fnuz), TypeError, "grad_dtype must be .*family"),
    (dict(grad_dtype=torch.bfloat16), TypeError, "grad_dtype must be"),
    (dict(w=torch.randn(5, K, N, dtype=torch.bfloat16)), TypeError, "dtypes differ"),
    (dict(x=torch.randn(35, K).to(E4M3FN), w=torch.randn(5, K, N).to(E4M3FN)), TypeError, "x has dtype"),
    (dict(offsets=torch.tensor([5, 5, 6, 32, 35])), TypeError, "offsets must be int32"),
    (dict(recipe="delayed", scale_w=torch.tensor(1.0)), ValueError, "'delayed' takes .* pass scale_x"),
    (dict(recipe="rowwise", scale_x=torch.tensor(1.0)), ValueError, "scale_x is a per-tensor scale"),
    (dict(recipe="tensorwise", scale_w=torch.ones(2)), ValueError, "scale_w must hold one number"),
    (dict(recipe="tensorwise", scale_x=torch.tensor(1.0, dtype=torch.float64)), TypeError,
     "scale_x has dtype float64"),
    (dict(recipe="tensorwise", scale_x=torch.tensor(1.0), amax=(False, True)), ValueError,
     r"amax=\(False, True\) returns the tile maxima .*: pass scale_x and scale_w"),
], ids=["recipe", "fp8-format", "grad-family", "grad-not-fp8", "mixed-dtypes", "fp8-input", "offsets-int64",
        "delayed-without-scales", "rowwise-with-scale", "scale-shape", "scale-dtype", "amax-without-scales"])
def test_bad_inputs_are_refused_by_name(change, error, match):
    x, w, _, offsets = problem()
    args = {**dict(x=x, w=w, offsets=offsets, fp8_dtype=E4M3FN), **change}
    with pytest.raises(error, match=match):
        grouped_gemm_fp8_train(**args)


def test_dw_op_of_no_groups_is_empty():
    dw = grouped_gemm_fp8_dw(torch.zeros(4, 16, dtype=E4M3FN), torch.ones(0, 4),
                             torch.zeros(3, 16, dtype=E4M3FN), torch.ones(0, 3), torch.zeros(0, dtype=torch.int32))
    assert dw.shape == (0, 4, 3)


def test_dw_op_refuses_mismatched_operands():
    xt, dyt = torch.zeros(4, 16, dtype=E4M3FN), torch.zeros(3, 8, dtype=E4M3FN)
    offsets = torch.tensor([8], dtype=torch.int32)
    with pytest.raises(TypeError, match="xt is torch.float8_e4m3fn and dyt torch.float8_e5m2fnuz: .* families"):
        grouped_gemm_fp8_dw(xt, torch.ones(1, 4), dyt.to(torch.float8_e5m2fnuz), torch.ones(1, 3), offsets)
    with pytest.raises(ValueError, match="token counts differ"):
        grouped_gemm_fp8_dw(xt, torch.ones(1, 4), dyt, torch.ones(1, 3), offsets)
    with pytest.raises(ValueError, match=r"sx has shape \(4,\); expected \(1, 4\)"):
        grouped_gemm_fp8_dw(xt, torch.ones(4), dyt[:, :8].repeat(1, 2), torch.ones(1, 3), offsets)


def test_one_backward_is_two_grouped_launches_and_reads_nothing_on_the_host(monkeypatch):
    launches = []
    forward, dw = v0_one_launch.grouped_mm_fp8, dw_module.grouped_dw_fp8
    monkeypatch.setattr(v0_one_launch, "grouped_mm_fp8", lambda *a: launches.append("mm") or forward(*a))
    monkeypatch.setattr(dw_module, "grouped_dw_fp8", lambda *a: launches.append("dw") or dw(*a))
    x, w, dy, offsets = problem()
    x.requires_grad_(), w.requires_grad_()
    with no_host_sync():
        y = grouped_gemm_fp8_train(x, w, offsets, "rowwise", E4M3FN, check_offsets=False)
        assert launches == ["mm"]
        y.backward(dy)
    assert launches == ["mm", "mm", "dw"]       # forward; dX (the forward kernel on wᵀ), dW


def test_tensorwise_makes_dy_s_two_operands_in_one_cast_with_one_amax_pass(monkeypatch):
    """dy's dgrad and wgrad operands come from one cast that finds dy's per-tensor scale
    (quantize.token_operands: one amax pass over dy, not two, and one read for both layouts): the
    gradients are the bits of a backward whose wgrad cast finds its own, equal, scale."""
    from kernels.moe.grouped_gemm_fp8 import training

    x, w, dy, offsets = problem()
    passes, made = [], []
    groups, pairs = quantize._groups, quantize.token_operands
    monkeypatch.setattr(quantize, "_groups", lambda t, o, fp8, scale, *a, **k: passes.append(scale is None)
                        or groups(t, o, fp8, scale, *a, **k))
    monkeypatch.setattr(quantize, "token_operands", lambda t, *a, **k: made.append((t is dy, a[3:]))
                        or pairs(t, *a, **k))
    shared = training.gradients(x, w, offsets, dy, "tensorwise", E4M3FN, torch.float8_e5m2, (True, True))
    assert passes == [True]   # x's wgrad cast finds its scale
    assert made == [(True, (None,))]   # dy's two operands: one cast, finding dy's scale
    xt8, sxt = quantize.wgrad_operand(x, offsets, "tensorwise", E4M3FN)
    dyt8, sdyt = quantize.wgrad_operand(dy, offsets, "tensorwise", torch.float8_e5m2)   # its own amax pass
    assert torch.equal(shared[1], grouped_gemm_fp8_dw(xt8, sxt, dyt8, sdyt, offsets, w.dtype))


@pytest.mark.parametrize("sizes", [SIZES, [0, 0], [3]])
def test_tensorwise_backward_takes_x_s_and_w_s_operands_from_the_forward(monkeypatch, sizes):
    """The forward makes x's wgrad operand and w's dgrad operand with its own casts (each tensor's
    two operands from one cast with the scale it found), so the backward casts neither: no launch
    of it is given x or w; its gradients are the bits of a backward that casts them again (no
    rows: an empty wgrad operand)."""
    from kernels.moe.grouped_gemm_fp8 import training
    from workbench.harness.device_ops import stubbed_launches

    x, w, dy, offsets = problem(sizes)
    x.requires_grad_(), w.requires_grad_()
    seen = []
    real = training.gradients
    monkeypatch.setattr(training, "gradients", lambda *a: seen.append((a[0], a[-1])) or real(*a))
    y = grouped_gemm_fp8_train(x, w, offsets, "tensorwise", E4M3FN)
    grads = torch.autograd.grad(y, (x, w), dy, retain_graph=True)
    (x_operand, w_dgrad), = seen
    assert isinstance(x_operand, tuple) and len(x_operand) == 2 and len(w_dgrad) == 2
    again = real(x.detach(), w.detach(), offsets, dy, "tensorwise", E4M3FN, E4M3FN, (True, True))
    assert all(torch.equal(a, b) for a, b in zip(grads, again))
    with stubbed_launches(storages=True) as launches:
        torch.autograd.grad(y, (x, w), dy)
    assert launches.taking(x) == launches.taking(w) == 0
    assert launches.count == (5 if x.shape[0] else 0)   # dy's cast (3), dX, dW; nothing on no rows


def test_custom_ops_and_compile_without_graph_breaks():
    x, w, dy, offsets = problem([3, 0, 6], k=8, n=5)
    x8, sx = quantize.tokens(x, "rowwise", E4M3FN)
    xt, sxt = quantize.wgrad_operand(x, offsets, "rowwise", E4M3FN)
    dyt, sdyt = quantize.wgrad_operand(dy, offsets, "rowwise", E4M3FN)
    # test_schema left out as for kernels::grouped_gemm_fp8: its check needs a float8
    # torch.allclose, which the CPU lacks
    torch.library.opcheck(torch.ops.kernels.grouped_gemm_fp8_dw.default,
                          (xt, sxt, dyt, sdyt, offsets, torch.float32),
                          test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))
    x.requires_grad_(), w.requires_grad_()
    given = (torch.tensor(0.01), torch.tensor(0.02))
    for recipe, scales, amax in (("tensorwise", (given[0], None), (False, False)),
                                 ("tensorwise", (None, given[1]), (False, False)),
                                 ("tensorwise", (None, None), (False, False)),   # both scales found, returned
                                 ("delayed", given, (True, True)), ("delayed", given, (False, True)),
                                 ("delayed", given, (True, False))):   # the owner's later chunks' gate
        torch.library.opcheck(torch.ops.kernels.grouped_gemm_fp8_train.default,
                              (x.detach().bfloat16().requires_grad_(), w.detach().bfloat16().requires_grad_(),
                               offsets, recipe, E4M3FN,
                               torch.float8_e5m2, *scales, [], [], *amax),
                              test_utils=("test_autograd_registration", "test_faketensor"))

    def step(x, w):
        return (grouped_gemm_fp8_train(x, w, offsets, "rowwise", E4M3FN, check_offsets=False) * dy).sum()

    explained = torch._dynamo.explain(step)(x, w)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    grads = [torch.autograd.grad(fn(x, w), (x, w)) for fn in (step, compiled)]
    for eager, traced in zip(*grads):
        assert torch.equal(eager, traced)


@pytest.mark.parametrize("recipe, scales", [("delayed", (0.01, 0.02)), ("tensorwise", (None, None))])
def test_per_tensor_recipes_compile_without_graph_breaks(recipe, scales):
    """Their operands on the fused quantize ops (delayed's given scales, tensorwise's own):
    the compiled forward and backward give the eager gradients bit for bit."""
    x, w, dy, offsets = problem([3, 0, 6], k=8, n=5)
    sx, sw = (None if s is None else torch.tensor(s) for s in scales)

    def step(x, w):
        return (grouped_gemm_fp8_train(x, w, offsets, recipe, E4M3FN, None, sx, sw, check_offsets=False) * dy).sum()

    explained = torch._dynamo.explain(step)(x, w)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    x, w = x.requires_grad_(), w.requires_grad_()
    grads = [torch.autograd.grad(fn(x, w), (x, w)) for fn in (step, compiled)]
    for eager, traced in zip(*grads):
        assert torch.equal(eager, traced)
