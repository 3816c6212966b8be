"""Delayed scaling of a Float8Linear's output gradient dy: its amax history, written by the
backward (kernels.fp8.recipes.delayed), the scale the backward casts dy with, saturation,
eval mode, torch.compile and old checkpoints."""
from __future__ import annotations

import copy

import pytest
import torch

import kernels
from kernels.fp8 import Float8Linear, convert
from kernels.gemm_fp8.formats import quantize_fp8
from kernels.fp8.recipes.delayed import HISTORY, saturates_above

E5M2 = {torch.float8_e4m3fn: torch.float8_e5m2, torch.float8_e4m3fnuz: torch.float8_e5m2fnuz}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def train_steps(layer, inputs, grads) -> list[torch.Tensor]:
    """One forward and backward per (input, output-gradient) pair; the dy each backward got."""
    seen = []
    for x, dy in zip(inputs, grads):
        y = layer(x)
        y.register_hook(lambda g: seen.append(g.detach().clone()))
        y.backward(dy)
    return seen


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_the_dy_history_holds_the_amaxes_the_backward_saw(dtype):
    """Four steps, dy's magnitude changing each: dy's history is the amaxes torch finds on the
    gradients the layer's backward received, newest first, bit for bit; x's and w's as before."""
    layer = Float8Linear(24, 10, recipe="delayed", dtype=dtype)
    sizes = (1.0, 30.0, 0.01, 2.0)
    inputs = [torch.randn(2, 5, 24, generator=gen(i), dtype=dtype) for i in range(4)]
    grads = [torch.randn(2, 5, 10, generator=gen(10 + i), dtype=dtype) * s for i, s in enumerate(sizes)]
    seen = train_steps(layer, inputs, grads)
    want = torch.stack([g.abs().amax().float() for g in seen[::-1]])
    assert torch.equal(layer.fp8_amax_history_dy[:4].view(torch.int32), want.view(torch.int32))
    assert not layer.fp8_amax_history_dy[4:].any() and layer.fp8_amax_history_dy.shape == (HISTORY,)
    assert layer.fp8_amax_history_x[0] == inputs[-1].abs().amax().float()


def dequantized(t: torch.Tensor, fp8: torch.dtype, scale: torch.Tensor) -> torch.Tensor:
    """``t`` cast to ``fp8`` with the given per-tensor ``scale`` and back, in float64."""
    q, s = quantize_fp8(t, fp8, "tensor", scale=scale)
    return q.double() * s.double()


@pytest.mark.parametrize("fp8, grad_format", [(torch.float8_e4m3fn, "hybrid"), (torch.float8_e4m3fnuz, "hybrid"),
                                              (torch.float8_e4m3fn, "e4m3")], ids=str)
def test_from_the_second_step_dy_is_cast_with_its_history_scale(fp8, grad_format):
    """Step 1 takes dy's current amax (its history is empty); step 2's dy, a tenth of step 1's,
    is cast with step 1's amax / the gradient format's max: dx and dw are the float64 GEMMs of
    the operands dequantized with those scales (to fp32 accumulation), not with dy's own."""
    layer = Float8Linear(40, 24, recipe="delayed", fp8_dtype=fp8, grad_format=grad_format)
    grad = layer.grad_fp8_dtype
    assert grad == (E5M2[fp8] if grad_format == "hybrid" else fp8)
    x1, x2 = (torch.randn(21, 40, generator=gen(s)) for s in (1, 2))
    dy1 = torch.randn(21, 24, generator=gen(3))
    dy2 = torch.randn(21, 24, generator=gen(4)) * 0.1
    train_steps(layer, [x1], [dy1])
    layer.weight.grad = None
    x2.requires_grad_()
    train_steps(layer, [x2], [dy2])
    fmax, w = torch.finfo(fp8).max, layer.weight.detach()
    sx, sw = x1.abs().amax() / fmax, w.abs().amax() / fmax   # the forward's history scales
    history, current = dy1.abs().amax() / torch.finfo(grad).max, dy2.abs().amax() / torch.finfo(grad).max
    x8, w8 = dequantized(x2.detach(), fp8, sx), dequantized(w, fp8, sw)
    for scale, close in ((history, True), (current, False)):
        dy8 = dequantized(dy2, grad, scale)
        for got, want in ((x2.grad, dy8 @ w8), (layer.weight.grad, dy8.t() @ x8)):
            err = ((got.double() - want).abs().max() / want.abs().max()).item()
            assert (err < 1e-5) == close, (scale, err)


@pytest.mark.parametrize("fp8, grad_format", [(torch.float8_e4m3fn, "hybrid"), (torch.float8_e4m3fnuz, "hybrid"),
                                              (torch.float8_e4m3fnuz, "e4m3")], ids=str)
def test_a_dy_that_outgrows_its_history_is_counted_and_warned(fp8, grad_format):
    """dy a thousand times step 1's: clamped to the format's max (finite gradients), one
    saturated step of dy, which warn_saturation names; x and w, unchanged in size, none."""
    layer = Float8Linear(8, 5, recipe="delayed", fp8_dtype=fp8, grad_format=grad_format)
    x = torch.randn(4, 8, generator=gen(0), requires_grad=True)
    train_steps(layer, [x, x], [torch.randn(4, 5, generator=gen(1)), torch.randn(4, 5, generator=gen(2)) * 1e3])
    assert torch.isfinite(x.grad).all() and torch.isfinite(layer.weight.grad).all()
    assert kernels.fp8.saturation(layer) == {"": {"x": 0, "w": 0, "dy": 1}}
    with pytest.warns(RuntimeWarning, match=r"saturated.*: : dy in 1 step\(s\)\."):
        kernels.fp8.warn_saturation(layer)
    assert layer.fp8_saturated.tolist() == [0, 0, 0]


def test_saturation_starts_half_an_ulp_above_the_max_in_each_format():
    """What round-to-nearest takes to the max anyway: e4m3's 3 mantissa bits, e5m2's 2 (the
    torch cast of e5m2, which has an inf, shows the boundary)."""
    assert [saturates_above(f) for f in (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2,
                                         torch.float8_e5m2fnuz)] == [464, 248, 61440, 61440]
    below, at = torch.tensor([61439.0, 61440.0]).to(torch.float8_e5m2).float()
    assert below == 57344 and at == float("inf")


def test_eval_mode_takes_dy_scale_from_the_history_and_records_nothing():
    """A backward in eval mode casts dy with its history's scale (a dy a thousand times larger
    is clamped: dx is the reference with that scale) and writes no history and no count."""
    layer = convert(torch.nn.Linear(8, 5), "delayed")
    x, dy1 = torch.randn(4, 8, generator=gen(0)), torch.randn(4, 5, generator=gen(1))
    train_steps(layer, [x], [dy1])
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    layer.eval()
    x.requires_grad_()
    dy2 = torch.randn(4, 5, generator=gen(2)) * 1e3
    train_steps(layer, [x], [dy2])
    assert all(torch.equal(v, state[k]) for k, v in layer.state_dict().items() if k.startswith("fp8_"))
    assert layer.fp8_saturated.tolist() == [0, 0, 0]
    fp8, grad, w = layer.fp8_dtype, layer.grad_fp8_dtype, layer.weight.detach()
    want = (dequantized(dy2, grad, dy1.abs().amax() / torch.finfo(grad).max)
            @ dequantized(w, fp8, w.abs().amax() / torch.finfo(fp8).max))
    torch.testing.assert_close(x.grad.double(), want, rtol=1e-5, atol=1e-5)


class Block(torch.nn.Module):
    """Two delayed Linears around a GELU: the first one's dy comes through the second."""

    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


def test_a_compiled_training_step_updates_the_dy_history_as_eager_does():
    """Three training steps, eager and under torch.compile(fullgraph=True): the same dy
    histories, saturation counts (step 3's dy outgrows the history) and gradients; one graph."""
    torch.manual_seed(0)
    eager = convert(Block(), "delayed", keep_high_precision=())
    compiled = copy.deepcopy(eager)
    xs = [torch.randn(3, 5, 16, generator=gen(i)) * s for i, s in enumerate((1.0, 0.5, 1.0))]
    weights = [torch.randn(3, 5, 8, generator=gen(10 + i)) * s for i, s in enumerate((1.0, 0.5, 1e3))]

    def step(net):
        return lambda x, c: (net(x) * c).sum()

    explained = torch._dynamo.explain(step(copy.deepcopy(eager)))(xs[0], weights[0])
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    run = torch.compile(step(compiled), fullgraph=True, backend="aot_eager")
    for x, c in zip(xs, weights):
        step(eager)(x, c).backward()
        run(x, c).backward()
        for name in ("up", "down"):
            a, b = getattr(eager, name), getattr(compiled, name)
            assert a.fp8_amax_history_dy.any()
            assert torch.equal(a.fp8_amax_history_dy, b.fp8_amax_history_dy), name
            assert torch.equal(a.fp8_saturated, b.fp8_saturated), name
            torch.testing.assert_close(a.weight.grad, b.weight.grad, rtol=1e-6, atol=1e-6)
    assert eager.down.fp8_amax_history_dy[2] > 0 and eager.down.fp8_saturated[2] == 1


def test_a_checkpoint_from_before_the_dy_history_loads_with_it_empty():
    """x's and w's histories and two counts (the old layout) load: dy's history starts empty,
    its count at 0, and the next step takes dy's current amax; the new layout round-trips."""
    layer = convert(torch.nn.Linear(8, 5), "delayed")
    x, dy = torch.randn(4, 8, generator=gen(0)), torch.randn(4, 5, generator=gen(1))
    train_steps(layer, [x], [dy])
    state = layer.state_dict()
    assert {"fp8_amax_history_x", "fp8_amax_history_w", "fp8_amax_history_dy", "fp8_saturated"} <= set(state)
    fresh = convert(torch.nn.Linear(8, 5), "delayed")
    fresh.load_state_dict(state)
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in state.items())
    old = {k: v for k, v in state.items() if k != "fp8_amax_history_dy"}
    old["fp8_saturated"] = torch.tensor([3, 1])
    model = torch.nn.Sequential(convert(torch.nn.Linear(8, 5), "delayed"))
    model.load_state_dict({"0." + k: v for k, v in old.items()})
    upgraded = model[0]
    assert torch.equal(upgraded.fp8_amax_history_x, state["fp8_amax_history_x"])
    assert not upgraded.fp8_amax_history_dy.any() and upgraded.fp8_saturated.tolist() == [3, 1, 0]
    dy2 = dy * 1e3
    train_steps(upgraded, [x], [dy2])   # an empty history: dy's current amax, nothing saturates
    assert upgraded.fp8_amax_history_dy[0] == dy2.abs().amax() and upgraded.fp8_saturated.tolist() == [3, 1, 0]
    with pytest.raises(RuntimeError, match="Missing key.*fp8_amax_history_dy"):   # not the old layout
        fresh.load_state_dict({k: v for k, v in state.items() if k != "fp8_amax_history_dy"})


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz])
def test_a_saturated_value_is_one_torchs_cast_takes_past_the_max(fp8):
    """Just below, at and just above half an ulp past the max: counted exactly where torch's
    round-to-nearest-even cast gives inf or NaN (these formats' max ends in a 1 bit, so the tie
    goes past it). e4m3fn's tie rounds down to 448, whose last bit is 0: not counted (torch's
    cast saturates there, so it cannot show the boundary)."""
    from kernels.fp8.recipes.delayed import saturated
    edge = saturates_above(fp8)
    values = torch.tensor([edge * (1 - 2 ** -12), edge, edge * (1 + 2 ** -12)])
    assert saturated(values, 1.0, fp8).tolist() == (~torch.isfinite(values.to(fp8).float())).tolist() \
        == [False, True, True]
    e4m3fn = torch.tensor([464 * (1 - 2 ** -12), 464.0, 464 * (1 + 2 ** -12)])
    assert saturated(e4m3fn, 1.0, torch.float8_e4m3fn).tolist() == [False, False, True]
