"""The FP8 step's cost model (workbench.model.fp8_cost): its arithmetic, redone here by hand from
the datasheet numbers and the byte counts stated in the quantize kernel's docstring."""
from __future__ import annotations

import math

import pytest

from workbench.model import fp8_cost

# MI300X datasheet numbers (roofline/specs/mi300x.yaml), pinned: TFLOP/s and TB/s
BF16, FP8, HBM = 1307.4, 2614.9, 5.3


def _ms(flops, nbytes, peak):
    return max(flops / (peak * 1e12), nbytes / (HBM * 1e12)) * 1e3


def _blockwise_quantize_bytes(t, n, k):
    """bf16 in (2 B), q and q_t out (1 B each) for x and dy; w once (q_t is q.T); fp32 scales."""
    def cdiv(a, b):
        return -(-a // b)
    x = t * k * 4 + 4 * (t * cdiv(k, 128) + k * cdiv(t, 128))
    dy = t * n * 4 + 4 * (t * cdiv(n, 128) + n * cdiv(t, 128))
    w = n * k * 3 + 4 * cdiv(n, 128) * cdiv(k, 128)
    return x + dy + w


@pytest.mark.parametrize("shape", [(8192, 8192, 8192), (300, 1000, 77)])
def test_step_cost_is_the_roofline_time_of_each_kernel_summed(shape):
    t, n, k = shape
    cost = fp8_cost.step_cost("MI300X", "blockwise", shape)
    gemms = [(t, n, k), (t, k, n), (n, k, t)]
    high = sum(_ms(2 * a * b * c, 2 * (a * c + c * b + a * b), BF16) for a, b, c in gemms)
    fp8 = sum(_ms(2 * a * b * c, (a * c + c * b) + 2 * a * b, FP8) for a, b, c in gemms)
    quant = _blockwise_quantize_bytes(t, n, k) / (HBM * 1e12) * 1e3
    assert cost.high_gemm_ms == pytest.approx(high, rel=1e-12)
    assert cost.fp8_gemm_ms == pytest.approx(fp8, rel=1e-12)
    assert cost.quantize_ms == pytest.approx(quant, rel=1e-12)
    assert cost.speedup == pytest.approx(high / (fp8 + quant), rel=1e-12)
    assert cost.quantize_share == pytest.approx(quant / (fp8 + quant), rel=1e-12)


def test_at_8192_cubed_the_compute_bound_gemms_halve_and_quantization_takes_a_tenth():
    cost = fp8_cost.step_cost("MI300X", "blockwise", (8192, 8192, 8192))
    assert cost.fp8_gemm_ms == pytest.approx(cost.high_gemm_ms * BF16 / FP8, rel=1e-12)
    assert cost.high_gemm_ms == pytest.approx(3 * 2 * 8192 ** 3 / (BF16 * 1e9), rel=1e-12)
    assert 0.09 < cost.quantize_share < 0.11


def test_tensorwise_reads_twice_and_writes_no_transposed_copy():
    t = n = k = 1024
    cost = fp8_cost.step_cost("MI300X", "tensorwise", (t, n, k))
    assert cost.quantize_ms == pytest.approx(3 * (t * k * (2 * 2 + 1) + 4) / (HBM * 1e12) * 1e3, rel=1e-12)


def test_delayed_casts_x_w_and_dy_once_with_their_known_scales():
    """x, w and dy (a Linear's, each from its amax history): bf16 read once, FP8 written, the
    given scale read, one fp32 tile maximum per 128 x 128 tile written and read back, the amax
    written."""
    t, n, k = 300, 1000, 77

    def cast(rows, cols):
        return rows * cols * 3 + 4 + 2 * 4 * math.ceil(rows / 128) * math.ceil(cols / 128) + 4
    cost = fp8_cost.step_cost("MI300X", "delayed", (t, n, k))
    want = cast(t, k) + cast(n, k) + cast(t, n)
    assert cost.quantize_ms == pytest.approx(want / (HBM * 1e12) * 1e3, rel=1e-12)
    for gpu in ("MI300X", "MI355X"):   # the cheapest quantization: it breaks even first, blockwise next
        even = {r: fp8_cost.break_even(gpu, r) for r in ("delayed", "blockwise", "tensorwise")}
        assert even["delayed"] <= even["blockwise"] < even["tensorwise"]


@pytest.mark.parametrize("gpu,recipe", [("MI300X", "blockwise"), ("MI300X", "rowwise"),
                                        ("MI355X", "mxfp8"), ("MI355X", "tensorwise")])
def test_break_even_is_where_the_sign_of_the_gain_flips(gpu, recipe):
    n = fp8_cost.break_even(gpu, recipe)
    assert n is not None and 256 < n < 4096
    assert fp8_cost.step_cost(gpu, recipe, (n, n, n)).speedup > 1
    assert fp8_cost.step_cost(gpu, recipe, (n - 1, n - 1, n - 1)).speedup <= 1


def test_break_even_by_hand_for_square_blockwise_on_mi300x():
    """Near n = 950 the bf16 GEMMs are compute-bound (intensity n/3 above the bf16 ridge,
    247 FLOP/B) but the FP8 ones are not (intensity n/2 below the FP8 ridge, 493): bf16 takes
    6 n^3 / P_bf16, FP8 moves 12 n^2 bytes of GEMM traffic plus about 11 n^2 of quantization.
    Equal at n = 23 P_bf16 / (6 HBM); the scales' bytes move it up a little."""
    n = fp8_cost.break_even("MI300X", "blockwise")
    assert n / 3 > BF16 / HBM and n / 2 < FP8 / HBM
    assert n == pytest.approx(23 * BF16 / (6 * HBM), rel=0.01)


def test_mxfp8_never_pays_where_it_is_emulated_on_the_bf16_matrix_cores():
    assert fp8_cost.fp8_peak("MI300X", "mxfp8") == BF16
    assert fp8_cost.fp8_peak("MI355X", "mxfp8") == fp8_cost.fp8_peak("MI355X", "blockwise") == 5033.2
    assert fp8_cost.break_even("MI300X", "mxfp8") is None
    assert fp8_cost.step_cost("MI300X", "mxfp8", (8192,) * 3).speedup < 1


def test_points_are_model_points_on_the_roofs_named_as_ceilings():
    """Roofline times, not predictions of a kernel: each point's name says it is a ceiling."""
    q = fp8_cost.quantize_point("MI300X", "block1x128")
    assert q.source == "model" and q.intensity < 2 and q.rung == "quantize block1x128 +T (ceiling)"
    assert q.tflops == pytest.approx(HBM * q.intensity)
    assert q.ms == pytest.approx((8192 * 8192 * 4 + 4 * 2 * 8192 * 64) / (HBM * 1e9))
    g = fp8_cost.gemm_point("MI300X", recipe="blockwise")
    assert g.source == "model" and g.dtype == "fp8" and g.tflops == pytest.approx(FP8)
    assert g.rung == "gemm fp8 (blockwise) (ceiling)"
    assert fp8_cost.gemm_point("MI300X", recipe="mxfp8").dtype == "bf16"


def test_rows_and_curve_say_model_and_cover_each_gpu_and_recipe():
    rows = fp8_cost.cost_rows()
    assert {(r["gpu"], r["recipe"]) for r in rows} == {(g, r) for g in ("MI300X", "MI355X")
                                                         for r in fp8_cost.QUANTIZED}
    assert all(r["source"] == "model" for r in rows)
    curve = fp8_cost.speedup_curve(gpus=("MI355X",), sizes=(256, 8192))
    assert len(curve) == 2 * len(fp8_cost.QUANTIZED) and all(math.isfinite(r["speedup"]) for r in curve)


def test_quantize_rows_count_bytes_per_element_by_hand():
    rows = {(r["granularity"], r["transposed_copy"]): r for r in fp8_cost.quantize_rows(shape=(1024, 1024))}
    # bf16 read once (twice for tensor and row: the amax pass), one byte per FP8 copy, fp32 scales
    assert rows["block1x128", True]["bytes_per_element"] == 2 + 2 + 2 * 4 / 128
    assert rows["row", False]["bytes_per_element"] == 2 * 2 + 1 + 4 / 1024
    assert rows["mx32", True]["bytes_per_element"] == 2 + 2 + 2 * 1 / 32
    assert rows["block128x128", False]["bytes_per_element"] == 2 + 1 + 4 / 128 ** 2
    assert rows["mx32", True]["MI300X_us"] == pytest.approx(1024 * 1024 * (4 + 1 / 16) / (HBM * 1e6))


@pytest.mark.parametrize("call, complaint", [
    (lambda: fp8_cost.step_cost("MI300X", "nvfp4", (8, 8, 8)), "recipe must be one of"),
    (lambda: fp8_cost.step_cost("MI300X", "rowwise", (8, 0, 8)), "three positive sizes"),
    (lambda: fp8_cost.step_cost("MI300X", "rowwise", (8, 8)), "three positive sizes"),
])
def test_bad_input_is_refused_clearly(call, complaint):
    with pytest.raises(ValueError, match=complaint):
        call()
