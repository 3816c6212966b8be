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
