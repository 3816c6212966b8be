"""Loss and gradient parity: the workbench kernels train the model as PyTorch does.

fp32 on the CPU (the interpreter's fp32 dots are IEEE fp32, no TF32), same seed, same
data. Stated tolerance: losses within ``LOSS_TOL`` at every step, gradients within
``GRAD_TOL`` at every step (the first step's and those after an optimizer update).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import kernels
from workbench import train
from workbench.train.data import batch
from workbench.train.model import GPT

SMOKE = train.PRESETS["cpu-smoke"]
LOSS_TOL = dict(rtol=1e-5, atol=1e-5)
GRAD_TOL = dict(rtol=1e-4, atol=1e-5)
DENSE_OPS = {"gemm": "workbench", "attention": "workbench", "moe": "torch"}


def train_side_by_side(choice, steps: int):
    """Per step: (torch loss, ``choice`` loss, torch grads, ``choice`` grads), same weights."""
    torch.manual_seed(0)
    ref = GPT(SMOKE, "torch")
    other = GPT(SMOKE, choice)
    other.load_state_dict(ref.state_dict())
    optims = [torch.optim.AdamW(m.parameters(), lr=SMOKE.lr) for m in (ref, other)]
    history = []
    for step in range(steps):
        tokens, targets = batch(SMOKE, seed=0, step=step)
        record = []
        for model, optim in zip((ref, other), optims):
            optim.zero_grad()
            loss = model(tokens, targets)
            loss.backward()
            record.append((loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}))
            optim.step()
        history.append(record)
    return history


def assert_parity(history):
    for step, ((loss_a, grads_a), (loss_b, grads_b)) in enumerate(history):
        torch.testing.assert_close(loss_b, loss_a, **LOSS_TOL, msg=f"loss at step {step}")
        for name, grad in grads_a.items():
            torch.testing.assert_close(grads_b[name], grad, **GRAD_TOL, msg=f"{name} at step {step}")


def test_workbench_gemm_and_attention_train_like_torch():
    assert_parity(train_side_by_side(DENSE_OPS, steps=2))


@pytest.mark.parametrize("op", ["attention", "gemm", "norm", "rope", "swiglu", "loss"])
def test_one_op_switched_trains_like_torch(op):
    assert_parity(train_side_by_side({op: "workbench"}, steps=2))


@pytest.mark.slow
def test_twenty_steps_of_run_agree_with_torch():
    """Long enough for rounding differences to compound and for the model to learn (the
    loss falls by more than 0.5), short enough for CI: 20 steps of both sides."""
    ref = [r["loss"] for r in train.run(SMOKE, "torch", steps=20, progress=False)]
    ours = [r["loss"] for r in train.run(SMOKE, "workbench", steps=20, progress=False)]
    torch.testing.assert_close(ours, ref, **LOSS_TOL)
    assert ref[-1] < ref[0] - 0.5   # it learns the successor table


def test_workbench_moe_trains_like_torch_moe():
    """``kernels.MoE`` takes the plain-PyTorch MoE's parameters as they are (both are
    ``MoEReference``'s), so both start from one state."""
    assert_parity(train_side_by_side("workbench", steps=3))


@pytest.mark.slow
def test_compiled_workbench_kernels_train_like_eager_torch():
    """``compile=True``: the kernels' custom ops (every op's: the dense model has no MoE) stay opaque
    nodes in the compiled graph."""
    dense = dataclasses.replace(SMOKE, experts=0)
    ref = [r["loss"] for r in train.run(dense, "torch", steps=2, progress=False)]
    ours = [r["loss"] for r in train.run(dense, "workbench", steps=2, compile=True, progress=False)]
    torch.testing.assert_close(ours, ref, **LOSS_TOL)
