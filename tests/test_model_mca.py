"""The model's hot-loop cycles against LLVM's scheduling model (``llvm-mca``), on gfx942.

Skipped where no ``llvm-mca`` 19+ is installed (``apt-get install llvm-19`` on Debian 12).
``llvm-mca`` counts AMDGPU resources in issue slots of 4 cycles (an MFMA pass; one wave64
VALU instruction), so its numbers are a quarter of the model's cycles.
"""
from __future__ import annotations

import pytest
import torch

import roofline
from workbench import isa
from workbench.model import gemm, loop, machine, mca

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(mca.binary() is None, reason="no llvm-mca 19+ on the PATH")]

SLOT = 4  # cycles per llvm-mca AMDGPU resource unit


@pytest.mark.parametrize("rung", gemm.RUNGS)
def test_matrix_and_valu_cycles_agree_with_llvm(rung):
    spec = roofline.spec("MI300X")
    plan = gemm.plan(rung, (4096, 4096, 4096), spec.target, spec.compute_units)
    report = isa.inspect("gemm", rung, spec.target, torch.bfloat16, overrides=plan.overrides or None)
    mix = loop.mix(report.hot_loop, spec.target)
    got = mca.pressure(report.hot_loop, spec.target)
    assert SLOT * got["HWXDL"] == mix.mfma_cycles, (got, mix.mfma)
    assert SLOT * got["HWVALU"] == mix.valu * machine.constant("valu_cycles").value, got


def test_loop_body_drops_what_mca_cannot_take():
    text = ".LBB0_1:\n\tbuffer_load_dwordx4 v[0:3], v4, s[0:3], 0 offen\n\tv_add_u32_e32 v1, 1, v1 ; x\n" \
           "\t.loc 1 2 3\n\ts_cbranch_scc1 .LBB0_1\n"
    assert mca.loop_body(text) == "v_add_u32_e32 v1, 1, v1\n"
