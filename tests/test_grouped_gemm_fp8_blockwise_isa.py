"""The blockwise recipe's three launches of the FP8 grouped GEMM (v0's ``aot()`` list, after
the row-wise ones: forward, dX, dW with scales per 128 along the reduction), compiled ahead
of time on gfx942 (fnuz) and gfx950 (OCP) for grouped GEMM's DeepSeek-V3 down projection.

What the docstrings of :mod:`kernels.moe.grouped_gemm_fp8.v0_one_launch` and ``.dw`` claim
for this mode: the hot loop covers one 128 x 128 x 128 step on FP8 MFMA only, and scales
inside it (VALU multiplies and FMAs on the fp32 partial product, which the row-wise loop
does not have, and scale loads beside the operand loads); no 8- or 16-bit LDS access;
nothing compared against the reduction length in the loop; no VGPR or SGPR spill and no
scratch; the occupancy (waves per SIMD) of the row-wise launch it replaces; dW's operand
loads stay 16 bytes wide.
"""
from __future__ import annotations

import re
from collections import Counter

import pytest

from workbench import isa
from workbench.isa import parse as isa_parse

LAUNCHES = {"forward": 0, "dx": 1, "dw": 2}      # row-wise; the blockwise twin is 3 on
MACS_PER_STEP = 128 * 128 * 128
FP8_MFMA = {"gfx942": "fp8_fp8", "gfx950": "f8f6f4"}
SCALING = ("v_mul_f32", "v_pk_mul_f32", "v_fma_f32", "v_pk_fma_f32")


def _loop_ops(report) -> Counter:
    return Counter(m for m in map(isa_parse.mnemonic, report.hot_loop.splitlines()) if m)


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
@pytest.mark.parametrize("launch", LAUNCHES)
def test_blockwise_launches_scale_fp8_mfma_products_in_the_loop_without_spills(launch, target):
    reports = isa.inspect_all("grouped_gemm_fp8", "v0", target)
    rowwise, report = reports[LAUNCHES[launch]], reports[LAUNCHES[launch] + 3]
    assert report.kernel_name == rowwise.kernel_name
    ops = _loop_ops(report)
    shapes = [(re.fullmatch(rf"v_mfma_f32_(\d+)x(\d+)x(\d+)_{FP8_MFMA[target]}", op), n) for op, n in ops.items()]
    macs = sum(int(m[1]) * int(m[2]) * int(m[3]) * n for m, n in shapes if m)
    assert macs * report.options["num_warps"] >= MACS_PER_STEP, report.matrix_instructions
    assert all(m.startswith("v_mfma_f32_") and m.endswith(FP8_MFMA[target])
               for m in report.matrix_instructions), report.matrix_instructions
    scaling = sum(n for op, n in ops.items() if op.startswith(SCALING))
    assert scaling > 0 and not any(op.startswith(SCALING) for op in _loop_ops(rowwise)), ops
    loads = {op: n for op, n in ops.items() if op.startswith(("buffer_load", "global_load"))}
    assert any(op.endswith("dword") for op in loads), loads          # the block's scales
    assert report.lds_bytes > 0 and report.narrow_lds_ops == 0, sorted(ops)
    assert not any(op.startswith("v_cmp") for op in ops)
    assert (report.spills, report.sgpr_spills, report.scratch_bytes) == (0, 0, 0), report.summary()
    assert report.occupancy.value == rowwise.occupancy.value >= 2, report.summary()
    if launch == "dw":   # a step's two 128 x 128 one-byte tiles, in 16-byte loads per lane
        steps = macs * report.options["num_warps"] // MACS_PER_STEP
        lanes = report.options["num_warps"] * 64
        wide = sum(n for op, n in loads.items() if op.endswith("dwordx4"))
        assert wide * 16 >= steps * 2 * 128 * 128 // lanes, loads
