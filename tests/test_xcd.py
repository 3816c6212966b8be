"""NUM_XCDS comes from the device (CUs / CUs per XCD), with an environment override."""
from __future__ import annotations

import pytest

from kernels import backend, xcd


@pytest.mark.parametrize("arch, cus, expected", [
    ("gfx942", 304, 8),    # MI300X, MI325X
    ("gfx942", 228, 6),    # MI300A
    ("gfx942", 38, 1),     # MI300X in CPX mode: one XCD per process
    ("gfx942", 76, 2),     # DPX
    ("gfx950", 256, 8),    # MI355X
    ("gfx950", 32, 1),
    ("gfx90a", 110, 1),    # MI250X GCD: one L2, nothing to remap
])
def test_xcds_from_cu_count(arch, cus, expected):
    assert xcd.xcds_for("hip", arch, cus) == expected


def test_other_backends_have_one():
    assert xcd.xcds_for("cuda", "sm_90", 132) == 1
    assert xcd.num_xcds(backend.Backend("interpreter", "cpu", "CPU", 0)) == 1


def test_device_and_override(monkeypatch):
    mi300a = backend.Backend("hip", "gfx942", "AMD Instinct MI300A", 228)
    monkeypatch.delenv(xcd.ENV_VAR, raising=False)
    assert xcd.num_xcds(mi300a) == 6
    monkeypatch.setenv(xcd.ENV_VAR, "4")
    assert xcd.num_xcds(mi300a) == 4
    monkeypatch.setenv(xcd.ENV_VAR, "zero")
    with pytest.raises(ValueError, match="KERNELS_NUM_XCDS"):
        xcd.num_xcds(mi300a)


def test_rungs_take_the_device_count(monkeypatch):
    """v3/v4 configs follow the device; ahead-of-time compiles show the whole chip."""
    from kernels.gemm import v3_grouped_order, v4_lds_pipeline
    for module in (v3_grouped_order, v4_lds_pipeline):
        assert module.config("hip", "gfx942", 6)["NUM_XCDS"] == 6
        assert module.config("hip", "gfx942")["NUM_XCDS"] == 8
        assert module.config("cuda", "sm_90")["NUM_XCDS"] == 1
