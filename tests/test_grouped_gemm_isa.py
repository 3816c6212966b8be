"""Grouped GEMM's machine code, compiled ahead of time: v2's and v4's forward, the
backward's dX launch (the same kernel on wᵀ) and the dW kernel, on gfx942 and gfx950
(v4 with its tuned prior: the table's first kept config for the launch).

Each kernel's hot loop must run the whole tile product on MFMA (the loop's MFMAs, times
their M·N·K and the waves of a program, cover one 128 x 128 x 64 step), stage its
operands through LDS with no 8- or 16-bit access, compare nothing against the reduction length (the peeled tail),
spill nothing, and keep the two waves per SIMD its ``waves_per_eu`` asks for. The launch is DeepSeek-V3's down projection
(:data:`kernels.moe.grouped_gemm.launch.AOT_SHAPE`).
"""
from __future__ import annotations

import re

import pytest

from workbench import isa
from workbench.isa import parse as isa_parse

KERNELS = ["forward", "dx", "dw"]            # v2's and v4's aot() order
FORWARD = {"v2": "_grouped_gemm_kernel", "v4": "_grouped_gemm_persistent_kernel"}
MACS_PER_STEP = 128 * 128 * 64


def _loop_ops(report) -> list[str]:
    return [m for m in map(isa_parse.mnemonic, report.hot_loop.splitlines()) if m]


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("rung", ["v2", "v4"])
def test_kernels_use_mfma_stage_through_lds_and_do_not_spill(rung, kernel, target):
    report = isa.inspect_all("grouped_gemm", rung, target)[KERNELS.index(kernel)]
    assert report.kernel_name == (FORWARD[rung] if kernel != "dw" else "_grouped_dw_kernel")
    ops = _loop_ops(report)
    shapes = [re.match(r"v_mfma_f32_(\d+)x(\d+)x(\d+)_bf16", op) for op in ops]
    macs = sum(int(m[1]) * int(m[2]) * int(m[3]) for m in shapes if m)
    assert macs * report.options["num_warps"] >= MACS_PER_STEP, report.matrix_instructions
    assert report.lds_bytes > 0 and any(op.startswith("ds_read") for op in ops)
    staged = any(op.startswith("ds_write") for op in ops) or any(
        map(isa_parse.loads_into_lds, report.hot_loop.splitlines()))
    assert staged, sorted(set(ops))
    assert not any(op.startswith("v_cmp") for op in ops)    # the peeled tail: no compare per step
    assert (report.spills, report.sgpr_spills, report.scratch_bytes) == (0, 0, 0), report.summary()
    assert report.narrow_lds_ops == 0, report.hot_loop   # operands move through LDS 16 bytes at a time
    assert report.occupancy.value >= 2 and report.occupancy.limited_by


def test_v1_launches_gemm_v4s_kernel():
    """v1's docstring: each expert's launch is GEMM v4's kernel, MFMA and no spills."""
    report = isa.inspect("grouped_gemm", "v1", "gfx942")
    assert report.kernel_name == "_gemm_pipelined_kernel"
    assert report.matrix_instructions and (report.spills, report.sgpr_spills) == (0, 0), report.summary()


def test_v4_compiles_one_kernel_on_request_and_refuses_an_unknown_one():
    """How ``workbench.isa.tune_space`` compiles each candidate three times."""
    report = isa.inspect_all("grouped_gemm", "v4", "gfx942", overrides={"kernel": "dw"})
    assert [r.kernel_name for r in report] == ["_grouped_dw_kernel"]
    with pytest.raises(RuntimeError, match="kernel must be one of"):
        isa.inspect_all("grouped_gemm", "v4", "gfx942", overrides={"kernel": "dgrad"})


@pytest.mark.parametrize("rung", ["v2", "v4"])
def test_one_lds_tile_per_operand_on_gfx942_a_second_on_gfx950(rung):
    """Notebook 03: at num_stages=2 the gfx942 forward keeps one LDS tile of A and one of B
    (the prefetched K step waits in registers; the loop is unrolled twice, so
    ``prefetches_into_registers``' one-step pattern does not apply); gfx950 loads straight
    into LDS, so its prefetch needs a second tile of each, as GEMM v4's does."""
    reports = {t: isa.inspect("grouped_gemm", rung, t) for t in ("gfx942", "gfx950")}
    tiles = (128 * 64 + 64 * 128) * 2    # one bf16 tile of A and one of B, 128 x 128 x 64 (MACS_PER_STEP)
    assert reports["gfx942"].options["num_stages"] == 2 and reports["gfx942"].lds_bytes == tiles == 32768
    assert 2 * tiles < reports["gfx950"].lds_bytes == isa.inspect("gemm", "v4", "gfx950").lds_bytes
    assert any(map(isa_parse.loads_into_lds, reports["gfx950"].hot_loop.splitlines()))
    assert not any(map(isa_parse.loads_into_lds, reports["gfx942"].asm.splitlines()))
