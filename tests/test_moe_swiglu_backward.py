"""The fused MoE rung's elementwise backward kernel (:mod:`kernels.moe.layer_ladder.swiglu_backward`)
against a float64 evaluation of the formulas the torch passes computed before it, and the one
backward that uses it: no float32 (T·k, hidden) tensor and no torch op over (T·k, hidden)."""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels.moe.layer_ladder import spec as moe_spec
from kernels.moe.layer_ladder import v3_fused
from kernels.moe.layer_ladder.swiglu_backward import swiglu_backward
from kernels.moe.layer_ladder.swiglu_rows import BLOCK_H, BLOCK_R
from kernels.moe.layer_ladder.v3_backward import fused_backward
from kernels.outputs import poisoned_outputs
from rounding_units import UNIT
from rows_by_hidden import RowsByHidden
from swiglu_float64 import close, exact


def _inputs(rows, hidden, dtype, weighted, seed):
    gen = torch.Generator().manual_seed(seed)

    def draw():
        return (torch.randn(rows, hidden, generator=gen) * 2).to(dtype)
    dh, g, u, h = draw(), draw(), draw(), draw()
    # a strided g (rows of a wider buffer) and w (a column of a (R, 2) one), as views may come
    g = torch.cat([g, draw()[:, :3]], dim=1)[:, :hidden]
    w = torch.rand(rows, 2, generator=gen)[:, :1] if weighted else None
    return dh, g, u, h, w


@pytest.mark.parametrize("weighted", [True, False], ids=["w", "weight 1"])
@pytest.mark.parametrize("dtype", moe_spec.DTYPES, ids=str)
@pytest.mark.parametrize("rows, hidden", [(37, 33), (BLOCK_R + 3, 2 * BLOCK_H + 5), (1, BLOCK_H - 1)])
def test_matches_the_float64_formulas(rows, hidden, dtype, weighted):
    dh, g, u, h, w = _inputs(rows, hidden, dtype, weighted, seed=rows + hidden)
    with poisoned_outputs():
        dg, du, dw_rows, hw = swiglu_backward(dh, g, u, h, w, swiglu=True, dw_rows=True, weighted_h=weighted)
    want_dg, want_du, want_dw, want_hw = exact(dh, g, u, h, w)
    close(dg, want_dg, dtype)
    close(du, want_du, dtype)
    # an fp32 sum of `hidden` fp32 products, in any order: within (hidden + 1) units of Σ|h·dh|
    bound = (hidden + 1) * UNIT[torch.float32] * (h.double() * dh.double()).abs().sum(dim=1)
    assert dw_rows.dtype == torch.float32 and ((dw_rows.double() - want_dw).abs() <= bound).all()
    if weighted:
        close(hw, want_hw, dtype)
    else:
        assert hw is None


@pytest.mark.parametrize("flags", [(True, False, False), (False, True, False), (False, False, True),
                                   (True, True, False), (False, True, True)],
                         ids=["swiglu", "dw_rows", "weighted_h", "swiglu+dw_rows", "dw_rows+weighted_h"])
def test_each_output_alone_is_the_same_bits_and_unasked_ones_are_none(flags):
    """What sorted_backward asks depends on the gradients needed; a gradient must not change
    with the others asked (tests/test_moe_fused_backward.py checks that end to end)."""
    dh, g, u, h, w = _inputs(21, 70, torch.bfloat16, True, seed=5)
    every = swiglu_backward(dh, g, u, h, w, swiglu=True, dw_rows=True, weighted_h=True)
    swiglu, dw_rows, weighted_h = flags
    # what a flag does not read may be absent: dh for h·w alone, g and u without swiglu
    with poisoned_outputs():
        got = swiglu_backward(dh if swiglu or dw_rows else None, g if swiglu else None,
                              u if swiglu else None, h, w, swiglu=swiglu, dw_rows=dw_rows, weighted_h=weighted_h)
    for asked, a, b in zip((swiglu, swiglu, dw_rows, weighted_h), got, every):
        assert torch.equal(a, b) if asked else a is None


@pytest.mark.parametrize("end", [0, 13, BLOCK_R + 5, 40])
def test_rows_past_rows_end_read_nothing_and_get_zeros(end):
    """The FP8 expert-parallel owner's capacity padding: its rows hold NaN here (an unwritten
    dX result), and every output of theirs is 0; the rows before the bound are the unbounded
    call's bits."""
    dh, g, u, h, w = _inputs(40, 70, torch.bfloat16, True, seed=end)
    flags = dict(swiglu=True, dw_rows=True, weighted_h=True)
    want = swiglu_backward(dh[:end], g[:end], u[:end], h[:end], w[:end], **flags)
    for t in (dh, g, u, h, w):
        t[end:] = float("nan")
    with poisoned_outputs():
        got = swiglu_backward(dh, g, u, h, w, **flags, rows_end=torch.full((1,), end, dtype=torch.int32))
    for a, b in zip(got, want):
        assert torch.equal(a[:end], b) and not a[end:].any()


def test_no_rows_and_no_columns():
    for rows, hidden in ((0, 33), (5, 0)):
        dh, g, u, h, w = _inputs(rows, hidden, torch.float16, True, seed=1)
        with poisoned_outputs():
            dg, du, dw_rows, hw = swiglu_backward(dh, g, u, h, w, swiglu=True, dw_rows=True, weighted_h=True)
        assert dg.shape == du.shape == hw.shape == (rows, hidden)
        assert torch.equal(dw_rows, torch.zeros(rows))


def test_bad_inputs_get_clear_errors():
    dh, g, u, h, w = _inputs(6, 8, torch.bfloat16, True, seed=2)
    flags = dict(swiglu=True, dw_rows=True, weighted_h=True)
    with pytest.raises(ValueError, match="g is None"):
        swiglu_backward(dh, None, u, h, w, **flags)
    with pytest.raises(ValueError, match="u has shape"):
        swiglu_backward(dh, g, u[:5], h, w, **flags)
    with pytest.raises(TypeError, match="dtypes differ"):
        swiglu_backward(dh.float(), g, u, h, w, **flags)
    with pytest.raises(ValueError, match="unit column stride"):
        swiglu_backward(dh, g, u.t().contiguous().t(), h, w, **flags)
    with pytest.raises(ValueError, match="float32 tensor of one value per row"):
        swiglu_backward(dh, g, u, h, w.to(torch.bfloat16), **flags)
    with pytest.raises(ValueError, match="w is None"):
        swiglu_backward(dh, g, u, h, None, **flags)
    for rows_end in (torch.tensor([3]), torch.tensor([3, 4], dtype=torch.int32), 3):
        with pytest.raises(ValueError, match="rows_end must be an int32 tensor of one element"):
            swiglu_backward(dh, g, u, h, w, **flags, rows_end=rows_end)
    with pytest.raises(TypeError, match="this kernel takes"):
        swiglu_backward(None, None, None, h.to(torch.float64), None, swiglu=False, dw_rows=False, weighted_h=False)


def test_backward_makes_no_float32_rows_by_hidden_and_no_torch_pass_over_them():
    """One v3 backward (every gradient, bf16; the body, since the mode does not see into the
    custom ops): over (T·k, hidden) only the grouped GEMMs (the kernels namespace's custom
    ops, dX's result dh and the dW launches' operands), allocations of bf16 outputs, and the
    interpreter's host views of a kernel's arguments (an empty tensor set to the argument's
    storage: no data moves; a GPU launch makes none)."""
    shape = (45, 48, 33, 8, 2, 1)
    x, router, gate, up, down, top_k = moe_spec.make_inputs(shape, torch.bfloat16, seed=3)
    weights, ids = kernels.moe.route(x.float() @ router.float().t(), top_k)
    _, g, u, h, slots, offsets = v3_fused.fused_forward(x, weights, ids, gate, up, down, True)
    grad = torch.randn(x.shape[0], shape[1]).to(torch.bfloat16)
    with RowsByHidden((shape[0] * top_k, shape[2])) as seen:
        fused_backward(grad, x, weights, gate, up, down, g, u, h, slots, offsets, [True] * 5)
    assert seen.ops and not [op for op, outs in seen.ops if any(d == torch.float32 for d, _ in outs)], seen.ops
    assert seen.torch_ops() <= {"aten.empty", "aten.new_empty", "aten.set_"}, seen.ops
