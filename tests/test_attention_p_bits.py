"""v3's P_BITS path: P rounded to bf16 in integer operations on gfx942 (which has no fp32 ->
bf16 instruction), run here under the interpreter against torch's round-to-nearest-even."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kernels.attention import v3_causal_lse
from kernels.attention.launch import p_bits


@triton.jit
def _round_kernel(x_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    rounded = v3_causal_lse._bf16_by_bits(tl.load(x_ptr + i))
    tl.store(out_ptr + i, rounded.to(tl.uint16, bitcast=True).to(tl.int32))


def test_p_rounds_to_bf16_as_torch_does():
    """Every value P can hold (0..1, ties to even, the smallest normals and subnormals,
    inf) and any quiet NaN (what arithmetic such as exp2 returns), which must stay NaN."""
    ties = torch.tensor([0x3F808000, 0x3F818000, 0x3F80C000, 0x3F807FFF, 0x3F7F8000], dtype=torch.int32)
    x = torch.cat([torch.rand(200), torch.rand(40) * 1e-38, ties.view(torch.float32),
                   torch.tensor([0.0, 1.0, 2.0 ** -126, 2.0 ** -149, float("inf")])])
    x = torch.cat([x, torch.zeros(512 - x.numel())])
    out = torch.empty(512, dtype=torch.int32)
    _round_kernel[(1,)](x, out, N=512)
    expected = x.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
    assert torch.equal(out, expected)
    nan = torch.tensor([float("nan"), -float("nan")] * 8)
    bits = torch.tensor([0x7FC00000, 0x7FFFFFFF, 0x7FC12345, 0xFFC00001 - 2 ** 32] * 4, dtype=torch.int32)
    out = torch.empty(16, dtype=torch.int32)
    for values in (nan, bits.view(torch.float32)):
        _round_kernel[(1,)](values, out, N=16)
        assert out.to(torch.int16).view(torch.bfloat16).isnan().all()


@pytest.mark.parametrize("dtype,backend,arch,expected", [
    (torch.bfloat16, "hip", "gfx942", True), (torch.bfloat16, "hip", "gfx950", False),
    (torch.float16, "hip", "gfx942", False), (torch.bfloat16, "cuda", "sm_90", False),
    (torch.bfloat16, "interpreter", "cpu", False)])
def test_p_bits_only_where_no_conversion_instruction(dtype, backend, arch, expected):
    assert p_bits(dtype, backend, arch) is expected
