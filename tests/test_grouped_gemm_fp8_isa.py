"""FP8 grouped GEMM's machine code, compiled ahead of time on gfx942 (fnuz operands) and
gfx950 (OCP) for the three launches of a training step (v0's ``aot()`` order): the
forward, the backward's dX (the same kernel on wᵀ) and the backward's dW kernel. Each hot
loop runs the whole tile step on FP8 MFMA (the loop's MFMAs, times their M·N·K and the
waves of a program, cover one 128 x 128 x 128 step), stages its operands through LDS with
no 8- or 16-bit LDS access anywhere in the kernel, compares nothing against the reduction
length (the peeled tail; dW's masked first and last tiles), spills nothing, and its
occupancy is reported. dW's operands arrive token-contiguous and its loop starts at a
16-aligned token, so every global load of its hot loop is 16 bytes wide. The launch is
grouped GEMM's DeepSeek-V3 down projection.
"""
from __future__ import annotations

import re

import pytest

from workbench import isa
from workbench.isa import parse as isa_parse

KERNELS = {"forward": "_grouped_gemm_fp8_kernel", "dx": "_grouped_gemm_fp8_kernel",
           "dw": "_grouped_dw_fp8_kernel"}
MACS_PER_STEP = 128 * 128 * 128
FP8_MFMA = {"gfx942": "fp8_fp8", "gfx950": "f8f6f4"}


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_training_launches_run_fp8_mfma_through_lds_without_spills(kernel, target):
    report = isa.inspect_all("grouped_gemm_fp8", "v0", target)[list(KERNELS).index(kernel)]
    assert report.kernel_name == KERNELS[kernel]
    ops = [m for m in map(isa_parse.mnemonic, report.hot_loop.splitlines()) if m]
    shapes = [re.fullmatch(rf"v_mfma_f32_(\d+)x(\d+)x(\d+)_{FP8_MFMA[target]}", op) for op in ops]
    macs = sum(int(m[1]) * int(m[2]) * int(m[3]) for m in shapes if m)
    assert macs * report.options["num_warps"] >= MACS_PER_STEP, report.matrix_instructions
    assert all(m.startswith("v_mfma_f32_") and m.endswith(FP8_MFMA[target])
               for m in report.matrix_instructions), report.matrix_instructions
    assert report.lds_bytes > 0 and any(op.startswith("ds_read") for op in ops)
    assert report.narrow_lds_ops == 0, sorted(set(ops))
    assert not any(op.startswith("v_cmp") for op in ops)
    assert (report.spills, report.sgpr_spills, report.scratch_bytes) == (0, 0, 0), report.summary()
    assert report.occupancy.value >= 1 and report.occupancy.limited_by
    if kernel == "dw":
        loads = [op for op in ops if op.startswith(("buffer_load", "global_load"))]
        assert loads and all(op.endswith("dwordx4") for op in loads), loads
