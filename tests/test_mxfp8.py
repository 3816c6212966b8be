"""MXFP8 (e4m3 elements, e8m0 scales per 32 along K): the gemm_mxfp4 rung's second format and
kernels.gemm_fp8.mx_matmul, fed by quantize(..., "mx32").

Judged by the harness like MXFP4 (float64 reference of the dequantized operands, poisoned
output, bf16 dequantize-and-matmul baseline); the ISA tests back the docstrings' claims
about what tl.dot_scaled becomes for e4m3 operands on each target.
"""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels.gemm_fp8 import mx_matmul, quantize
from kernels.gemm_mxfp4.formats import MXFP8
from workbench import isa
from workbench.check import check_rung

SPEC = kernels.spec("gemm_mxfp4")
V0 = kernels.get("gemm_mxfp4", "v0")


@pytest.mark.parametrize("layout", ("row", "col"))
def test_v0_passes_the_harness_on_mxfp8(layout):
    assert V0.supports(MXFP8)
    for shape in (*SPEC.smoke_shapes, (3, 5, 7)):   # K = 53, 7: a partial last scale block
        report = check_rung(V0, shape, MXFP8, layout=layout)
        assert report.passed, report.message


def test_mx_matmul_from_the_fused_quantize_is_x_at_w_t():
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(37, 259, generator=gen), torch.randn(29, 259, generator=gen)
    xq, xs = quantize(x, "mx32", MXFP8)
    wq, ws = quantize(w, "mx32", MXFP8)
    y = mx_matmul(xq, xs, wq.t(), ws, out_dtype=torch.float32)
    expected = SPEC.reference(xq, xs, wq, ws)
    torch.testing.assert_close(y.double(), expected, rtol=1e-6, atol=1e-5)
    assert (y - x @ w.t()).abs().max() < 0.1 * (x @ w.t()).abs().max()


def test_spec_counts_a_byte_per_element_plus_scales():
    assert SPEC.bytes_moved((8, 4, 53), MXFP8) == (8 + 4) * (53 + 2) + 8 * 4 * 2


@pytest.mark.parametrize("change,error,match", [
    (dict(a=torch.zeros(6, 64, dtype=torch.float8_e4m3fnuz)), TypeError, "a has dtype float8_e4m3fnuz"),
    (dict(b=torch.zeros(64, 5, dtype=torch.float8_e5m2)), TypeError, "b has dtype float8_e5m2"),
    (dict(a_scale=torch.zeros(6, 3, dtype=torch.uint8)), ValueError, r"a_scales has shape \(6, 3\)"),
    (dict(b_scale=torch.zeros(2, 5, dtype=torch.uint8)), ValueError, r"b_scales has shape \(2, 5\)"),
    (dict(a_scale=torch.zeros(6, 2)), TypeError, "a_scales has dtype float32"),
])
def test_bad_inputs_are_refused_by_name(change, error, match):
    a, sa, b_t, sb = SPEC.make_inputs((6, 5, 64), MXFP8, seed=1)
    args = {**dict(a=a, a_scale=sa, b=b_t.t(), b_scale=sb), **change}
    with pytest.raises(error, match=match):
        mx_matmul(**args)


@pytest.mark.parametrize("m,n,k", [(0, 5, 64), (6, 0, 64), (6, 5, 0)])
def test_empty_operands(m, n, k):
    a, sa = quantize(torch.randn(m, k), "mx32", MXFP8)
    b_t, sb = quantize(torch.randn(n, k), "mx32", MXFP8)
    assert torch.equal(mx_matmul(a, sa, b_t.t(), sb), torch.zeros(m, n, dtype=torch.bfloat16))


def test_compiles_into_the_graph():
    a, sa, b_t, sb = SPEC.make_inputs((9, 7, 96), MXFP8, seed=2)
    compiled = torch.compile(lambda *xs: mx_matmul(*xs).float().relu(), fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(a, sa, b_t.t(), sb), mx_matmul(a, sa, b_t.t(), sb).float().relu())


def test_gfx950_runs_mxfp8_on_the_scaled_mfma_without_spills():
    report = isa.inspect("gemm_mxfp4", "v0", "gfx950", dtype=MXFP8)
    assert report.dtype == "float8_e4m3fn"
    assert set(report.matrix_instructions) == {"v_mfma_scale_f32_16x16x128_f8f6f4"}, report.summary()
    assert (report.spills, report.sgpr_spills, report.scratch_bytes) == (0, 0, 0), report.summary()
    assert report.lds_bytes <= 160 * 1024


def test_gfx942_emulates_mxfp8_on_bf16_mfma():
    report = isa.inspect("gemm_mxfp4", "v0", "gfx942", dtype=MXFP8)
    assert set(report.matrix_instructions) == {"v_mfma_f32_32x32x8_bf16"}, report.summary()
    assert "mfma_scale" not in report.asm and report.spills == 0
