"""MXFP4 GEMM: the format (e2m1 codes, e8m0 scales, packing, rounding), every rung, the
public op, and the machine code each target makes of ``tl.dot_scaled``.

Rungs are judged by the harness rule in the *output* dtype (bf16 by default) against
the float64 product of the dequantized operands; the baseline dequantizes to bf16 and
calls torch.matmul (no library MXFP4 GEMM runs on the CPU).
"""
from __future__ import annotations

import pytest
import torch

import kernels
import roofline
from kernels.gemm_mxfp4 import FORMAT, dequantize_mxfp4, quantize_mxfp4
from kernels.gemm_mxfp4.formats import E2M1_VALUES, round_to_e2m1
from kernels.outputs import poisoned_outputs
from workbench import isa
from workbench.isa import compile as isa_compile
from workbench.check import check_rung, compare

SPEC = kernels.spec("gemm_mxfp4")
RUNGS = [r for r in kernels.variants("gemm_mxfp4") if r.runs_here()]
matmul_mxfp4 = kernels.matmul_mxfp4   # also registers torch.ops.kernels.matmul_mxfp4


def one_block(values, fill=0.0) -> torch.Tensor:
    """A (1, 32) row holding ``values`` first, then ``fill``."""
    row = torch.full((1, 32), fill)
    row[0, :len(values)] = torch.tensor(values)
    return row


def test_the_e2m1_grid_round_trips_exactly_and_packs_low_nibble_first():
    grid = [*E2M1_VALUES, *(-v for v in E2M1_VALUES[1:])]
    x = one_block(grid)
    packed, scales = quantize_mxfp4(x)
    assert packed.dtype == scales.dtype == torch.uint8
    assert packed.shape == (1, 16) and scales.tolist() == [[127]]       # amax 6: scale 2^0
    assert packed[0, 0].item() == 0x10 and packed[0, 3].item() == 0x76  # codes 0,1 and 6,7
    assert packed[0, 4].item() == 0xA9                                   # -0.5 (code 9), -1 (code 10)
    assert torch.equal(dequantize_mxfp4(packed, scales), x)


@pytest.mark.parametrize("value,expected", [
    (2.5, 2.0), (3.5, 4.0), (5.0, 4.0), (0.25, 0.0), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0),
    (-2.5, -2.0), (-5.0, -4.0), (5.5, 6.0), (2.4, 2.0), (7.0, 6.0), (100.0, 6.0), (-1e9, -6.0),
])
def test_round_to_nearest_even_and_saturate(value, expected):
    assert round_to_e2m1(torch.tensor([value])).item() == expected


def test_quantize_rounds_ties_to_even_inside_a_block():
    x = one_block([6.0, 2.5, 3.5, 5.0, 0.25, -0.75, 1.25])   # amax 6: scale 1, elements as given
    packed, scales = quantize_mxfp4(x)
    assert dequantize_mxfp4(packed, scales)[0, :7].tolist() == [6.0, 2.0, 4.0, 4.0, 0.0, -1.0, 1.0]


def test_shared_scale_is_floor_log2_amax_minus_emax():
    # amax 7: exponent floor(log2 7) - 2 = 0, 7 saturates at 6; amax 8: exponent 1; 0.75: -3
    for amax, scale, top in ((7.0, 127, 6.0), (8.0, 128, 8.0), (0.75, 124, 0.75), (1e-3, 115, 0.0009765625)):
        packed, scales = quantize_mxfp4(one_block([amax]))
        assert scales.item() == scale and dequantize_mxfp4(packed, scales)[0, 0].item() == top


def test_all_zero_block_nan_block_and_inf_block():
    x = torch.zeros(3, 64)
    x[1, 40] = float("nan")
    x[2, 3] = float("-inf")
    x[2, 50] = 1.0
    packed, scales = quantize_mxfp4(x)
    assert scales.tolist() == [[0, 0], [0, 0xFF], [0xFF, 125]]
    out = dequantize_mxfp4(packed, scales)
    assert torch.equal(out[0], torch.zeros(64))
    assert out[1, :32].eq(0).all() and out[1, 32:].isnan().all()      # NaN poisons only its block
    assert out[2, :32].isnan().all() and out[2, 50].item() == 1.0


def test_k_not_a_multiple_of_32_is_padded_with_zeros():
    x = torch.randn(4, 53, generator=torch.Generator().manual_seed(0))
    packed, scales = quantize_mxfp4(x, axis=1)
    assert packed.shape == (4, 32) and scales.shape == (4, 2)
    out = dequantize_mxfp4(packed, scales, axis=1)
    assert torch.equal(out[:, 53:], torch.zeros(4, 11))
    assert ((out[:, :53] - x).abs() <= 0.25 * x.abs().amax(dim=1, keepdim=True)).all()  # half a step at 4..6


def test_quantize_along_either_axis_and_requantizing_is_the_identity():
    x = torch.randn(70, 5, generator=torch.Generator().manual_seed(1)) * 1e-3
    packed, scales = quantize_mxfp4(x, axis=0)
    assert packed.shape == (48, 5) and scales.shape == (3, 5)
    t_packed, t_scales = quantize_mxfp4(x.t(), axis=1)
    assert torch.equal(packed.t(), t_packed) and torch.equal(scales.t(), t_scales)
    values = dequantize_mxfp4(packed, scales, axis=0)
    assert all(torch.equal(u, v) for u, v in zip(quantize_mxfp4(values, axis=0), (packed, scales)))


def test_bad_format_arguments():
    with pytest.raises(TypeError, match="floating-point"):
        quantize_mxfp4(torch.ones(2, 32, dtype=torch.int32))
    with pytest.raises(TypeError, match="scales must be uint8"):
        dequantize_mxfp4(torch.zeros(2, 16, dtype=torch.uint8), torch.zeros(2, 1))
    with pytest.raises(ValueError, match="16 bytes per scale"):
        dequantize_mxfp4(torch.zeros(2, 16, dtype=torch.uint8), torch.zeros(2, 2, dtype=torch.uint8))


def test_kernels_are_exact_in_fp32_out():
    """The interpreter computes tl.dot_scaled exactly: on these (seeded) inputs an fp32 C
    is the float64 reference rounded to fp32, bit for bit, from the rung and the public op."""
    inputs = SPEC.make_inputs((9, 7, 96), FORMAT, seed=3)
    expected = SPEC.reference(*inputs).float()
    for fn in (*(r for r in RUNGS if r.kind == "triton"), matmul_mxfp4):
        assert torch.equal(fn(*inputs, out_dtype=torch.float32), expected)


@pytest.mark.parametrize("rung", RUNGS, ids=lambda r: r.title)
@pytest.mark.parametrize("layout", ("row", "col"))
def test_every_rung_passes_the_harness_at_smoke_and_odd_shapes(rung, layout):
    for shape in (*SPEC.smoke_shapes, (33, 65, 224), (3, 5, 7)):
        report = check_rung(rung, shape, FORMAT, layout=layout)
        assert report.passed, report.message


@pytest.mark.parametrize("rung", RUNGS, ids=lambda r: r.title)
@pytest.mark.parametrize("out_dtype", (torch.bfloat16, torch.float16, torch.float32), ids=str)
def test_out_dtype_variants_are_fully_written(rung, out_dtype):
    inputs = SPEC.make_inputs((37, 29, 64), FORMAT, seed=5)
    baseline = kernels.registry.reference_rung("gemm_mxfp4")(*inputs, out_dtype=out_dtype)
    with poisoned_outputs():
        out = rung(*inputs, out_dtype=out_dtype)
    assert out.dtype == out_dtype and not out.isnan().any()
    assert compare(out, SPEC.reference(*inputs), baseline, out_dtype)["passed"]


def test_spec_counts_half_a_byte_per_element_plus_scales():
    assert SPEC.bytes_moved((8, 4, 64), FORMAT) == (8 + 4) * (32 + 2) + 8 * 4 * 2
    assert SPEC.bytes_moved((8, 4, 53), FORMAT) == SPEC.bytes_moved((8, 4, 64), FORMAT)
    with pytest.raises(TypeError, match="float4_e2m1fn_x2"):
        SPEC.make_inputs((4, 4, 32), torch.bfloat16)


def _operands():
    a, sa, b, sb = SPEC.make_inputs((6, 5, 64), FORMAT, seed=1)
    return dict(a_packed=a, a_scales=sa, b_packed=b, b_scales=sb)


@pytest.mark.parametrize("change,error,match", [
    (dict(a_packed=torch.zeros(6, 32)), TypeError, "a_packed has dtype float32"),
    (dict(b_scales=torch.zeros(5, 2, dtype=torch.int8)), TypeError, "b_scales has dtype int8"),
    (dict(b_packed=torch.zeros(5, 16, dtype=torch.uint8)), ValueError, "inner dimensions"),
    (dict(a_packed=torch.zeros(6, 24, dtype=torch.uint8), b_packed=torch.zeros(5, 24, dtype=torch.uint8)),
     ValueError, "multiple of 32"),
    (dict(a_scales=torch.zeros(6, 3, dtype=torch.uint8)), ValueError, r"a_scales has shape \(6, 3\)"),
    (dict(b_scales=torch.zeros(6, 2, dtype=torch.uint8)), ValueError, r"b_scales has shape \(6, 2\)"),
    (dict(a_scales=torch.zeros(6, 2, dtype=torch.uint8, device="meta")), ValueError, "a_scales is on meta"),
    (dict(b_packed=torch.zeros(5, 32, 1, dtype=torch.uint8)), ValueError, "b_packed must be 2-D"),
    (dict(out_dtype=torch.int8), TypeError, "out_dtype"),
], ids=["a-float", "scales-int8", "inner", "k-not-32", "a_scales-shape", "b_scales-shape", "device",
        "3-d", "out-int8"])
def test_bad_inputs_are_refused_by_name(change, error, match):
    args = {**_operands(), **change}
    for fn in (*RUNGS, matmul_mxfp4):
        with pytest.raises(error, match=match):
            fn(**args)


@pytest.mark.parametrize("m,n,k", [(0, 5, 64), (6, 0, 64), (6, 5, 0)])
def test_empty_operands_follow_matmul(m, n, k):
    """As kernels.matmul and matmul_fp8: an empty result for M or N = 0, zeros for K = 0."""
    a_packed, a_scales = quantize_mxfp4(torch.randn(m, k), axis=1)
    b_packed, b_scales = quantize_mxfp4(torch.randn(n, k), axis=1)
    out = matmul_mxfp4(a_packed, a_scales, b_packed, b_scales)
    assert out.dtype == torch.bfloat16 and torch.equal(out, torch.zeros(m, n, dtype=torch.bfloat16))
    assert out.shape == torch.matmul(torch.randn(m, k), torch.randn(k, n)).shape


def test_custom_op_and_compile():
    args = tuple(_operands().values())
    torch.library.opcheck(torch.ops.kernels.matmul_mxfp4.default, (*args, torch.bfloat16))
    compiled = torch.compile(lambda *xs: matmul_mxfp4(*xs).float().relu(), fullgraph=True,
                             backend="aot_eager")
    assert torch.equal(compiled(*args), matmul_mxfp4(*args).float().relu())


def test_roofline_places_the_op_under_the_mi355x_fp4_roof():
    """The op's dtype is the fp4 format, so its points and model use the fp4 peak; MI300X
    has no fp4 roof (its spec says not supported), which the profiler reports as such."""
    pytest.importorskip("ipywidgets", reason="the notebook extra is not installed (e.g. on a bare GPU image)")
    from workbench.widgets.ladder_rows import model_summary

    mi355x = roofline.spec("MI355X")
    shape = SPEC.bench_shapes["square 8192"]
    flops, traffic = SPEC.flops(shape), SPEC.bytes_moved(shape, FORMAT)
    model = model_summary(mi355x, flops, traffic, FORMAT)
    assert model["dtype"] == "fp4" and mi355x.peak("fp4") == 10066.3
    assert model["ridge"] == mi355x.ridge("fp4") == pytest.approx(10066.3 / mi355x.hbm_tbps)
    assert model["bound"] == "compute" and model["attainable_tflops"] == 10066.3
    recorded = roofline.point(mi355x, "v0", flops, traffic, 1.0, str(FORMAT), "recorded", op="gemm_mxfp4")
    assert recorded.dtype == "fp4"
    with pytest.raises(ValueError):
        model_summary(roofline.spec("MI300X"), flops, traffic, FORMAT)


# The machine code: what tl.dot_scaled becomes on each target (compiled ahead of time).

def test_isa_inspects_the_op_in_its_own_format_by_default():
    assert isa.default_dtype(kernels.get("gemm_mxfp4", "v0"), "gfx950") == FORMAT


def test_gfx950_uses_the_scaled_fp4_mfma_without_spills():
    report = isa.inspect("gemm_mxfp4", "v0", "gfx950")
    assert report.dtype == "float4_e2m1fn_x2"
    assert set(report.matrix_instructions) == {"v_mfma_scale_f32_16x16x128_f8f6f4"}, report.summary()
    assert (report.spills, report.sgpr_spills, report.scratch_bytes) == (0, 0, 0), report.summary()


def test_gfx942_emulates_on_bf16_mfma():
    report = isa.inspect("gemm_mxfp4", "v0", "gfx942")
    assert report.matrix_instructions and all(
        name.startswith("v_mfma_f32_") and name.endswith("_bf16") for name in report.matrix_instructions)
    assert "mfma_scale" not in report.asm
    assert (report.spills, report.sgpr_spills, report.scratch_bytes) == (0, 0, 0), report.summary()


def test_sm90_emulates_on_bf16_wgmma():
    report = isa.inspect("gemm_mxfp4", "v0", "sm90")
    assert report.matrix_instructions and all(
        name.startswith("wgmma.mma_async") and name.endswith(".bf16.bf16")
        for name in report.matrix_instructions), report.matrix_instructions


def test_sm100_uses_tcgen05_block_scaled_mma():
    """Blackwell is not an inspector target (no occupancy model for it here); the raw
    compile is enough to show the native instruction."""
    (kernel,) = isa_compile.compile_rung("gemm_mxfp4", "v0", ("cuda", 100, 32), "float4_e2m1fn_x2")
    assert "tcgen05.mma.cta_group::1.kind::mxf4.block_scale.block32" in kernel["asm"]
