"""SwiGLU's forward kernel over sorted rows (:mod:`kernels.moe.layer_ladder.swiglu_forward`)
against float64, with the expert-parallel FP8 owner's device-side row bound, on empty
shapes, with bad inputs, and against the backward kernel's σ(g)."""
from __future__ import annotations

import pytest
import torch

from kernels.moe.layer_ladder import spec as moe_spec
from kernels.moe.layer_ladder.swiglu_backward import swiglu_backward
from kernels.moe.layer_ladder.swiglu_forward import swiglu_forward
from kernels.moe.layer_ladder.swiglu_rows import BLOCK_H, BLOCK_R
from kernels.outputs import poisoned_outputs
from swiglu_float64 import close


def _inputs(rows, hidden, dtype, seed):
    """g as a view of a wider buffer (row stride hidden + 3, as a view may come), u contiguous."""
    gen = torch.Generator().manual_seed(seed)
    g = (torch.randn(rows, hidden + 3, generator=gen) * 3).to(dtype)[:, :hidden]
    u = (torch.randn(rows, hidden, generator=gen) * 2).to(dtype)
    return g, u


def _exact(g, u):
    g, u = g.double(), u.double()
    return torch.nn.functional.silu(g) * u


def _bound(end: int) -> torch.Tensor:
    return torch.full((1,), end, dtype=torch.int32)


@pytest.mark.parametrize("bounded", [False, True], ids=["rows_end absent", "rows_end given"])
@pytest.mark.parametrize("dtype", moe_spec.DTYPES, ids=str)
@pytest.mark.parametrize("rows, hidden", [(37, 33), (BLOCK_R + 3, 2 * BLOCK_H + 5), (1, BLOCK_H - 1)])
def test_matches_float64_rounded_once(rows, hidden, dtype, bounded):
    """h within one rounding to the dtype of the float64 value (float32: a few units, as the
    backward's test allows, for sigmoid's exp); rows_end at R bounds nothing."""
    g, u = _inputs(rows, hidden, dtype, seed=rows + hidden)
    with poisoned_outputs():
        h = swiglu_forward(g, u, rows_end=_bound(rows) if bounded else None)
    assert h.is_contiguous()
    close(h, _exact(g, u), dtype)


@pytest.mark.parametrize("end", [0, 13, BLOCK_R + 5, 40])
def test_rows_past_rows_end_read_nothing_and_get_zeros(end):
    """The FP8 expert-parallel owner's capacity padding: its g and u rows hold NaN here
    (unwritten GEMM outputs), and its h is 0; the rows before the bound are the unbounded
    call's bits."""
    g, u = _inputs(40, 2 * BLOCK_H + 5, torch.bfloat16, seed=end)
    want = swiglu_forward(g[:end], u[:end])
    g[end:], u[end:] = float("nan"), float("nan")
    with poisoned_outputs():
        h = swiglu_forward(g, u, rows_end=_bound(end))
    assert torch.equal(h[:end], want) and torch.equal(h[end:], torch.zeros_like(h[end:]))


@pytest.mark.parametrize("bounded", [False, True], ids=["rows_end absent", "rows_end given"])
def test_no_rows_and_no_columns(bounded):
    for rows, hidden in ((0, 33), (5, 0)):
        g, u = _inputs(rows, hidden, torch.float16, seed=1)
        with poisoned_outputs():
            h = swiglu_forward(g, u, rows_end=_bound(rows) if bounded else None)
        assert h.shape == (rows, hidden) and h.dtype == torch.float16


@pytest.mark.parametrize("dtype", moe_spec.DTYPES, ids=str)
def test_the_backward_takes_the_forwards_silu(dtype):
    """The backward recomputes σ(g) for ``du = dh·g·σ``: at dh = 1 that is the forward's
    silu(g) at u = 1, bit for bit, so the two kernels differentiate one function."""
    g, _ = _inputs(21, 70, dtype, seed=4)
    ones = torch.ones(21, 70, dtype=dtype)
    _, du, _, _ = swiglu_backward(ones, g, ones, ones, None, swiglu=True, dw_rows=False, weighted_h=False)
    assert torch.equal(swiglu_forward(g, ones), du)


def test_bad_inputs_get_clear_errors():
    g, u = _inputs(6, 8, torch.bfloat16, seed=2)
    with pytest.raises(ValueError, match=r"u has shape \(5, 8\); it must be g's \(6, 8\)"):
        swiglu_forward(g, u[:5])
    with pytest.raises(TypeError, match="dtypes differ"):
        swiglu_forward(g, u.float())
    with pytest.raises(ValueError, match="u must have unit column stride"):
        swiglu_forward(g, u.t().contiguous().t())
    with pytest.raises(TypeError, match="this kernel takes"):
        swiglu_forward(g.double(), u.double())
    with pytest.raises(ValueError, match="must be 2-D"):
        swiglu_forward(g[0], u[0])
    for rows_end in (torch.tensor([3]), torch.tensor([3, 4], dtype=torch.int32), 3):
        with pytest.raises(ValueError, match="rows_end must be an int32 tensor of one element"):
            swiglu_forward(g, u, rows_end=rows_end)
