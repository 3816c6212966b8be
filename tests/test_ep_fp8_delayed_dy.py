"""Delayed scaling of the expert-parallel FP8 layer's output gradients (down's dy, gate's dg,
up's du) on one in-process gloo rank: the owner's merged backward takes each gradient's scale
from its history (one for all chunks' rows, both casts), records the amax once per training
step and nothing in eval mode, capacity padding stays out of the amax, and the histories are
those of the single-process Float8MoE. Two ranks against Float8MoE: tests/test_ep_fp8.py."""
from __future__ import annotations

import copy

import pytest
import torch

import kernels
from kernels.fp8.recipes.delayed import HISTORY, PREFIX
from kernels.moe import ep_fp8_layer
from kernels.moe.ep_fp8_layer import Float8ExpertParallelMoE
from kernels.moe.fp8_experts import FP8_TENSORS, GRAD_TENSORS
from kernels.moe.fp8_layer import Float8MoE
from kernels.outputs import poisoned_outputs

from gradient_casts import GradientCasts
from host_sync import no_host_sync

FP8, GRAD = torch.float8_e4m3fn, torch.float8_e5m2   # hybrid: only the gradients' casts write e5m2
DIM, HIDDEN, EXPERTS, TOP_K = 16, 32, 4, 2
TOKENS, CHUNKS, PADDING = 9, 2, 5
DH_TOLERANCE = 1e-6
"""dg's and du's amaxes, EP against Float8MoE (relative). Both quantize dy with the same scale and
the same bytes per row, so dh differs only by the fp32 order of the dgrad GEMM's sums over a row
(a chunk's or the merged rows' tiles hold other rows on the CPU: tests/test_ep_moe.py), a few
ulps of dh; dg and du are elementwise in dh. Measured here: 0 or about 1e-7."""


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _layers(group, capacity: int | None = None):
    """The single-process delayed Float8MoE and the one-rank expert-parallel one of one full layer."""
    torch.manual_seed(0)
    full = kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K)
    single = Float8MoE.from_moe(copy.deepcopy(full), "delayed", FP8, GRAD)
    ep = kernels.MoE.from_full(full, group, ep_chunks=CHUNKS)
    ep.ep_capacity = capacity
    return single, Float8ExpertParallelMoE.from_ep(ep, "delayed", FP8, GRAD)


def _history(layer, name: str) -> torch.Tensor:
    return getattr(layer, PREFIX + name)


def _step(layer, seed: int, grad_scale: float = 1.0):
    x = torch.randn(TOKENS, DIM, generator=gen(seed), requires_grad=True)
    out = layer(x)
    out.backward(torch.randn(out.shape, generator=gen(100 + seed)) * grad_scale)


class Spy:
    """The owner's merged backward: each GEMM's output gradient (by the weight it multiplies),
    the offsets, and every cast to the gradient format."""

    def __init__(self, layer, monkeypatch):
        self.grads, self.offsets = {n: [] for n in ("gate", "up", "down")}, []
        self.casts = GradientCasts(monkeypatch, GRAD)
        names = {id(getattr(layer, n)): n for n in self.grads}
        gradients = ep_fp8_layer.gradients

        def merged(x, w, offsets, dy, *args, **kwargs):
            self.grads[names[id(w)]].append(dy.detach().clone())
            self.offsets.append(offsets.clone())
            return gradients(x, w, offsets, dy, *args, **kwargs)

        monkeypatch.setattr(ep_fp8_layer, "gradients", merged)


def test_the_histories_are_float8moes_after_training_steps(one_rank, monkeypatch):
    """Four steps of both layers, two chunks, the gradients' size changing: each gradient
    history holds the amaxes torch finds on the merged gradient its GEMM's backward received,
    newest first; down's dy's equal the single-process layer's bit for bit (max |w·dy| of fp32
    products, rounded once either way), dg's and du's within :data:`DH_TOLERANCE`, the forward
    operands' bit for bit; the saturation counts Float8MoE's, step 2 (30 times step 1's
    gradients) counted as saturating each gradient."""
    single, ep = _layers(one_rank)
    spy = Spy(ep, monkeypatch)
    sizes = (1.0, 30.0, 0.01, 2.0)
    for step, size in enumerate(sizes):
        for layer in (single, ep):
            _step(layer, step, size)
    assert len(spy.grads["down"]) == len(sizes)   # one merged backward a step
    for name in ("gate", "up", "down"):
        want = torch.stack([g.abs().amax() for g in spy.grads[name][::-1]])
        got = _history(ep, "dy_" + name)
        assert got.shape == (HISTORY,) and not got[len(sizes):].any()
        assert torch.equal(got[:len(sizes)], want), name
    assert torch.equal(_history(ep, "dy_down"), _history(single, "dy_down"))
    for name in ("dy_gate", "dy_up"):
        torch.testing.assert_close(_history(ep, name), _history(single, name), rtol=DH_TOLERANCE, atol=0)
    for name in FP8_TENSORS:
        assert torch.equal(_history(ep, name), _history(single, name)), name
    assert torch.equal(ep.fp8_saturated, single.fp8_saturated) and ep.fp8_saturated[len(FP8_TENSORS):].all()
    assert [id(b) for b in kernels.fp8.get("delayed").reduced_buffers(ep)] == \
        [id(_history(ep, n)) for n in FP8_TENSORS + GRAD_TENSORS]   # the amax sync reduces all eight


def test_each_merged_gradient_s_cast_takes_its_history_scale(one_rank, monkeypatch):
    """Step 1 (empty histories): each merged gradient's one cast for both its operands (dgrad's,
    wgrad's: quantize.token_operands) takes its current amax / e5m2's max; from step 2, whose
    gradients are a tenth of step 1's, the history's max / e5m2's max (not the gradient's own);
    that cast finds the amax the history records."""
    _, ep = _layers(one_rank)
    spy = Spy(ep, monkeypatch)
    fmax = torch.finfo(GRAD).max
    for step, size in enumerate((1.0, 0.1, 0.1)):
        before = {n: _history(ep, "dy_" + n).clone() for n in ("gate", "up", "down")}
        spy.casts.clear()
        _step(ep, step, size)
        for name in ("gate", "up", "down"):
            dy = spy.grads[name][-1]
            casts = spy.casts.of(dy)
            assert [amax for _, amax in casts] == [True], (step, name)   # both operands' one cast
            current = dy.abs().amax() / fmax
            want = current if step == 0 else before[name].amax() / fmax
            assert step == 0 or not torch.isclose(want, current, rtol=0.1)
            for scale, _ in casts:
                assert scale.reshape(()) == want, (step, name)


def test_eval_mode_takes_the_history_scale_and_records_nothing(one_rank, monkeypatch):
    """A backward in eval mode casts each gradient with its history's scale and writes no
    history and no count, though its gradients are a thousand times larger."""
    _, ep = _layers(one_rank)
    _step(ep, 0)
    state = {k: v.clone() for k, v in ep.state_dict().items() if k.startswith("fp8_")}
    assert all(state[PREFIX + n].any() for n in GRAD_TENSORS)
    ep.eval()
    spy = Spy(ep, monkeypatch)
    _step(ep, 1, 1e3)
    assert all(torch.equal(ep.state_dict()[k], v) for k, v in state.items())
    for name in ("gate", "up", "down"):
        casts = spy.casts.of(spy.grads[name][-1])
        assert len(casts) == 1   # both operands' one cast
        assert all(s.reshape(()) == state[PREFIX + "dy_" + name].amax() / torch.finfo(GRAD).max for s, _ in casts)


def test_capacity_padding_is_not_in_the_recorded_amaxes(one_rank, monkeypatch):
    """Capacity with PADDING rows per chunk at the owner, every kernel output poisoned (NaN) and dh's
    padding rows (down's dX, unwritten) overwritten with 1e30 before SwiGLU's derivative: each
    history's entry is the amax of its gradient's real rows (the merged gradient's padding rows
    are 0: dy's from the exchange, dg's and du's written by the derivative), nothing counted as
    saturating, no host read in forward and backward."""
    _, ep = _layers(one_rank, TOKENS * TOP_K + PADDING)
    spy = Spy(ep, monkeypatch)
    kernel = ep_fp8_layer.swiglu_backward

    def garbage(dh, *args, rows_end, **kwargs):
        dh = dh.clone()
        dh[TOKENS * TOP_K:] = 1e30
        return kernel(dh, *args, rows_end=rows_end, **kwargs)
    monkeypatch.setattr(ep_fp8_layer, "swiglu_backward", garbage)
    x = torch.randn(TOKENS, DIM, generator=gen(0), requires_grad=True)
    with poisoned_outputs(), no_host_sync():
        out = ep(x)
        out.backward(torch.randn(out.shape, generator=gen(1)))
    assert int(spy.offsets[-1][-1]) == TOKENS * TOP_K
    for name in ("gate", "up", "down"):
        dy = spy.grads[name][-1]
        assert dy.shape[0] == CHUNKS * (TOKENS * TOP_K + PADDING), name   # each chunk's capacity
        real = dy[:TOKENS * TOP_K].abs().amax()
        assert real.isfinite() and _history(ep, "dy_" + name)[0] == real, name
    assert not ep.fp8_saturated.any()
    assert all(p.grad.isfinite().all() for p in (x, ep.gate, ep.up, ep.down))


def test_a_checkpoint_from_before_the_gradient_histories_loads_with_them_empty(one_rank):
    """The expert-parallel layer's state_dict holds all eight histories and eight counts; one with
    the five forward histories and five counts (before this layer kept the gradients') loads
    with the three empty and their counts 0."""
    _, ep = _layers(one_rank)
    _step(ep, 0)
    state = ep.state_dict()
    assert {PREFIX + n for n in FP8_TENSORS + GRAD_TENSORS} <= set(state) and state["fp8_saturated"].shape == (8,)
    old = {k: v for k, v in state.items() if not k.startswith(PREFIX + "dy_")}
    old["fp8_saturated"] = torch.tensor([3, 1, 0, 0, 2])
    _, fresh = _layers(one_rank)
    fresh.load_state_dict(old)
    assert torch.equal(_history(fresh, "x"), state[PREFIX + "x"])
    assert not any(_history(fresh, n).any() for n in GRAD_TENSORS)
    assert fresh.fp8_saturated.tolist() == [3, 1, 0, 0, 2, 0, 0, 0]
