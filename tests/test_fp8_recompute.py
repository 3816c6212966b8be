"""Delayed scaling under activation checkpointing: a recompute casts with its forward's scales
and records nothing (kernels/fp8/recipes/delayed.py), so a checkpointed model's gradients,
amax histories and saturation counts are, bit for bit, those of the same steps without
checkpointing, for a Float8Linear block and a Float8MoE layer, with torch's reentrant and
non-reentrant checkpoint. Before, the recompute cast with the history its forward had just
updated and recorded its amaxes a second time."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import kernels
import kernels.fp8
from kernels.fp8.recipes.delayed import recomputing
from kernels.moe.fp8_layer import Float8MoE

FP8, GRAD = torch.float8_e4m3fn, torch.float8_e5m2


class Block(torch.nn.Module):
    """Two delayed-scaling FP8 Linears around a GELU, optionally checkpointed as one."""

    def __init__(self, dim: int = 24, hidden: int = 40):
        super().__init__()
        self.up = kernels.fp8.Float8Linear(dim, hidden, recipe="delayed", fp8_dtype=FP8)
        self.down = kernels.fp8.Float8Linear(hidden, dim, recipe="delayed", fp8_dtype=FP8)
        self.reentrant: bool | None = None   # None: no checkpoint

    def body(self, x):
        return self.down(F.gelu(self.up(x)))

    def forward(self, x):
        if self.reentrant is None:
            return self.body(x)
        return checkpoint(self.body, x, use_reentrant=self.reentrant)


class MoEBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.moe = Float8MoE.from_moe(kernels.MoE(16, 32, 4, 2), "delayed", FP8, GRAD)
        self.reentrant: bool | None = None

    def forward(self, x):
        if self.reentrant is None:
            return self.moe(x)
        return checkpoint(self.moe, x, use_reentrant=self.reentrant)


def _steps(model, inputs):
    """Per step: x's gradient, every parameter's gradient and every buffer, after forward and backward."""
    seen = []
    for i, x in enumerate(inputs):
        model.zero_grad(set_to_none=True)
        x = x.clone().requires_grad_()   # reentrant checkpoint differentiates only through inputs that need it
        out = model(x)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(100 + i)))
        seen.append({"x.grad": x.grad, **{n: p.grad.clone() for n, p in model.named_parameters()},
                     **{n: b.clone() for n, b in model.named_buffers()}})
    return seen


def _inputs(shape, scales):
    """One input a step, each at its own scale, so a history that takes the step's amax early
    gives another scale than the one before it."""
    return [s * torch.randn(shape, generator=torch.Generator().manual_seed(i)) for i, s in enumerate(scales)]


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("build, shape", [(Block, (2, 5, 24)), (MoEBlock, (2, 7, 16))], ids=["linear", "moe"])
def test_a_checkpointed_delayed_layer_trains_as_one_without_checkpointing(build, shape, reentrant):
    torch.manual_seed(0)
    plain = build()
    checkpointed = copy.deepcopy(plain)
    checkpointed.reentrant = reentrant
    inputs = _inputs(shape, (1.0, 3.0, 0.5, 8.0))
    want, got = _steps(plain, inputs), _steps(checkpointed, inputs)
    for step, (w, g) in enumerate(zip(want, got)):
        assert w.keys() == g.keys()
        for name in w:
            assert torch.equal(w[name], g[name]), f"step {step}: {name} differs under checkpointing"


def test_recomputing_is_a_training_forward_inside_a_backward():
    """What the recipe takes for a recompute: only a training-mode forward that autograd's engine
    runs during a backward, as checkpoint's recompute is."""
    layer = kernels.fp8.Float8Linear(4, 4, recipe="delayed", fp8_dtype=FP8)
    seen = []

    def spy(module, args):
        seen.append(recomputing(module))

    layer.register_forward_pre_hook(spy)
    x = torch.randn(3, 4, requires_grad=True)
    checkpoint(layer, x, use_reentrant=False).sum().backward()
    assert seen == [False, True]
    layer.eval()
    seen.clear()
    checkpoint(layer, x, use_reentrant=False).sum().backward()
    assert seen == [False, False]   # eval mode records nothing, so it needs no kept scale


def test_a_forward_a_backward_hook_runs_casts_and_records_as_any_forward():
    """A hook that runs the layer during a backward (gradients off) is no recompute: its input,
    100x the forward's, is cast with its own scale and its amax enters the history."""
    layer = kernels.fp8.Float8Linear(8, 8, recipe="delayed", fp8_dtype=FP8)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0), requires_grad=True)
    hooked = []
    x.register_hook(lambda g: hooked.append(layer(100 * x.detach())))
    layer(x).sum().backward()
    history = layer.fp8_amax_history_x
    assert hooked and history[0] == (100 * x.detach()).abs().amax() and history[1] == x.detach().abs().amax()
