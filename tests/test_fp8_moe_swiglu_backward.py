"""The FP8 MoE layers take SwiGLU with the forward kernel
(:func:`kernels.moe.layer_ladder.swiglu_forward.swiglu_forward`) and its derivative with the
fused rung's elementwise kernel (:func:`kernels.moe.layer_ladder.swiglu_backward.swiglu_backward`):
``kernels::swiglu`` (:mod:`kernels.moe.swiglu_op`, Float8MoE's SwiGLU) against float64, as a
custom op and with its errors; and over (T·k, hidden) no float32 tensor and no torch
elementwise pass in one forward and one backward of Float8MoE and of the expert-parallel
FP8 layer (its owner's path, on one gloo rank in this process, with capacity padding rows
whose gate, up and dX outputs the GEMMs leave unwritten). tests/test_ep_fp8.py holds the
two-rank layer's numerics to Float8MoE's."""
from __future__ import annotations

import pytest
import torch

import kernels
import kernels.fp8
from kernels.moe import ep_fp8_layer, swiglu_op
from kernels.moe.fp8_layer import Float8MoE
from kernels.moe.layer_ladder import spec as moe_spec
from kernels.moe.swiglu_op import swiglu
from kernels.outputs import poisoned_outputs
from rows_by_hidden import RowsByHidden
from swiglu_float64 import close, exact

FP8 = torch.float8_e4m3fn
DIM, HIDDEN, EXPERTS, TOP_K, TOKENS = 24, 40, 4, 2, 11   # HIDDEN unlike DIM: (T·k, hidden) is SwiGLU's alone
VIEWS = {"aten.detach", "aten.unsqueeze", "aten.view", "aten._unsafe_view", "aten.t", "aten.transpose"}
"""Ops that move no data."""
LAUNCH = {"aten.empty", "aten.full", "aten.new_empty", "aten.set_"}
"""A Triton launch's outputs (full of NaN under ``poisoned_outputs``) and, under the
interpreter, its host views of the arguments (an empty tensor set to the argument's storage:
no data moves; a GPU launch makes none)."""
WGRAD_PADDING = {"aten.constant_pad_nd"}
"""Blockwise's wgrad operands (h, dg, du) padded to a multiple of 16 tokens before their
quantization (:func:`kernels.moe.grouped_gemm_fp8.quantize.wgrad_operand`): the FP8 GEMM's
operand, in x's dtype, not SwiGLU's derivative."""
MERGE = {"aten.cat", "aten.index"}
"""The expert-parallel backward's merge of the chunks' kept g, u and h into the single-process
layer's row order (:mod:`kernels.moe.ep_layer`, as for the high-precision layer): a gather."""


@pytest.mark.parametrize("dtype", moe_spec.DTYPES, ids=str)
def test_swiglu_op_is_silu_times_u_and_its_gradient_the_kernels(dtype):
    """Forward: ``silu(g) * u`` within one rounding of float64 (torch's ``F.silu(g) * u``
    rounds twice: in 16 bits not within one); backward: dg and du within one rounding of the
    float64 derivative, for the GEMMs' contiguous rows and a strided g, with a gradient
    whose columns are not contiguous (a sum's expanded ones) made contiguous first."""
    gen = torch.Generator().manual_seed(7)
    g = (torch.randn(19, 140, generator=gen) * 2).to(dtype)
    g = torch.cat([g, g[:, :5]], dim=1)[:, :140].requires_grad_()     # row stride 145
    u = (torch.randn(19, 140, generator=gen) * 2).to(dtype).requires_grad_()
    dh = (torch.randn(19, 140, generator=gen) * 2).to(dtype)
    with poisoned_outputs():
        h = swiglu(g, u)
        h.backward(dh)
    close(h.detach(), torch.nn.functional.silu(g.detach().double()) * u.detach().double(), dtype)
    want_dg, want_du, _, _ = exact(dh, g.detach(), u.detach(), h.detach(), None)
    close(g.grad, want_dg, dtype)
    close(u.grad, want_du, dtype)
    g.grad = u.grad = None
    swiglu(g, u).sum().backward()                                         # dh strides (0, 0)
    want_dg, want_du, _, _ = exact(torch.ones_like(dh), g.detach(), u.detach(), h.detach(), None)
    close(g.grad, want_dg, dtype)
    close(u.grad, want_du, dtype)


def test_swiglu_op_passes_opcheck_and_refuses_bad_inputs():
    """Bad inputs: the forward kernel's checks (tests/test_moe_swiglu_forward.py has them all),
    before the custom op's dispatch, whose fake checks nothing."""
    g, u = (torch.randn(6, 33, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    torch.library.opcheck(torch.ops.kernels.swiglu.default, (g, u))
    with pytest.raises(ValueError, match=r"u has shape \(6, 32\); it must be g's \(6, 33\)"):
        swiglu(g, u[:, :32])
    with pytest.raises(TypeError, match="this kernel takes"):
        swiglu(g.double(), u.double())


def _check_rows(seen: RowsByHidden, allowed: set[str]) -> None:
    """Nothing over (rows, hidden) but the custom ops, views and the ``allowed`` torch ops, no
    float32 tensor of that shape among any op's outputs."""
    assert seen.float32_outputs() == [], seen.ops
    assert seen.torch_ops() <= VIEWS | allowed, seen.torch_ops() - VIEWS - allowed


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise", "tensorwise", "delayed", "mxfp8"])
def test_float8moe_forward_makes_no_float32_rows_by_hidden_and_no_torch_pass_over_them(recipe, monkeypatch):
    """One bf16 forward of Float8MoE: over (T·k, hidden) the FP8 grouped GEMMs and their
    quantizations (custom ops, delayed's amax among them), SwiGLU's forward kernel (its
    output and the interpreter's host views) and views; no silu or mul. A dispatch mode
    sees a custom op as one op, so ``kernels::swiglu`` runs its implementation in its place
    here (no gradient: that is the op's autograd), for the mode to see what it launches."""
    torch.manual_seed(0)
    layer = Float8MoE.from_moe(kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K).to(torch.bfloat16), recipe, FP8)
    x = torch.randn(TOKENS, DIM, dtype=torch.bfloat16)
    monkeypatch.setattr(swiglu_op, "_swiglu", swiglu_op._forward_impl)
    with torch.no_grad(), poisoned_outputs(), RowsByHidden((TOKENS * TOP_K, HIDDEN)) as seen:
        out = layer(x)
    _check_rows(seen, LAUNCH)
    assert out.isfinite().all()


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise", "tensorwise", "delayed", "mxfp8"])
def test_float8moe_backward_makes_no_float32_rows_by_hidden_and_no_torch_pass_over_them(recipe):
    """One bf16 backward of Float8MoE: over (T·k, hidden) the FP8 grouped GEMMs and their
    quantizations (custom ops), SwiGLU's derivative as ``kernels::swiglu_backward`` (one
    kernel), views, and under blockwise its wgrad operands' padding."""
    torch.manual_seed(0)
    layer = Float8MoE.from_moe(kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K).to(torch.bfloat16), recipe, FP8)
    x = torch.randn(TOKENS, DIM, dtype=torch.bfloat16, requires_grad=True)
    out = layer(x)
    with RowsByHidden((TOKENS * TOP_K, HIDDEN)) as seen:
        out.backward(torch.randn_like(out))
    assert "kernels.swiglu_backward" in [op for op, _ in seen.ops]
    _check_rows(seen, WGRAD_PADDING if recipe == "blockwise" else set())
    assert all(p.grad.isfinite().all() for p in (x, layer.gate, layer.up, layer.down))


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise", "delayed"])
def test_ep_owner_makes_no_float32_rows_by_hidden_and_no_torch_pass_over_them(recipe, one_rank, monkeypatch):
    """One bf16 forward and backward of the expert-parallel FP8 layer on one rank, with 5 rows
    of capacity padding at its owner and every kernel output poisoned (NaN): over the
    owner's (rows, hidden) in the forward the FP8 GEMMs' custom ops, the swiglu_forward
    launch (its output and host views) and views (no silu, mul or zeroing of the padding);
    in the backward the FP8 GEMMs' custom ops, the swiglu_backward launch, views, blockwise's
    wgrad padding and the merge of the kept activations. Output and every gradient finite,
    so no padding row's unwritten g, u or dX reached SwiGLU, its derivative or an amax."""
    torch.manual_seed(0)
    ep = kernels.MoE.from_full(kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K).to(torch.bfloat16), one_rank)
    ep.ep_capacity = TOKENS * TOP_K + 5
    model = kernels.fp8.convert(torch.nn.Sequential(ep), recipe, fp8_dtype=FP8)
    calls, kernel = [], ep_fp8_layer.swiglu_backward
    monkeypatch.setattr(ep_fp8_layer, "swiglu_backward", lambda *a, **k: calls.append(k) or kernel(*a, **k))
    forwards, forward_kernel = [], ep_fp8_layer.swiglu_forward
    monkeypatch.setattr(ep_fp8_layer, "swiglu_forward",
                        lambda *a, **k: forwards.append(k) or forward_kernel(*a, **k))
    x = torch.randn(TOKENS, DIM, dtype=torch.bfloat16, requires_grad=True)
    with poisoned_outputs():
        with RowsByHidden((ep.ep_capacity, HIDDEN)) as forward:
            out = model(x)
        with RowsByHidden((ep.ep_capacity, HIDDEN)) as seen:
            out.backward(torch.randn_like(out))
    assert [int(k["rows_end"]) for k in forwards] == [TOKENS * TOP_K]
    assert [(k["swiglu"], k["dw_rows"], k["weighted_h"], int(k["rows_end"])) for k in calls] == \
        [(True, False, False, TOKENS * TOP_K)]
    _check_rows(forward, LAUNCH)
    assert out.isfinite().all()
    _check_rows(seen, LAUNCH | MERGE | (WGRAD_PADDING if recipe == "blockwise" else set()))
    assert all(p.grad.isfinite().all() for p in (x, model[0].gate, model[0].up, model[0].down))
