"""Point records: derived intensity and TFLOP/s, validated source and dtype."""

import pytest

import roofline


def test_point_computes_intensity_and_tflops():
    flops, nbytes = 2 * 4096**3, 3 * 2 * 4096**2
    p = roofline.point("mi300x", "v3_mfma", flops, nbytes, 0.5, "bfloat16", "measured",
                       op="gemm", shape=(4096, 4096, 4096), date="2026-11-30")
    assert p.intensity == pytest.approx(flops / nbytes)
    assert p.tflops == pytest.approx(flops / 0.5e-3 / 1e12)
    assert (p.gpu, p.dtype, p.shape, p.rung, p.op) == \
        ("MI300X", "bf16", "4096x4096x4096", "v3_mfma", "gemm")


@pytest.mark.parametrize("kwargs, match", [
    ({"source": "guessed"}, "source must be one of"),
    ({"dtype": "fp12"}, "unknown dtype"),
    ({"ms": 0}, "ms must be"),
    ({"flops": -1}, "flops must be"),
    ({"bytes_moved": 0}, "bytes_moved must be"),
])
def test_point_rejects_bad_input(kwargs, match):
    args = dict(gpu="MI300X", name="ref", flops=1e9, bytes_moved=1e6, ms=1.0, dtype="bf16",
                source="recorded")
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        roofline.point(**args)


def test_point_record_is_frozen_and_validated():
    p = roofline.Point("ref", "gemm", "64x64x64", "fp16", 10.0, 1.0, 0.1, "model", "MI300X")
    with pytest.raises(AttributeError):
        p.tflops = 2.0
    with pytest.raises(ValueError, match="intensity"):
        roofline.Point("ref", "gemm", "s", "fp16", 0.0, 1.0, 0.1, "model", "MI300X")


@pytest.mark.parametrize("nbytes, roof", [(2 * 4096**3 / 10, 5.3 * 10), (3 * 2 * 4096**2, 1307.4)])
def test_a_ceiling_point_sits_on_the_lower_roof_and_says_so_in_its_name(nbytes, roof):
    """Memory-bound (10 FLOP/byte: the HBM roof) and compute-bound (the bf16 peak) on MI300X."""
    flops = 2 * 4096**3
    p = roofline.ceiling_point("mi300x", "v3_mfma", flops, nbytes, "bfloat16", op="gemm", shape=(4096,) * 3)
    assert (p.rung, p.source, p.dtype, p.shape) == ("v3_mfma (ceiling)", "model", "bf16", "4096x4096x4096")
    assert p.tflops == pytest.approx(roof) == roofline.attainable("MI300X", flops / nbytes, "bf16")
    assert p.ms == pytest.approx(flops / (roof * 1e9))
    assert roofline.percent_of_roof("MI300X", p.intensity, "bf16", p.tflops) == pytest.approx(100)
    with pytest.raises(ValueError, match="bytes_moved must be"):
        roofline.ceiling_point("MI300X", "v3_mfma", flops, 0, "bf16")
