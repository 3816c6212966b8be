"""Pins the interpreter bugs the kernels work around (kernels/triton_support.py): two in
bf16, one in the fp32 -> FP8 cast.

If an upgrade of Triton fixes them, the "still wrong upstream" tests fail: then the
INTERP_BF16 / INTERP_FP8 workaround can be removed from the kernels.
"""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kernels.triton_support import fp8_grid, interp_bf16, round_to_bf16, round_to_fp8


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
    low_payload_nans = torch.tensor([0x7F800001, 0x7F80FFFF, -0x007FFFFF], dtype=torch.int32).view(torch.float32)
    special = torch.cat([special, low_payload_nans])   # NaNs a truncation would turn into +-inf
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


@triton.jit
def _fp8_kernel(x_ptr, y_ptr, FIX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr, N: tl.constexpr):
    r = tl.arange(0, N)
    x = tl.load(x_ptr + r)
    if FIX:
        x = round_to_fp8(x, MANT, EMIN)
    tl.store(y_ptr + r, x.to(y_ptr.dtype.element_ty))


def _to_fp8(x: torch.Tensor, dtype: torch.dtype, fix: bool) -> torch.Tensor:
    y = torch.empty(x.shape, dtype=dtype)
    _fp8_kernel[(1,)](x, y, FIX=fix, **fp8_grid(dtype), N=x.numel())
    return y


FP8 = [torch.float8_e4m3fn, torch.float8_e4m3fnuz]


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_interpreter_fp8_cast_still_drops_the_carry_upstream(dtype):
    x = torch.tensor([7.99, 31.9, 127.9, -63.97] + [1.0] * 12)   # each rounds up to a power of two
    assert (_to_fp8(x, dtype, fix=False).float() != x.to(dtype).float()).any()


@pytest.mark.parametrize("dtype", FP8 + [torch.float8_e5m2, torch.float8_e5m2fnuz], ids=str)
def test_hand_rounding_to_fp8_matches_torch(dtype):
    """Every binade, both signs, ties, subnormals and zeros, within the format's range."""
    info = torch.finfo(dtype)
    gen = torch.Generator().manual_seed(0)
    x = torch.cat([torch.linspace(-info.max, info.max, 4096),
                   (torch.arange(2048) - 1024.0) * info.smallest_normal / 16,   # subnormal ties
                   torch.randn(1024, generator=gen) * 4, torch.randn(1024, generator=gen) / 64,
                   torch.tensor([0.0, -0.0] * 512)]).float()[:8192]
    ours, torchs = _to_fp8(x, dtype, fix=True), x.to(dtype)
    assert torch.equal(ours.view(torch.uint8), torchs.view(torch.uint8))



def test_the_fp8_grid_reads_mantissa_bits_from_the_format_not_torch_finfo():
    """torch reports e5m2fnuz's epsilon as 2^-3 (a 3-bit mantissa's); the format has 2 bits."""
    assert torch.finfo(torch.float8_e5m2fnuz).eps == 0.125   # what fp8_grid's docstring cites; fixed: drop both
    assert fp8_grid(torch.float8_e5m2fnuz) == dict(MANT=2, EMIN=-15)
    assert fp8_grid(torch.float8_e5m2) == dict(MANT=2, EMIN=-14)
