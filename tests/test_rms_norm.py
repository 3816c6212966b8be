"""``kernels.rms_norm`` (:mod:`kernels.norm`) against the float64 formula, forward and both
gradients, on every dtype pair and every y dtype (``out_dtype``), odd and tiny N, 3-D, empty and
non-contiguous inputs, outputs poisoned; its weight gradient's bits across runs; its errors; its
custom ops (opcheck, ``torch.compile``); its device ops per call; and autocast, which must leave
it alone.

Tolerances, from the output's dtype (``torch.finfo(dtype).eps``: 2^-7 bf16, 2^-10 fp16;
1e-5 for fp32): a 16-bit y is the fp32 value rounded once to nearest, so within half a unit
in the last place of the float64 value, plus fp32's error (1e-5 of it: a value near a midpoint
may round either way); an fp32 y within ``1e-5·|ref|``. The gradients sum over a row (dx) or over every row (dweight)
terms that cancel, so an element's error scales with its row's or column's terms, not with
itself: within ``eps·(|ref| + terms)``, terms the largest ``|rstd·dy·w|`` of all rows for dx
and ``Σ_rows |dy·x̂|`` of the column for dweight (the magnitudes before they cancel)."""
from __future__ import annotations

import contextlib
import itertools

import pytest
import torch

import kernels
from kernels.norm import ops as norm_ops, rms_norm_kernels
from kernels.outputs import poisoned_outputs
from norm_tolerances import assert_close
from workbench.harness.device_ops import device_ops
from workbench.train.layers import RMSNorm

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
EPS = 1e-6


def _inputs(shape, x_dtype, w_dtype, seed, y_dtype=None):
    """Fresh x (scaled away from 1, so a missing rstd shows) and a weight around 1, with
    requires_grad; dy of x's shape and y's dtype (``y_dtype``, x's by default)."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=gen) * 3 + 0.5).to(x_dtype).requires_grad_()
    w = (torch.randn(shape[-1], generator=gen) * 0.5 + 1).to(w_dtype).requires_grad_()
    dy = torch.randn(shape, generator=gen).to(y_dtype or x_dtype)
    return x, w, dy


def _exact(x, w, dy, eps=EPS):
    """y, dx and dweight of the formula in float64, and the magnitudes of the terms dx and
    dweight sum (see the module's docstring)."""
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    rstd = torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    y = x64 * rstd * w64
    dx, dw = torch.autograd.grad(y, (x64, w64), dy.double())
    dx_terms = (rstd * dy.double() * w64).detach().abs()
    dw_terms = (dy.double() * x64 * rstd).detach().abs().reshape(-1, w.shape[0]).sum(0)
    return y.detach(), (dx, dx_terms.max() if dx_terms.numel() else 0), (dw, dw_terms)


def _check(x, w, dy, eps=EPS, out_dtype=None):
    """rms_norm's y (in ``out_dtype``) and gradients, outputs poisoned, against :func:`_exact`."""
    with poisoned_outputs():
        y = kernels.rms_norm(x, w, eps, out_dtype=out_dtype)
        dx, dw = torch.autograd.grad(y, (x, w), dy)
    want_y, want_dx, want_dw = _exact(x, w, dy, eps)
    assert_close(y, want_y, out_dtype or x.dtype)
    assert_close(dx, want_dx[0], x.dtype, want_dx[1])
    assert_close(dw, want_dw[0], w.dtype, want_dw[1])
    return y, dx, dw


@pytest.mark.parametrize("x_dtype, w_dtype", list(itertools.product(DTYPES, DTYPES)), ids=str)
@pytest.mark.parametrize("shape", [(37, 33), (2, 3, 1000), (5, 1), (2, 150, 40)], ids=str)
def test_forward_and_gradients_match_float64(shape, x_dtype, w_dtype):
    """Odd N (a masked tail in one block), N = 1, 3-D x, several row blocks; the last shape's
    backward has 19 programs, more than the weight gradient's sum takes at once (BLOCK_P)."""
    _check(*_inputs(shape, x_dtype, w_dtype, seed=sum(shape)))


@pytest.mark.parametrize("out_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(37, 33), (2, 150, 40)], ids=str)
def test_y_is_rounded_once_to_out_dtype_and_dy_read_in_it(shape, x_dtype, out_dtype):
    """fp32 x written as bf16 or fp16 y (the training step's norms under autocast) and bf16 x as
    fp32 y: y within half a unit of out_dtype's last place (rounded from fp32 once, not through
    x's dtype), dy read in y's dtype, dx in x's within fp32's or x's bound; an fp32 weight."""
    _check(*_inputs(shape, x_dtype, torch.float32, seed=sum(shape) + 1, y_dtype=out_dtype), out_dtype=out_dtype)


def test_rows_of_a_wider_buffer_and_a_strided_weight_are_read_in_place():
    """x a slice of a wider buffer's columns (row stride 40) and a weight of stride 2, read in
    place; dy a transposed (33, 21) buffer (its columns apart: copied)."""
    x, w, _ = _inputs((21, 40), torch.bfloat16, torch.float32, seed=3)
    x = x[:, 3:36]
    w2 = torch.randn(66).requires_grad_()
    dy = torch.randn(33, 21).to(torch.bfloat16).t()
    assert x.stride() == (40, 1) and w2[::2].stride() == (2,) and dy.stride() == (1, 21)
    _check(x, w2[::2], dy)


def test_rows_of_stride_0_are_read_in_place_and_columns_apart_are_copied():
    """A transposed 3-D x (its rows flatten only by a copy) with dy broadcast along the rows
    (row stride 0, read in place); a 2-D x whose columns are not adjacent (x.t()) with dy
    broadcast along the columns (column stride 0): both copied before the launch."""
    x, w, _ = _inputs((4, 6, 24), torch.float32, torch.bfloat16, seed=4)
    _check(x.transpose(0, 1), w, torch.randn(1, 1, 24).expand(6, 4, 24))
    x, w, _ = _inputs((24, 6), torch.bfloat16, torch.float32, seed=17)
    x2, w2 = x.t(), torch.randn(24, requires_grad=True)
    assert x2.stride() == (1, 6)
    _check(x2, w2, torch.randn(6, 1).to(torch.bfloat16).expand(6, 24))


@pytest.mark.parametrize("x_dtype, out_dtype", [(torch.bfloat16, None), (torch.float32, torch.bfloat16)], ids=str)
@pytest.mark.parametrize("shape", [(0, 33), (2, 0, 8), (3, 0), (0, 0)], ids=str)
def test_empty_inputs_do_what_the_models_formula_does(shape, x_dtype, out_dtype):
    """No rows: y empty, dweight 0; N = 0: y and dx empty, as torch's formula (then cast to
    ``out_dtype``) gives."""
    x, w, dy = _inputs(shape, x_dtype, torch.float32, seed=5, y_dtype=out_dtype)
    with poisoned_outputs():
        y = kernels.rms_norm(x, w, EPS, out_dtype=out_dtype)
        dx, dw = torch.autograd.grad(y, (x, w), dy, allow_unused=True)
    model = RMSNorm(shape[-1], EPS)
    with torch.no_grad():
        model.weight.copy_(w)
    want = model(x).to(out_dtype or x_dtype)
    want_dx, want_dw = torch.autograd.grad(want, (x, model.weight), dy)
    assert y.shape == want.shape and y.dtype == want.dtype
    assert torch.equal(dx, want_dx) and torch.equal(dw, want_dw) and dw.dtype == w.dtype


@pytest.mark.parametrize("x_dtype, w_dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.float16)],
                         ids=str)
def test_it_replaces_the_training_models_rmsnorm(x_dtype, w_dtype):
    """Within one rounding of the model's own result (both round an fp32 value once; the sums'
    orders differ), and its gradients within twice the float64 bound of the tests above (each
    is within it of float64)."""
    x, w, dy = _inputs((2, 9, 96), x_dtype, w_dtype, seed=6)
    model = RMSNorm(96, EPS).to(w_dtype)
    with torch.no_grad():
        model.weight.copy_(w)
    ours = kernels.rms_norm(x, w, EPS)
    theirs = model(x)
    ulp = torch.finfo(x_dtype).eps * theirs.detach().double().abs()
    assert ((ours.double() - theirs.detach().double()).abs() <= ulp).all()
    ours_grads = torch.autograd.grad(ours, (x, w), dy)
    theirs_grads = torch.autograd.grad(theirs, (x, model.weight), dy)
    _, (_, dx_terms), (_, dw_terms) = _exact(x, w, dy)
    assert_close(ours_grads[0], theirs_grads[0].double(), x_dtype, 2 * dx_terms)
    assert_close(ours_grads[1], theirs_grads[1].double(), w_dtype, 2 * dw_terms)


def test_backward_programs_that_own_several_row_blocks(monkeypatch):
    """On a GPU a large batch has more row blocks than :data:`PARTIAL_PROGRAMS`; here 3
    programs own 19 blocks (every third), each summing its rows' dweight terms."""
    monkeypatch.setattr(rms_norm_kernels, "PARTIAL_PROGRAMS", 3)
    x, w, dy = _inputs((300, 41), torch.bfloat16, torch.bfloat16, seed=16)   # a shape of its own: a new plan
    assert rms_norm_kernels.backward_programs(300, rms_norm_kernels.settings(41, torch.bfloat16)) == 3
    _check(x, w, dy)


def test_dweight_is_the_same_bits_on_every_run():
    """On a GPU the backward's programs run in any order and at once; dweight's bits do not depend
    on it, as each program writes a partial row of its own and the sum adds them in a fixed
    order (no atomics: tests/test_rms_norm_isa.py). Here: 19 programs, the same bits from runs
    whose outputs and workspace start as other bits (NaN-poisoned or not), so nothing reads a
    partial before it is written."""
    x, w, dy = _inputs((300, 40), torch.bfloat16, torch.float32, seed=7)
    assert rms_norm_kernels.backward_programs(300, rms_norm_kernels.settings(40, torch.bfloat16)) == 19
    grads = []
    for poisoned in (False, True, False):
        with poisoned_outputs() if poisoned else contextlib.nullcontext():
            y = kernels.rms_norm(x, w, EPS)
            grads.append(torch.autograd.grad(y, (x, w), dy))
    assert all(torch.equal(a, b) for grad in grads[1:] for a, b in zip(grads[0], grad))


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_eps_is_added_to_the_mean_square():
    """A row of zeros: y = 0·rsqrt(eps) = 0; eps = 0 gives NaN there, as torch's formula does."""
    x = torch.zeros(3, 16, requires_grad=True)
    w = torch.ones(16, requires_grad=True)
    assert torch.equal(kernels.rms_norm(x, w, 1e-5), torch.zeros(3, 16))
    assert kernels.rms_norm(x, w, 0.0).isnan().all()
    _check(*_inputs((6, 16), torch.float32, torch.float32, seed=8), eps=0.5)


def test_bad_inputs_get_clear_errors():
    x, w, _ = _inputs((4, 8), torch.bfloat16, torch.float32, seed=9)
    cases = [
        ((x, w[:7], EPS), ValueError, r"weight has shape \(7,\); it must be \(8,\)"),
        ((x, w.reshape(2, 4), EPS), ValueError, r"weight has shape \(2, 4\)"),
        ((x.int(), w, EPS), TypeError, "x has dtype int32; this kernel takes"),
        ((x, w.long(), EPS), TypeError, "weight has dtype int64"),
        ((x, w.double(), EPS), TypeError, "weight has dtype float64"),
        ((x[0, 0], w[:1], EPS), ValueError, "x must have at least 1 dimension"),
        ((x, w.to("meta"), EPS), ValueError, "weight is on meta"),
        ((torch.zeros(2, rms_norm_kernels.MAX_N + 1), torch.ones(rms_norm_kernels.MAX_N + 1), EPS),
         ValueError, f"at most N={rms_norm_kernels.MAX_N}"),
        ((x, w, -1e-6), ValueError, "eps must be a float >= 0"),
        ((x, w, float("nan")), ValueError, "eps must be a float >= 0"),
        ((x, w, "1e-6"), ValueError, "eps must be a float >= 0"),
        ((x, w, 1e60), ValueError, "outside float32's range"),
        (("x", w, EPS), TypeError, "x must be a torch.Tensor"),
    ]
    for args, error, message in cases:
        with pytest.raises(error, match=message):
            kernels.rms_norm(*args)
    for out_dtype, message in [("bfloat16", r"out_dtype must be a torch.dtype \(float32, float16, bfloat16\) or "
                                            r"None, got 'bfloat16'"),
                               (torch.float64, "out_dtype must be one of float32, float16, bfloat16 or None, got "
                                               "torch.float64"),
                               (torch.int8, "out_dtype must be one of .* got torch.int8")]:
        with pytest.raises(TypeError, match=message):
            kernels.rms_norm(x, w, EPS, out_dtype=out_dtype)


def test_the_backward_op_refuses_a_dy_it_cannot_take():
    """dy of a dtype the kernel does not read, or of another shape than x's."""
    x, w, dy = _inputs((4, 8), torch.float32, torch.float32, seed=20, y_dtype=torch.bfloat16)
    x, w = x.detach(), w.detach()
    rstd = torch.ops.kernels.rms_norm(x, w, EPS, torch.bfloat16)[1]
    with pytest.raises(TypeError, match="dy has dtype float64; this kernel takes"):
        torch.ops.kernels.rms_norm_backward(dy.double(), x, w, rstd)
    with pytest.raises(ValueError, match=r"dy must have x's shape \(4, 8\), got \(4, 7\)"):
        torch.ops.kernels.rms_norm_backward(dy[:, :7], x, w, rstd)


def test_the_largest_n_runs():
    x, w, dy = _inputs((2, rms_norm_kernels.MAX_N), torch.float32, torch.float32, seed=10)
    _check(x, w, dy)


def test_a_repeated_call_reuses_its_plan(monkeypatch):
    """Per kind of input (a gradient needed or not: the autograd and the plain path); a new
    ``eps`` or ``out_dtype`` is a new plan."""
    x, w, _ = _inputs((5, 24), torch.float16, torch.float16, seed=11)
    kernels.rms_norm(x, w, EPS)
    kernels.rms_norm(x.detach(), w.detach(), EPS)

    def rebuilt(*args):
        raise AssertionError("a plan was built again")
    monkeypatch.setattr(norm_ops, "_Plan", rebuilt)
    kernels.rms_norm(x, w, EPS)
    kernels.rms_norm(x.detach(), w.detach(), EPS)
    with pytest.raises(AssertionError, match="built again"):
        kernels.rms_norm(x, w, 1e-5)
    with pytest.raises(AssertionError, match="built again"):
        kernels.rms_norm(x, w, EPS, out_dtype=torch.float32)


@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16], ids=str)
def test_the_custom_ops_pass_opcheck(out_dtype):
    """The fakes' dtypes too: y in out_dtype, dx in x's from dy in y's."""
    x, w, dy = _inputs((3, 5, 20), torch.float32, torch.float32, seed=12, y_dtype=out_dtype)
    torch.library.opcheck(torch.ops.kernels.rms_norm.default, (x, w, EPS, out_dtype))
    _, rstd = torch.ops.kernels.rms_norm(x.detach(), w.detach(), EPS, out_dtype)
    torch.library.opcheck(torch.ops.kernels.rms_norm_backward.default, (dy, x.detach(), w.detach(), rstd))


@pytest.mark.parametrize("x_dtype, out_dtype", [(torch.bfloat16, None), (torch.float32, torch.bfloat16)], ids=str)
def test_torch_compile_keeps_the_ops_in_one_graph(x_dtype, out_dtype):
    """One graph, the eager bits, and y in out_dtype (the fake's dtype, which the traced
    backward's dy takes)."""
    def loss(x, w):
        y = kernels.rms_norm(x, w, EPS, out_dtype=out_dtype)
        return (y.float() * 2).sum(), y.dtype

    x, w, _ = _inputs((2, 7, 48), x_dtype, torch.float32, seed=13)
    explained = torch._dynamo.explain(loss)(x, w)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    (value, dtype), (want_value, want_dtype) = compiled(x, w), loss(x, w)
    assert dtype == want_dtype == (out_dtype or x_dtype)
    got = torch.autograd.grad(value, (x, w))
    want = torch.autograd.grad(want_value, (x, w))
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def _device_ops(norm, x, w, dy) -> tuple:
    """The device ops of ``norm(x)``'s forward and of its backward to x and ``w``."""
    forward = device_ops(lambda: norm(x))
    y = norm(x)
    return forward, device_ops(lambda: torch.autograd.grad(y, (x, w), dy, retain_graph=True))


def test_one_launch_forward_and_two_backward_where_the_model_runs_8_and_16():
    """bf16 x, an fp32 weight: the model's formula runs 8 torch ops forward and 16 backward. fp32
    x written as bf16 y: the same launches, no cast either way."""
    x, w, dy = _inputs((64, 96), torch.bfloat16, torch.float32, seed=14)
    forward, backward = _device_ops(lambda x: kernels.rms_norm(x, w, EPS), x, w, dy)
    assert (forward.triton, forward.total, backward.triton, backward.total) == (1, 1, 2, 2), (forward, backward)
    x32 = x.detach().float().requires_grad_()
    forward, backward = _device_ops(lambda x: kernels.rms_norm(x, w, EPS, out_dtype=torch.bfloat16), x32, w, dy)
    assert (forward.triton, forward.total, backward.triton, backward.total) == (1, 1, 2, 2), (forward, backward)
    model = RMSNorm(96, EPS)
    forward, backward = _device_ops(model, x, model.weight, dy)
    assert (forward.total, backward.total) == (8, 16), (forward, backward)


def test_autocast_leaves_it_in_x_dtype():
    """As the model's norm: computed in fp32 and kept in x's dtype inside a bf16 region, eager
    and traced."""
    x, w, _ = _inputs((6, 40), torch.float32, torch.float32, seed=15)
    outside = kernels.rms_norm(x, w, EPS)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = kernels.rms_norm(x, w, EPS)
        traced = torch.ops.kernels.rms_norm(x, w, EPS)[0]
    assert inside.dtype == traced.dtype == torch.float32
    assert torch.equal(inside, outside) and torch.equal(traced, outside)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        asked = kernels.rms_norm(x, w, EPS, out_dtype=torch.float16)
    assert torch.equal(asked, kernels.rms_norm(x, w, EPS, out_dtype=torch.float16))


@pytest.mark.parametrize("x_dtype, out_dtype", [(torch.bfloat16, None), (torch.float32, torch.bfloat16)], ids=str)
@pytest.mark.parametrize("n", [1024, 4096])
def test_a_call_launches_the_settings_its_aot_launch_compiles(n, x_dtype, out_dtype, monkeypatch):
    """bf16 rows with an fp32 weight, and the training step's fp32 rows written as bf16, at the ISA
    tests' widths: the forward's and backward's tile and warps are the ones
    :func:`rms_norm_kernels.aot` compiles (both from ``settings``)."""
    seen = {}
    for name in ("_forward_kernel", "_backward_kernel"):
        kernel = getattr(rms_norm_kernels, name)
        monkeypatch.setattr(kernel, "run", lambda *args, kernel=kernel, **kwargs: seen.setdefault(kernel, kwargs))
    x, w, dy = _inputs((2, n), x_dtype, torch.float32, seed=18, y_dtype=out_dtype)
    y = kernels.rms_norm(x, w, EPS, out_dtype=out_dtype)
    torch.autograd.grad(y, (x, w), dy)
    for backward in (False, True):
        aot = rms_norm_kernels.aot(x_dtype, n, backward, torch.float32, out_dtype)
        launched = seen[aot.jit_fn]
        assert {key: launched[key] for key in ("BLOCK_R", "BLOCK_N", "num_warps")} == \
            {"BLOCK_R": aot.constexprs["BLOCK_R"], "BLOCK_N": aot.constexprs["BLOCK_N"],
             "num_warps": aot.options["num_warps"]}


@pytest.mark.parametrize("x_dtype, out_dtype", [(torch.bfloat16, None), (torch.float32, torch.bfloat16)], ids=str)
def test_the_eager_paths_give_the_custom_ops_bits(x_dtype, out_dtype):
    """The plain call and the eager autograd.Function (gradients) give what ``kernels::rms_norm`` and its
    registered backward give."""
    x, w, dy = _inputs((7, 3, 40), x_dtype, torch.float32, seed=19, y_dtype=out_dtype)
    y = kernels.rms_norm(x, w, EPS, out_dtype=out_dtype)
    y_op = torch.ops.kernels.rms_norm(x, w, EPS, out_dtype)[0]
    plain = kernels.rms_norm(x.detach(), w.detach(), EPS, out_dtype=out_dtype)
    assert y.dtype == y_op.dtype == plain.dtype == (out_dtype or x_dtype)
    assert torch.equal(y, y_op) and torch.equal(plain, y_op)
    grads, grads_op = torch.autograd.grad(y, (x, w), dy), torch.autograd.grad(y_op, (x, w), dy)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_op))



@pytest.mark.parametrize("x_dtype, out_dtype", [(torch.bfloat16, None), (torch.float32, torch.bfloat16)], ids=str)
def test_the_eager_backward_launches_with_the_forwards_plan(x_dtype, out_dtype, monkeypatch):
    """As cross_entropy's: the autograd.Function keeps the plan its forward ran, and its backward
    launches with it, looking no plan up by metadata; an fp32 dy reaches it in y's bf16 (autograd
    casts it), and the gradients are the custom op's bits."""
    x, w, dy = _inputs((7, 3, 40), x_dtype, torch.float32, seed=23, y_dtype=torch.float32)
    want = torch.autograd.grad(torch.ops.kernels.rms_norm(x, w, EPS, out_dtype)[0], (x, w), dy)
    y = kernels.rms_norm(x, w, EPS, out_dtype=out_dtype)

    def looked_up(*args):
        raise AssertionError("the eager backward looked a plan up")
    monkeypatch.setattr(norm_ops, "_backward_impl", looked_up)
    got = torch.autograd.grad(y, (x, w), dy)
    assert y.dtype == torch.bfloat16 and all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want))

@pytest.mark.gpu
@pytest.mark.parametrize("x_dtype, w_dtype, out_dtype", [
    (torch.float32, torch.float32, torch.bfloat16), (torch.float32, torch.float32, None),
    (torch.bfloat16, torch.float32, None), (torch.bfloat16, torch.bfloat16, None)], ids=str)
@pytest.mark.parametrize("n", [1024, 2048])
def test_on_this_gpu_a_training_steps_norm_matches_float64(n, x_dtype, w_dtype, out_dtype):
    """The GPU presets' widths at 4096 rows on the real backend, within the CPU's bounds: the
    backward runs all its programs, each over several row blocks, and the fixed-order sum of
    their partials (fp32 x and weight, bf16 y: the step's residual stream under autocast)."""
    device = kernels.backend.current().device
    x, w, dy = (t.detach().to(device) for t in _inputs((2, 2048, n), x_dtype, w_dtype, seed=n, y_dtype=out_dtype))
    _check(x.requires_grad_(), w.requires_grad_(), dy, out_dtype=out_dtype)
