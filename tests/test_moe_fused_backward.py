"""The fused MoE rung's backward (``moe`` v3): two grouped GEMM launches per expert GEMM and
no forward GEMM, what the forward saves for it, gradients asked for one at a time, and the
k-sum that adds slot rows in float32 without a float32 copy of them."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import kernels
from kernels.moe.layer_ladder import spec as moe_spec
from kernels.moe.layer_ladder import fused_op  # noqa: F401  registers torch.ops.kernels.moe_fused
from kernels.moe.layer_ladder import v3_fused
from kernels.moe.layer_ladder.slot_sum import slot_sum

from grouped_launches import grouped_launches

V3 = kernels.get("moe", "v3")
SHAPE = (45, 48, 33, 8, 2, 1)   # skewed: empty experts


def _leaves(dtype=torch.float32, needs=(True,) * 5, seed=3):
    *tensors, top_k = moe_spec.make_inputs(SHAPE, dtype, seed=seed)
    return [t.detach().clone().requires_grad_(need) for t, need in zip(tensors, needs)], top_k


def test_backward_launches_dx_and_dw_per_expert_gemm_and_no_forward():
    """Three expert GEMMs: three dW launches and three dX launches (the forward kernel on a
    transposed weight), where recomputing the forward would add three more."""
    leaves, top_k = _leaves()
    out = V3(*leaves, top_k)
    with grouped_launches() as launches:
        out.backward(torch.randn_like(out))
    weights = [w.data_ptr() for w in leaves[2:5]]
    dx = [b for kernel, b in launches if kernel == "forward"]
    assert sorted(kernel for kernel, _ in launches) == ["dw"] * 3 + ["forward"] * 3
    assert all(b.stride(2) != 1 and b.data_ptr() in weights for b in dx)   # wᵀ: dX, not a forward


def test_forward_saves_g_u_h_and_the_order():
    """v3's docstring: 3·T·k·hidden elements in x's dtype, 8·T·k + 4·E bytes of indices."""
    (x, router, gate, up, down), top_k = _leaves(torch.bfloat16)
    weights, ids = kernels.moe.route(x.float() @ router.float().t(), top_k)
    out, *saved = torch.ops.kernels.moe_fused(x, weights, ids, gate, up, down, True)
    t, _, hidden, e, k, _ = SHAPE
    assert sum(s.numel() * s.element_size() for s in saved) == 3 * t * k * hidden * 2 + 8 * t * k + 4 * e
    unsaved = torch.ops.kernels.moe_fused(x, weights, ids, gate, up, down, False)
    assert unsaved[1].numel() == unsaved[2].numel() == 0 and torch.equal(unsaved[0], out)
    t, _, hidden, e, k, _ = moe_spec.BENCH_SHAPES["dsv3 (32 local experts)"]   # "0.40 GB per layer"
    assert round((3 * t * k * hidden * 2 + 8 * t * k + 4 * e) / 1e9, 2) == 0.40


@pytest.mark.parametrize("wanted", range(5))
def test_each_gradient_alone_matches_all_together(wanted):
    """A backward asked for one input's gradient computes only what that one needs."""
    everything, top_k = _leaves()
    out = V3(*everything, top_k)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    out.backward(grad)
    needs = [i == wanted for i in range(5)]
    alone, _ = _leaves(needs=needs)
    V3(*alone, top_k).backward(grad)
    assert torch.equal(alone[wanted].grad, everything[wanted].grad)
    assert all(t.grad is None for i, t in enumerate(alone) if i != wanted)


def test_backward_without_saved_activations_is_refused():
    (x, router, gate, up, down), top_k = _leaves()
    weights, ids = kernels.moe.route(x.detach().float() @ router.detach().float().t(), top_k)
    out = torch.ops.kernels.moe_fused(x, weights, ids, gate, up, down, False)[0]
    with pytest.raises(RuntimeError, match="save=False"):
        out.sum().backward()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("top_k", [2, 6])
def test_slot_sum_is_the_float32_sum_rounded_once(dtype, top_k):
    """At least as accurate as upcasting the buffer and summing with torch (v3's k-sum before)."""
    gen = torch.Generator().manual_seed(top_k)
    slots = (torch.randn(37 * top_k, 70, generator=gen) * 3).to(dtype)
    exact = slots.double().view(37, top_k, 70).sum(1)
    before = slots.view(37, top_k, 70).float().sum(1).to(dtype)
    got = slot_sum(slots, top_k)
    assert got.dtype == dtype and got.shape == (37, 70)
    assert (got.double() - exact).abs().max() <= (before.double() - exact).abs().max()


def test_slot_sum_gathers_and_pairs():
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(12, 5, generator=gen), torch.randn(12, 5, generator=gen)
    rows = torch.randperm(12, generator=gen)
    want = (a[rows] + b[rows]).view(4, 3, 5).sum(1)
    torch.testing.assert_close(slot_sum(a, 3, b, rows=rows), want)
    assert slot_sum(a[:0], 3).shape == (0, 5)


class _Float32Allocations(TorchDispatchMode):
    """The shapes of every float32 tensor an aten op returns."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                self.shapes.append(tuple(t.shape))
        return out


def test_forward_k_sum_allocates_no_float32_slot_buffer():
    (x, router, gate, up, down), top_k = _leaves(torch.bfloat16, needs=(False,) * 5)
    weights, ids = kernels.moe.route(x.float() @ router.float().t(), top_k)
    t, dim = x.shape
    with _Float32Allocations() as seen:   # the forward's body: the mode does not see into a custom op
        out = v3_fused.fused_forward(x, weights, ids, gate, up, down, save=False)[0]
    assert out.dtype == torch.bfloat16 and (t * top_k,) in seen.shapes   # it sees float32: the weights
    slot_shapes = {(t, top_k, dim), (t * top_k, dim)}
    assert not slot_shapes & set(seen.shapes), seen.shapes
