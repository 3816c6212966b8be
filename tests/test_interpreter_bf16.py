"""Pins the two interpreter bf16 bugs the rungs work around (kernels/triton_support.py).

If an upgrade of Triton fixes them, the first two tests fail: then the INTERP_BF16
workaround can be removed from the rungs.
"""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kernels.triton_support import interp_bf16, round_to_bf16


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    a = tl.load(a_ptr + r[:, None] * N + r[None, :])
    b = tl.load(b_ptr + r[:, None] * N + r[None, :])
    tl.store(c_ptr + r[:, None] * N + r[None, :], tl.dot(a, b))


@triton.jit
def _convert_kernel(x_ptr, y_ptr, FIX: tl.constexpr, N: tl.constexpr):
    r = tl.arange(0, N)
    x = tl.load(x_ptr + r)
    if FIX:
        x = round_to_bf16(x)
    tl.store(y_ptr + r, x.to(tl.bfloat16))


def test_interpreter_bf16_dot_is_still_wrong_upstream():
    a, b = torch.randn(16, 16).bfloat16(), torch.randn(16, 16).bfloat16()
    c = torch.empty(16, 16)
    _dot_kernel[(1,)](a, b, c, N=16)
    assert (c - a.float() @ b.float()).abs().max() > 1.0


def _convert(x: torch.Tensor, fix: bool) -> torch.Tensor:
    y = torch.empty(x.shape, dtype=torch.bfloat16)
    _convert_kernel[(1,)](x, y, FIX=fix, N=x.numel())
    return y


def test_interpreter_bf16_conversion_still_truncates_upstream():
    x = torch.randn(1024) * 10
    assert (_convert(x, fix=False) != x.bfloat16()).any()


def test_hand_rounding_matches_torch_round_to_nearest_even():
    special = torch.tensor([float("inf"), -float("inf"), float("nan"), 3.4e38, -3.4e38, 0.0, -0.0,
                            1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.5e-38, -2.0**-126])
    x = torch.cat([torch.randn(1024 - len(special)) * 100, special])  # no subnormals: see triton_support
    ours, torchs = _convert(x, fix=True), x.bfloat16()
    assert torch.equal(ours.isnan(), torchs.isnan())
    keep = ~torchs.isnan()
    assert torch.equal(ours[keep].view(torch.int16), torchs[keep].view(torch.int16))


def test_workaround_applies_to_bf16_on_the_interpreter_only():
    assert interp_bf16(torch.bfloat16)
    assert not interp_bf16(torch.float16) and not interp_bf16(torch.float32)


@pytest.mark.parametrize("layout", ["row", "col"])
def test_bf16_rung_is_bit_identical_to_torch_on_cpu(layout):
    """fp32-accumulated, RTNE-rounded: the same answer torch's CPU bf16 matmul gives."""
    import kernels
    a, b = kernels.spec("gemm").make_inputs((37, 29, 53), torch.bfloat16, seed=3, layout=layout)
    assert torch.equal(kernels.get("gemm", 2)(a, b), torch.matmul(a, b))
