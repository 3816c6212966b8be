"""What the FP8 expert-parallel layer's dispatch sends (:meth:`kernels.moe.ep_fp8_layer._Float8Owner.wire`),
per row-local recipe and activation dtype, in one process: one row per token (quantized
before the k-fold gather of its slots), of the recipe's token operand bytes exactly as the
grouped GEMM would quantize the rows, and the scales beside them; the bytes per row against
the activation dtype's (and at DeepSeek-V3's dim, the shares the layer's docstring and the
README state); and that the owner's backward dequantizes them to x's dtype (each product
rounded to float32, then to x's dtype)."""
from __future__ import annotations

import types

import pytest
import torch

from kernels.comm import row_bytes
from kernels.gemm_fp8.quantize_ref import dequantize
from kernels.moe.ep_fp8_layer import _Float8Owner
from kernels.moe.grouped_gemm_fp8.quantize import ROW_LOCAL
from kernels.moe.grouped_gemm_fp8.training import token_operand

TOKENS, DIM = 5, 160     # DIM: two 128-blocks and five 32-blocks, the last ones ragged
SCALE_BYTES = {"rowwise": 4, "blockwise": 4 * 2, "mxfp8": 5}
"""The scales of a 160-element row: one float32, one per 128 elements, one e8m0 byte per 32."""


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("recipe", list(ROW_LOCAL))
def test_wire_rows_are_the_token_operand_and_its_scales(recipe, dtype):
    fp8 = torch.float8_e4m3fn
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(TOKENS, DIM, generator=gen) * torch.logspace(-2, 2, DIM)).to(dtype)
    layer = types.SimpleNamespace(recipe=recipe, fp8_dtype=fp8, ep_capacity=None, fp8_dispatch=True,
                                  scale_rule=None)
    owner = _Float8Owner(layer)
    wire = owner.wire(x)
    assert wire.dtype == torch.uint8 and wire.shape == (TOKENS, DIM + SCALE_BYTES[recipe])
    assert wire.shape[1] / (DIM * dtype.itemsize) < {4: 0.27, 2: 0.53}[dtype.itemsize]   # bf16: about half
    x8, sx = row_bytes.unpack(wire, owner.parts)
    want8, want_scale = token_operand(x, recipe, fp8)
    assert torch.equal(x8.view(torch.uint8), want8.view(torch.uint8)) and torch.equal(sx, want_scale)
    assert owner.dtype == dtype
    assert owner.wire(x[:0]).shape == (0, wire.shape[1])      # a rank without tokens sends no row
    back = owner.dequantized(wire)   # dequantize's accuracy: tests/test_fp8_quantize.py
    assert back.dtype == dtype and back.shape == x.shape
    exact = dequantize(want8, want_scale, ROW_LOCAL[recipe], torch.float64)   # q·s is a float64 value
    assert torch.equal(back, exact.float().to(dtype))         # rounded to float32, then to x's dtype


@pytest.mark.parametrize("recipe, share", [("rowwise", "50.0"), ("blockwise", "51.6"), ("mxfp8", "51.6")])
def test_at_deepseek_v3s_dim_a_row_is_about_half_of_bf16s(recipe, share):
    layer = types.SimpleNamespace(recipe=recipe, fp8_dtype=torch.float8_e4m3fn, ep_capacity=None, fp8_dispatch=True,
                                  scale_rule=None)
    wire = _Float8Owner(layer).wire(torch.randn(1, 7168, dtype=torch.bfloat16))
    assert f"{100 * wire.shape[1] / (2 * 7168):.1f}" == share


def test_without_fp8_dispatch_the_rows_travel_as_they_are():
    layer = types.SimpleNamespace(recipe="delayed", fp8_dtype=torch.float8_e4m3fn, ep_capacity=None,
                                  fp8_dispatch=False)
    x = torch.randn(TOKENS, DIM)
    assert _Float8Owner(layer).wire(x) is x
