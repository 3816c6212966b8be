"""FP8 grouped GEMM's machine code, compiled ahead of time on gfx942 (fnuz operands) and
gfx950 (OCP) for the three launches of a training step (v0's ``aot()`` order): the
forward, the backward's dX (the same kernel on wᵀ) and the backward's dW kernel. Each hot
loop runs the whole tile step on FP8 MFMA (the loop's MFMAs, times their M·N·K and the
waves of a program, cover one 128 x 128 x 128 step), stages its operands through LDS with
no 8- or 16-bit LDS access anywhere in the kernel, compares nothing against the reduction
length (the peeled tail; dW's masked first and last tiles), spills nothing, and its
occupancy is reported. dW's operands arrive token-contiguous and its loop starts at a
16-aligned token, so every global load of its hot loop is 16 bytes wide. The launch is
grouped GEMM's DeepSeek-V3 down projection. In the hybrid format (dy in e5m2) dX and dW
multiply e4m3 by e5m2 on the mixed-format MFMAs, with no conversion and no spill.
"""
from __future__ import annotations

import re

import pytest

from fresh_compiles import results
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


HYBRID_COMPILE = """
import torch
from kernels.moe.grouped_gemm_fp8 import v0_one_launch
from workbench.isa import compile as isa_compile, inspector


def result(job):
    arch, fp8_name, grad = job
    fp8, reports = getattr(torch, fp8_name), []
    for aot in v0_one_launch.aot(fp8, "hip", arch, grad_dtype=getattr(torch, grad))[1:3]:   # dX, dW (row-wise scales)
        r = inspector.read_kernel("grouped_gemm_fp8", "v0", arch, fp8_name,
                                  isa_compile.compile_aot(aot, ("hip", arch, 64)))
        loop = [line.split() for line in r.hot_loop.splitlines() if "v_mfma" in line]
        reports.append(dict(name=r.kernel_name, matrix=sorted(r.matrix_instructions), narrow_lds=r.narrow_lds_ops,
                            loop=sorted({" ".join([w[0], *(t for t in w if t.startswith(("cbsz:", "blgp:")))])
                                         for w in loop}),
                            spills=[r.spills, r.sgpr_spills, r.scratch_bytes]))
    return reports
"""
HYBRID = [
    ("gfx942", "float8_e4m3fnuz", "float8_e5m2fnuz", "v_mfma_f32_16x16x32_fp8_bf8", "v_mfma_f32_16x16x32_bf8_fp8"),
    ("gfx950", "float8_e4m3fn", "float8_e5m2", "v_mfma_f32_16x16x128_f8f6f4 blgp:1",
     "v_mfma_f32_16x16x128_f8f6f4 cbsz:1"),
]


def _hybrid_reports() -> dict[str, list[dict]]:
    """Per arch, the dX and dW kernels' reports of :data:`HYBRID`'s targets, both archs in one
    fresh process (importing torch and the kernels there costs seconds)."""
    jobs = tuple((arch, fp8, grad) for arch, fp8, grad, *_ in HYBRID)
    return {arch: reports for (arch, *_), reports in results(HYBRID_COMPILE, jobs).items()}


@pytest.mark.slow   # two AOT compiles per arch, both archs in one fresh process
@pytest.mark.parametrize("arch, fp8, grad, dx_mfma, dw_mfma", HYBRID, ids=["gfx942", "gfx950"])
def test_hybrid_dx_and_dw_multiply_e4m3_by_e5m2_on_one_mixed_mfma(arch, fp8, grad, dx_mfma, dw_mfma):
    """dX's A is dy (e5m2) and B wᵀ (e4m3); dW's A is xᵀ (e4m3) and B dyᵀ (e5m2). Triton feeds
    B's tile as the MFMA's src0 and A's as src1, so on gfx942 dX runs ``fp8_bf8`` (src0's
    format first) and dW ``bf8_fp8``; on gfx950 the f8f6f4 MFMA flags the e5m2 source, src1
    in ``blgp`` (dX) and src0 in ``cbsz`` (dW), 1 = bf8. Every MFMA of the kernel is that one,
    and nothing spills or crosses LDS 8 or 16 bits at a time. A fresh process: one that ran
    interpreted kernels cannot compile."""
    dx, dw = _hybrid_reports()[arch]
    for report, name, mfma in ((dx, KERNELS["dx"], dx_mfma), (dw, KERNELS["dw"], dw_mfma)):
        assert report["name"] == name
        assert report["loop"] == [mfma] and report["matrix"] == [mfma.split()[0]], report
        assert report["spills"] == [0, 0, 0] and report["narrow_lds"] == 0, report
