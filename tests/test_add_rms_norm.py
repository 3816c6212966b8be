"""``kernels.add_rms_norm`` (:mod:`kernels.norm`): the residual add fused into RMSNorm, against
the float64 formula ``h = x + residual; y = h·rsqrt(mean(h²) + eps)·w``, forward and the
gradients of x, the residual and the weight, with h used downstream (its own gradient comes
in) or not (the final norm's); fp32 x beside a residual of each float dtype, odd and tiny N,
0 and 1 rows, outputs poisoned; the unfused 16-bit-x path; its errors; its custom ops
(opcheck, ``torch.compile``); its device ops.

Tolerances (:mod:`test_rms_norm`'s): h is torch's ``x + residual``, bit for bit (both add in fp32
and round once); y rounded once to its dtype; the fp32 gradient of x, h's (dh plus the norm's
dx), within ``1e-5·(|ref| + terms)``, terms the largest ``|rstd·dy·w|`` of all rows plus the
element's ``|dh|``; the residual's gradient, that sum rounded once more to its dtype, within half
a unit in its last place of the float64 value plus the fp32 sum's bound."""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels.norm import ops as norm_ops
from kernels.outputs import poisoned_outputs
from norm_tolerances import assert_close, half_ulp
from workbench.harness.device_ops import device_ops

EPS = 1e-6
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _inputs(shape, residual_dtype, w_dtype, y_dtype, seed, x_dtype=torch.float32):
    """Fresh x and residual (x scaled away from 1, so a missing rstd shows; the residual of
    its own scale, so a skipped add shows), a weight around 1, all with requires_grad; dy of y's
    dtype and dh (h's gradient from elsewhere) of h's."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=gen) * 3 + 0.5).to(x_dtype).requires_grad_()
    residual = (torch.randn(shape, generator=gen) * 2 - 1).to(residual_dtype).requires_grad_()
    w = (torch.randn(shape[-1], generator=gen) * 0.5 + 1).to(w_dtype).requires_grad_()
    dy = torch.randn(shape, generator=gen).to(y_dtype)
    dh = torch.randn(shape, generator=gen).to(torch.promote_types(x_dtype, residual_dtype))
    return x, residual, w, dy, dh


def _exact(x, residual, w, dy, dh):
    """y and the gradients of x, the residual and the weight in float64 (``dh`` None: h used
    nowhere else), and the magnitudes the gradients sum (the module's docstring)."""
    x64, r64, w64 = (t.detach().double().requires_grad_() for t in (x, residual, w))
    h = x64 + r64
    rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    y = h * rstd * w64
    outputs, grads = (y,), (dy.double(),)
    if dh is not None:
        outputs, grads = (h, y), (dh.double(), dy.double())
    dx, dr, dw = torch.autograd.grad(outputs, (x64, r64, w64), grads)
    norm_terms = (rstd * dy.double() * w64).detach().abs()
    dx_terms = (norm_terms.max() if norm_terms.numel() else 0) + (0 if dh is None else dh.double().abs())
    dw_terms = (dy.double() * h * rstd).detach().abs().flatten(0, -2).sum(0)
    return y.detach(), dx, dr, dx_terms, (dw, dw_terms)


def _assert_rounded_sum(got, want, terms):
    """``got``, an fp32 sum of terms of magnitude ``terms`` rounded once to its 16-bit dtype,
    within half a unit in its last place of ``want`` plus the fp32 sum's bound."""
    bound = half_ulp(want, got.dtype) + 1e-5 * (want.abs() + terms)
    err = (got.double() - want).abs()
    bad = ~(err <= bound)
    assert not bad.any(), f"{int(bad.sum())} of {got.numel()} off, worst {err.max().item():.3g}"


def _check(x, residual, w, dy, dh, out_dtype):
    """add_rms_norm's h, y and gradients (h's own gradient ``dh``, or h used nowhere else where it
    is None), outputs poisoned, against :func:`_exact`."""
    with poisoned_outputs():
        h, y = kernels.add_rms_norm(x, residual, w, EPS, out_dtype=out_dtype)
        if dh is None:
            dx, dr, dw = torch.autograd.grad(y, (x, residual, w), dy)
        else:
            dx, dr, dw = torch.autograd.grad((h, y), (x, residual, w), (dh, dy))
    want_y, want_dx, want_dr, terms, want_dw = _exact(x, residual, w, dy, dh)
    assert h.dtype == torch.float32 and torch.equal(h, x.detach() + residual.detach())
    assert_close(y, want_y, out_dtype)
    assert_close(dx, want_dx, torch.float32, terms)
    if residual.dtype == torch.float32:
        assert_close(dr, want_dr, torch.float32, terms)
    else:
        assert dr.dtype == residual.dtype
        _assert_rounded_sum(dr, want_dr, terms)
    assert_close(dw, want_dw[0], w.dtype, want_dw[1])


@pytest.mark.parametrize("h_used", [True, False], ids=["h_used", "h_unused"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("residual_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(37, 33), (2, 5, 100)], ids=str)
def test_h_y_and_gradients_match_float64(shape, residual_dtype, out_dtype, h_used):
    """fp32 x (the residual stream) beside a residual of each float dtype (bf16: a block's branch
    under autocast), y in bf16 or fp32; the backward with dh (a block's norms) or without (the
    final norm's)."""
    x, residual, w, dy, dh = _inputs(shape, residual_dtype, torch.float32, out_dtype, seed=sum(shape))
    _check(x, residual, w, dy, dh if h_used else None, out_dtype)


@pytest.mark.parametrize("residual_dtype", DTYPES, ids=str)
def test_a_16_bit_weight(residual_dtype):
    x, residual, w, dy, dh = _inputs((9, 40), residual_dtype, torch.bfloat16, torch.bfloat16, seed=3)
    _check(x, residual, w, dy, dh, torch.bfloat16)


@pytest.mark.parametrize("shape", [(0, 33), (1, 33), (1, 1, 33), (4, 1), (3, 0), (0, 0)], ids=str)
def test_empty_and_size_one_inputs(shape):
    """No rows, one row, N = 1 and N = 0 (y empty, as torch's formula gives)."""
    x, residual, w, dy, dh = _inputs(shape, torch.bfloat16, torch.float32, torch.bfloat16, seed=4)
    _check(x, residual, w, dy, dh, torch.bfloat16)


def test_rows_of_wider_buffers_and_transposed_tensors():
    """x and the residual slices of wider buffers' columns (row strides 40 and 50, read in place),
    then a transposed residual and dh (copied); the float64 bounds still hold."""
    x, residual, w, dy, dh = _inputs((21, 33), torch.bfloat16, torch.float32, torch.bfloat16, seed=14)
    wide_x = torch.zeros(21, 40).copy_(torch.nn.functional.pad(x.detach(), (0, 7)))
    wide_r = torch.zeros(21, 50, dtype=torch.bfloat16).copy_(torch.nn.functional.pad(residual.detach(), (0, 17)))
    x_view, r_view = wide_x[:, :33].requires_grad_(), wide_r[:, :33].requires_grad_()
    assert x_view.stride() == (40, 1) and r_view.stride() == (50, 1)
    _check(x_view, r_view, w, dy, dh, torch.bfloat16)
    r_t = residual.detach().t().contiguous().t().requires_grad_()
    dh_t = dh.t().contiguous().t()
    assert r_t.stride() == (1, 21) and dh_t.stride() == (1, 21)
    _check(x, r_t, w, dy, dh_t, torch.bfloat16)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, None], ids=str)
@pytest.mark.parametrize("x_dtype, residual_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32),
                                                     (torch.bfloat16, torch.float16)], ids=str)
def test_16_bit_x_adds_with_torch_then_norms(x_dtype, residual_dtype, out_dtype):
    """16-bit x: h is torch's ``x + residual`` (rounded to the promoted dtype, which the norm
    then reads), y ``kernels.rms_norm`` of it (by default in h's dtype), and the gradients
    autograd's of the two: bit for bit, on each path of the call (with gradients, without, and
    through the custom op under a function mode); y within a rounding of float64's norm of that h."""
    x, residual, w, dy, dh = _inputs((7, 33), residual_dtype, torch.float32, torch.bfloat16, seed=5, x_dtype=x_dtype)
    with poisoned_outputs():
        h, y = kernels.add_rms_norm(x, residual, w, EPS, out_dtype=out_dtype)
        grads = torch.autograd.grad((h, y), (x, residual, w), (dh, dy.to(y.dtype)))
        with torch.no_grad():
            plain = kernels.add_rms_norm(x, residual, w, EPS, out_dtype=out_dtype)
        with torch.device("cpu"):   # a torch-function mode: the custom op's path
            watched = kernels.add_rms_norm(x, residual, w, EPS, out_dtype=out_dtype)
    want_h = x + residual
    want_y = kernels.rms_norm(want_h, w, EPS, out_dtype=out_dtype)
    want = torch.autograd.grad((want_h, want_y), (x, residual, w), (dh, dy.to(y.dtype)))
    assert h.dtype == want_h.dtype == torch.promote_types(x_dtype, residual_dtype)
    assert y.dtype == want_y.dtype == (out_dtype or h.dtype)
    for got_h, got_y in ((h, y), plain, watched):
        assert torch.equal(got_h, want_h) and got_y.dtype == want_y.dtype and torch.equal(got_y, want_y)
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(grads, want))
    h64 = h.detach().double()
    assert_close(y, h64 * torch.rsqrt(h64.pow(2).mean(-1, keepdim=True) + EPS) * w.detach().double(), y.dtype)


def test_bad_inputs_get_clear_errors():
    x, residual, w, _, _ = _inputs((4, 8), torch.bfloat16, torch.float32, torch.bfloat16, seed=6)
    cases = [
        ((x, residual[:, :7], w, EPS), ValueError, r"residual has shape \(4, 7\); it must have x's \(4, 8\)"),
        ((x, residual[:1], w, EPS), ValueError, r"residual has shape \(1, 8\)"),
        ((x, residual.int(), w, EPS), TypeError, "residual has dtype int32; this kernel takes"),
        ((x, residual.double(), w, EPS), TypeError, "residual has dtype float64"),
        ((x, residual.to("meta"), w, EPS), ValueError, "residual is on meta"),
        ((x, "residual", w, EPS), TypeError, "residual must be a torch.Tensor"),
        ((x.double(), residual, w, EPS), TypeError, "x has dtype float64"),
        ((x, residual, w[:7], EPS), ValueError, r"weight has shape \(7,\)"),
        ((x, residual, w, -1.0), ValueError, "eps must be a float >= 0"),
    ]
    for args, error, message in cases:
        with pytest.raises(error, match=message):
            kernels.add_rms_norm(*args)
    with pytest.raises(TypeError, match="out_dtype must be one of"):
        kernels.add_rms_norm(x, residual, w, EPS, out_dtype=torch.float64)
    with pytest.raises(TypeError, match=r"kernels::add_rms_norm adds into float32 x only, got torch.bfloat16"):
        torch.ops.kernels.add_rms_norm(x.detach().bfloat16(), residual.detach(), w.detach(), EPS)


def test_the_backward_op_refuses_a_dh_it_cannot_take():
    """dh of another shape or dtype than x's (h's), and a residual dtype the kernel does not write."""
    x, residual, w, dy, dh = (t.detach() for t in _inputs((4, 8), torch.bfloat16, torch.float32, torch.bfloat16,
                                                          seed=7))
    h, _, rstd = torch.ops.kernels.add_rms_norm(x, residual, w, EPS, torch.bfloat16)
    for bad in (dh[:, :7], dh.bfloat16()):
        with pytest.raises(ValueError, match=r"dh must have x's shape \(4, 8\), dtype and device"):
            torch.ops.kernels.rms_norm_backward(dy, h, w, rstd, bad, torch.bfloat16)
    with pytest.raises(TypeError, match="residual_dtype must be one of"):
        torch.ops.kernels.rms_norm_backward(dy, h, w, rstd, dh, torch.int8)


@pytest.mark.parametrize("residual_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_the_custom_ops_pass_opcheck(residual_dtype):
    """The fakes' dtypes too: h fp32, y in out_dtype; the backward's db only where the residual's
    dtype is not x's."""
    x, residual, w, dy, dh = _inputs((3, 5, 20), residual_dtype, torch.float32, torch.bfloat16, seed=8)
    torch.library.opcheck(torch.ops.kernels.add_rms_norm.default, (x, residual, w, EPS, torch.bfloat16))
    h, _, rstd = torch.ops.kernels.add_rms_norm(x.detach(), residual.detach(), w.detach(), EPS, torch.bfloat16)
    for grad in (dh, None):
        torch.library.opcheck(torch.ops.kernels.rms_norm_backward.default, (dy, h, w.detach(), rstd, grad, residual_dtype))


@pytest.mark.parametrize("h_used", [True, False], ids=["h_used", "h_unused"])
def test_torch_compile_keeps_the_ops_in_one_graph(h_used):
    """One graph without a break, holding kernels::add_rms_norm, the eager bits and gradients."""
    def loss(x, residual, w):
        h, y = kernels.add_rms_norm(x, residual, w, EPS, out_dtype=torch.bfloat16)
        return (y.float() * 2).sum() + ((h * h).sum() if h_used else 0)

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    x, residual, w, _, _ = _inputs((2, 7, 48), torch.bfloat16, torch.float32, torch.bfloat16, seed=9)
    compiled = torch.compile(loss, fullgraph=True, backend=backend)
    value = compiled(x, residual, w)
    (graph,) = graphs
    assert torch.ops.kernels.add_rms_norm.default in {node.target for node in graph.graph.nodes}
    aot = torch.compile(loss, fullgraph=True, backend="aot_eager")
    value, want_value = aot(x, residual, w), loss(x, residual, w)
    assert torch.equal(value, want_value)
    got = torch.autograd.grad(value, (x, residual, w))
    want = torch.autograd.grad(want_value, (x, residual, w))
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("residual_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_the_eager_paths_give_the_custom_ops_bits(residual_dtype):
    """The plain call and the eager autograd.Function give what ``kernels::add_rms_norm`` and its
    registered backward give, h used and not."""
    x, residual, w, dy, dh = _inputs((7, 3, 40), residual_dtype, torch.float32, torch.bfloat16, seed=10)
    h, y = kernels.add_rms_norm(x, residual, w, EPS, out_dtype=torch.bfloat16)
    h_op, y_op, _ = torch.ops.kernels.add_rms_norm(x, residual, w, EPS, torch.bfloat16)
    plain = kernels.add_rms_norm(x.detach(), residual.detach(), w.detach(), EPS, out_dtype=torch.bfloat16)
    assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip((h, y), (h_op, y_op), plain))
    for outputs, outputs_op, grads in [((h, y), (h_op, y_op), (dh, dy)), ((y,), (y_op,), (dy,))]:
        got = torch.autograd.grad(outputs, (x, residual, w), grads, retain_graph=True)
        want = torch.autograd.grad(outputs_op, (x, residual, w), grads, retain_graph=True)
        assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want))


def test_h_alone_passes_its_gradient_on():
    """y used nowhere: h's gradient is x's and the residual's (rounded to its dtype), as the add's
    would be, and the weight gets none; no launch."""
    x, residual, w, _, dh = _inputs((5, 24), torch.bfloat16, torch.float32, torch.bfloat16, seed=11)
    h, _ = kernels.add_rms_norm(x, residual, w, EPS)
    counted = device_ops(lambda: torch.autograd.grad(h, (x, residual, w), dh, allow_unused=True, retain_graph=True))
    dx, dr, dw = torch.autograd.grad(h, (x, residual, w), dh, allow_unused=True)
    assert torch.equal(dx, dh) and torch.equal(dr, dh.bfloat16()) and dw is None
    assert counted.triton == 0


@pytest.mark.parametrize("residual_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_one_launch_forward_and_two_backward_where_torch_runs_an_add_and_its_gradients_more(residual_dtype):
    """fp32 x, the residual in bf16 (a block's branch under autocast) or fp32, bf16 y: 1 launch
    forward, 2 backward (the norm's and its weight's sum), with h's gradient from elsewhere or
    without, and no torch op. The add and rms_norm apart: the add forward, and backward the sum
    of h's two gradients and the bf16 residual's cast."""
    x, residual, w, dy, dh = _inputs((64, 96), residual_dtype, torch.float32, torch.bfloat16, seed=12)

    def counts(add_norm, used):
        forward = device_ops(lambda: add_norm(x, residual))
        h, y = add_norm(x, residual)
        outputs, grads = ((h, y), (dh, dy)) if used else ((y,), (dy,))
        backward = device_ops(lambda: torch.autograd.grad(outputs, (x, residual, w), grads, retain_graph=True))
        return forward.triton, forward.total, backward.triton, backward.total

    def fused(x, residual):
        return kernels.add_rms_norm(x, residual, w, EPS, out_dtype=torch.bfloat16)

    def apart(x, residual):
        h = x + residual
        return h, kernels.rms_norm(h, w, EPS, out_dtype=torch.bfloat16)

    for used in (True, False):
        assert counts(fused, used) == (1, 1, 2, 2), used
    cast = residual_dtype != torch.float32
    assert counts(apart, True) == (1, 2, 2, 3 + cast)
    assert counts(apart, False) == (1, 2, 2, 2 + cast)


def test_a_repeated_call_reuses_its_plan(monkeypatch):
    """Per kind of input; the backward launches with the forward's plan (no lookup)."""
    x, residual, w, dy, dh = _inputs((5, 24), torch.bfloat16, torch.float32, torch.bfloat16, seed=13)
    kernels.add_rms_norm(x, residual, w, EPS)

    def rebuilt(*args):
        raise AssertionError("a plan was built or looked up again")
    monkeypatch.setattr(norm_ops, "_Plan", rebuilt)
    monkeypatch.setattr(norm_ops, "_backward_impl", rebuilt)
    h, y = kernels.add_rms_norm(x, residual, w, EPS)
    torch.autograd.grad((h, y), (x, residual, w), (dh, dy.float()))
    with pytest.raises(AssertionError, match="again"):
        kernels.add_rms_norm(x, residual, w, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("residual_dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("n", [1024, 2048])
def test_on_this_gpu_a_blocks_add_and_norm_match_float64(n, residual_dtype):
    """The GPU presets' widths at 4096 rows on the real backend, within the CPU's bounds: fp32 x
    and weight, bf16 y, the residual a bf16 branch (or fp32), h's own gradient in."""
    device = kernels.backend.current().device
    x, residual, w, dy, dh = (t.detach().to(device) for t in _inputs((2, 2048, n), residual_dtype, torch.float32,
                                                                     torch.bfloat16, seed=n))
    _check(x.requires_grad_(), residual.requires_grad_(), w.requires_grad_(), dy, dh, torch.bfloat16)
