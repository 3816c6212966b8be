"""Roofline arithmetic: min(peak, bandwidth x intensity), which roof binds, % of roof."""

import pytest

import roofline

MI300X = roofline.spec("MI300X")


def test_ridge_is_peak_over_bandwidth():
    assert MI300X.ridge("bf16") == pytest.approx(1307.4 / 5.3)
    assert MI300X.ridge("fp32", "lds") == pytest.approx(163.4 / 81.7)


def test_attainable_below_and_above_the_ridge():
    ridge = MI300X.ridge("bf16")
    assert roofline.attainable(MI300X, 10, "bf16") == pytest.approx(53.0)
    assert roofline.attainable(MI300X, ridge * 0.5, "bf16") == pytest.approx(1307.4 / 2)
    assert roofline.attainable(MI300X, ridge * 4, "bf16") == 1307.4
    assert roofline.attainable("mi300x", 10, "bf16", level="l2") == pytest.approx(344.0)


def test_bound_switches_at_the_ridge():
    ridge = MI300X.ridge("bf16")
    assert roofline.bound(MI300X, ridge * 0.99, "bf16") == "hbm"
    assert roofline.bound(MI300X, ridge, "bf16") == "compute"
    assert roofline.bound(MI300X, ridge * 1.01, "bf16") == "compute"


def test_hierarchical_intensity_picks_the_lowest_roof():
    # HBM roof 5.3 * 1000 = 5300 is above the peak; the L2 roof 34.4 * 10 = 344 binds.
    assert roofline.attainable(MI300X, {"hbm": 1000, "l2": 10}, "bf16") == pytest.approx(344)
    assert roofline.bound(MI300X, {"hbm": 1000, "l2": 10}, "bf16") == "l2"
    assert roofline.roofs(MI300X, {"hbm": 1, "lds": 1}, "fp32") == \
        {"compute": 163.4, "hbm": 5.3, "lds": 81.7}


def test_percent_of_roof():
    assert roofline.percent_of_roof(MI300X, 10, "bf16", 26.5) == pytest.approx(50.0)
    assert roofline.percent_of_roof(MI300X, 10_000, "bf16", 1307.4) == pytest.approx(100.0)


def test_dtype_spellings_fold():
    torch_like = type("D", (), {"__str__": lambda self: "torch.bfloat16"})()
    for spelling in ("bf16", "BF16", "bfloat16", torch_like):
        assert roofline.dtype_name(spelling) == "bf16"
    assert roofline.dtype_name("float8_e4m3fnuz") == "fp8"
    assert roofline.dtype_name("xf32") == "tf32"
    assert roofline.attainable(MI300X, 10_000, "float16") == 1307.4


@pytest.mark.parametrize("call, match", [
    (lambda: roofline.attainable("MI250X", 10, "fp8"), "MI250X has no fp8"),
    (lambda: roofline.attainable(MI300X, 10, "fp12"), "unknown dtype"),
    (lambda: roofline.attainable(MI300X, 0, "bf16"), "positive"),
    (lambda: roofline.attainable(MI300X, -1, "bf16"), "positive"),
    (lambda: roofline.attainable(MI300X, 10, "bf16", level="l3"), "no bandwidth for level"),
    (lambda: roofline.attainable("H100", 10, "bf16", level="lds"), "H100 SXM has no bandwidth"),
    (lambda: roofline.percent_of_roof(MI300X, 10, "bf16", -5), "measured_tflops"),
])
def test_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
