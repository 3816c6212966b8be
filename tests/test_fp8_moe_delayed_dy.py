"""Delayed scaling of a Float8MoE's output gradients: the down GEMM's dy and the gate and up
GEMMs' dg and du each keep an amax history (kernels.fp8.recipes.delayed), written by the
grouped training op's backward: the values, the scale both casts of each take, saturation,
eval mode, torch.compile, the amax sync's buffers and old checkpoints."""
from __future__ import annotations

import copy

import pytest
import torch

import kernels
import kernels.fp8
from kernels.fp8.recipes.delayed import HISTORY, PREFIX
from kernels.moe import fp8_experts
from kernels.moe.fp8_experts import FP8_TENSORS, GRAD_TENSORS
from kernels.moe.fp8_layer import Float8MoE
from kernels.moe.grouped_gemm_fp8 import grouped_gemm_fp8_train

from gradient_casts import GradientCasts

FP8, GRAD = torch.float8_e4m3fn, torch.float8_e5m2   # hybrid: only dy's casts write e5m2
DIM, HIDDEN, EXPERTS, TOP_K = 16, 32, 4, 2


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _layer(seed: int = 0, dtype=torch.float32) -> Float8MoE:
    torch.manual_seed(seed)
    return Float8MoE.from_moe(kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K).to(dtype), "delayed", FP8, GRAD)


def _history(layer, name: str) -> torch.Tensor:
    return getattr(layer, PREFIX + name)


class Spy:
    """The output gradient each grouped GEMM's backward receives (a hook on the op's output,
    by the weight it multiplies) and every cast to the gradient format."""

    def __init__(self, layer, monkeypatch):
        self.grads = {name: [] for name in ("gate", "up", "down")}
        self.casts = GradientCasts(monkeypatch, GRAD)
        names = {id(getattr(layer, name)): name for name in self.grads}
        train = fp8_experts.grouped_gemm_fp8_train

        def op(a, w, *args, **kwargs):
            out, found = train(a, w, *args, **kwargs)
            out.register_hook(lambda g, name=names[id(w)]: self.grads[name].append(g.detach().clone()))
            return out, found

        monkeypatch.setattr(fp8_experts, "grouped_gemm_fp8_train", op)


def _step(layer, x, grad_scale: float = 1.0):
    out = layer(x)
    out.backward(torch.randn(out.shape, generator=gen(100), dtype=out.dtype) * grad_scale)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_each_history_holds_the_amaxes_of_the_gradients_the_backward_saw(dtype, monkeypatch):
    """Four steps, the output gradient's size changing each: each of the three histories is
    the amaxes torch finds on the gradient its GEMM's backward received, newest first, bit for
    bit; the forward operands' histories as before; step 2 counted as saturating each."""
    layer = _layer(dtype=dtype)
    spy = Spy(layer, monkeypatch)
    sizes = (1.0, 30.0, 0.01, 2.0)
    for i, size in enumerate(sizes):
        x = torch.randn(2, 5, DIM, generator=gen(i), dtype=dtype, requires_grad=True)
        _step(layer, x, size)
    for name in ("gate", "up", "down"):
        want = torch.stack([g.abs().amax().float() for g in spy.grads[name][::-1]])
        got = _history(layer, "dy_" + name)
        assert got.shape == (HISTORY,) and not got[len(sizes):].any()
        assert torch.equal(got[:len(sizes)].view(torch.int32), want.view(torch.int32)), name
    assert _history(layer, "x")[0] == x.detach().abs().amax().float()
    assert layer.fp8_saturated[len(FP8_TENSORS):].tolist() == [1, 1, 1]   # step 2's, 30 times step 1's


@pytest.mark.parametrize("x_grad", [True, False], ids=["dx-and-dw", "dw-only"])
def test_each_gradient_s_cast_takes_its_history_scale(monkeypatch, x_grad):
    """Step 1 (empty histories): each gradient's one cast for both its operands (dgrad's, wgrad's:
    quantize.token_operands) takes its current amax / e5m2's max; from step 2, whose gradients are
    a tenth of step 1's, the history's max / e5m2's max (not the gradient's own), and it finds the
    amax the history records. With x needing no gradient, gate's and up's backward runs dW alone:
    one cast of its operand, which finds the amax."""
    layer = _layer()
    spy = Spy(layer, monkeypatch)
    fmax = torch.finfo(GRAD).max
    before = {}
    for step, size in enumerate((1.0, 0.1, 0.1)):
        before[step] = {n: _history(layer, "dy_" + n).clone() for n in ("gate", "up", "down")}
        spy.casts.clear()
        _step(layer, torch.randn(9, DIM, generator=gen(step), requires_grad=x_grad), size)
        for name in ("gate", "up", "down"):
            dy = spy.grads[name][-1]
            casts = spy.casts.of(dy)
            assert [amax for _, amax in casts] == [True], name
            assert _history(layer, "dy_" + name)[0] == dy.abs().amax().float(), name
            current = dy.abs().amax() / fmax
            want = current if step == 0 else before[step][name].amax() / fmax
            assert step == 0 or not torch.isclose(want, current, rtol=0.1)
            for scale, _ in casts:
                assert scale.reshape(()) == want, (step, name)


def test_a_gradient_that_outgrows_its_history_is_counted_and_warned():
    """Output gradients a thousand times step 1's: the three gradients saturate (clamped,
    finite gradients), one step each counted after the forward operands' and named."""
    layer = _layer()
    x = torch.randn(9, DIM, generator=gen(0), requires_grad=True)
    _step(layer, x)
    _step(layer, x, 1e3)
    assert torch.isfinite(x.grad).all() and all(torch.isfinite(getattr(layer, n).grad).all()
                                                for n in ("gate", "up", "down"))
    assert layer.fp8_saturated.tolist() == [0] * len(FP8_TENSORS) + [1] * len(GRAD_TENSORS)
    assert kernels.fp8.saturation(layer)[""] == {**dict.fromkeys(FP8_TENSORS, 0), **dict.fromkeys(GRAD_TENSORS, 1)}
    with pytest.warns(RuntimeWarning, match=r"dy_gate in 1 step\(s\), dy_up in 1 step\(s\), dy_down in 1 step"):
        kernels.fp8.warn_saturation(layer)
    assert not layer.fp8_saturated.any()


def test_eval_mode_takes_the_history_scale_and_records_nothing(monkeypatch):
    """A backward in eval mode casts each gradient with its history's scale and writes no
    history and no count, though its gradients are a thousand times larger."""
    layer = _layer()
    x = torch.randn(9, DIM, generator=gen(0), requires_grad=True)
    _step(layer, x)
    state = {k: v.clone() for k, v in layer.state_dict().items() if k.startswith("fp8_")}
    layer.eval()
    spy = Spy(layer, monkeypatch)
    _step(layer, x, 1e3)
    assert all(torch.equal(layer.state_dict()[k], v) for k, v in state.items())
    for name in ("gate", "up", "down"):
        casts = spy.casts.of(spy.grads[name][-1])
        assert len(casts) == 1   # both operands' one cast
        assert all(s.reshape(()) == state[PREFIX + "dy_" + name].amax() / torch.finfo(GRAD).max for s, _ in casts)


def test_a_compiled_training_step_updates_the_histories_as_eager_does():
    """Three training steps, eager and under torch.compile(fullgraph=True, aot_eager): the same
    histories (all eight), counts (step 3's gradients outgrow theirs) and weight gradients."""
    eager = _layer(seed=3)
    compiled = copy.deepcopy(eager)
    xs = [torch.randn(11, DIM, generator=gen(i)) for i in range(3)]
    weights = [torch.randn(11, DIM, generator=gen(10 + i)) * s for i, s in enumerate((1.0, 0.5, 1e3))]

    def step(net):
        return lambda x, c: (net(x) * c).sum()

    run = torch.compile(step(compiled), fullgraph=True, backend="aot_eager")
    for x, c in zip(xs, weights):
        for net in (eager, compiled):
            for p in net.parameters():
                p.grad = None
        step(eager)(x, c).backward()
        run(x, c).backward()
        for name in FP8_TENSORS + GRAD_TENSORS:
            assert _history(eager, name).any()
            assert torch.equal(_history(eager, name), _history(compiled, name)), name
        assert torch.equal(eager.fp8_saturated, compiled.fp8_saturated)
        for name in ("gate", "up", "down"):
            torch.testing.assert_close(getattr(eager, name).grad, getattr(compiled, name).grad, rtol=1e-6, atol=1e-6)
    assert eager.fp8_saturated[len(FP8_TENSORS):].tolist() == [1, 1, 1]


def test_the_amax_sync_reduces_the_gradient_histories():
    """The amax sync's buffers are the eight histories (the forward operands' and the gradients');
    its gloo run: tests/test_fp8_moe.py's FSDP2 test."""
    layer = _layer()
    reduced = kernels.fp8.get("delayed").reduced_buffers(layer)
    assert [id(b) for b in reduced] == [id(_history(layer, n)) for n in FP8_TENSORS + GRAD_TENSORS]


def test_state_dict_round_trips_and_an_old_checkpoint_loads_with_empty_gradient_histories():
    """The new layout round-trips; a checkpoint of the five forward histories and five counts
    (before the gradients' histories) loads with the three empty and their counts 0, and the
    next step takes each gradient's current amax; a new layout missing one is refused."""
    layer = _layer()
    x = torch.randn(9, DIM, generator=gen(0), requires_grad=True)
    _step(layer, x)
    state = layer.state_dict()
    assert {PREFIX + n for n in FP8_TENSORS + GRAD_TENSORS} <= set(state) and state["fp8_saturated"].shape == (8,)
    fresh = _layer(seed=1)
    fresh.load_state_dict(state)
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in state.items())
    old = {k: v for k, v in state.items() if not k.startswith(PREFIX + "dy_")}
    old["fp8_saturated"] = torch.tensor([3, 1, 0, 0, 2])
    model = torch.nn.Sequential(_layer(seed=1))
    model.load_state_dict({"0." + k: v for k, v in old.items()})
    upgraded = model[0]
    assert torch.equal(upgraded.fp8_amax_history_x, state[PREFIX + "x"])
    assert not any(_history(upgraded, n).any() for n in GRAD_TENSORS)
    assert upgraded.fp8_saturated.tolist() == [3, 1, 0, 0, 2, 0, 0, 0]
    _step(upgraded, x, 1e3)   # empty histories: the current amaxes, nothing saturates
    assert all(_history(upgraded, n)[0] > 0 for n in GRAD_TENSORS)
    assert upgraded.fp8_saturated.tolist() == [3, 1, 0, 0, 2, 0, 0, 0]
    with pytest.raises(RuntimeError, match="Missing key.*fp8_amax_history_dy_up"):   # not the old layout
        fresh.load_state_dict({k: v for k, v in state.items() if k != PREFIX + "dy_up"})
    partial = {k: v for k, v in old.items() if not k.startswith(PREFIX) or k in (PREFIX + "x", PREFIX + "hidden")}
    partial["fp8_saturated"] = torch.tensor([1, 2])   # two forward histories: no layout this layer ever had
    with pytest.raises(RuntimeError, match="Missing key"):
        _layer(seed=1).load_state_dict(partial)


def test_a_linears_checkpoint_missing_a_forward_history_is_refused():
    """Only the output gradient's history is filled in for an old checkpoint: a Linear's with
    x's history alone is not one, and strict loading names what is missing."""
    layer = kernels.fp8.convert(torch.nn.Linear(8, 4), "delayed")
    state = {k: v for k, v in layer.state_dict().items() if k not in (PREFIX + "w", PREFIX + "dy")}
    state["fp8_saturated"] = torch.tensor([7])
    with pytest.raises(RuntimeError, match="Missing key.*fp8_amax_history_w"):
        kernels.fp8.convert(torch.nn.Linear(8, 4), "delayed").load_state_dict(state)


def test_the_training_op_checks_the_gradient_history():
    """history_dy is delayed's, float32 (HISTORY,); counts come with it and count_index indexes them."""
    x, w = torch.randn(6, DIM), torch.randn(2, DIM, 8)
    offsets, one = torch.tensor([3, 6], dtype=torch.int32), torch.ones(())
    history, counts = torch.zeros(HISTORY), torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ValueError, match="recipe 'tensorwise' keeps none"):
        grouped_gemm_fp8_train(x, w, offsets, "tensorwise", FP8, history_dy=history)
    with pytest.raises(ValueError, match="expected 16"):
        grouped_gemm_fp8_train(x, w, offsets, "delayed", FP8, None, one, one, history_dy=torch.zeros(4))
    with pytest.raises(TypeError, match="history_dy has dtype"):
        grouped_gemm_fp8_train(x, w, offsets, "delayed", FP8, None, one, one, history_dy=history.double())
    with pytest.raises(ValueError, match="pass both"):
        grouped_gemm_fp8_train(x, w, offsets, "delayed", FP8, None, one, one, counts=counts)
    with pytest.raises(ValueError, match="count_index 3"):
        grouped_gemm_fp8_train(x, w, offsets, "delayed", FP8, None, one, one, history_dy=history, counts=counts,
                               count_index=3)
