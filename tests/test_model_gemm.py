"""The model on the compiled GEMM ladder: every rung with an ahead-of-time compile, on
gfx942 (MI300X) and gfx950 (MI355X), and the ladder's order against its docstrings.

Compiles are cached per process by the ISA inspector; still a minute or more each on a
busy CPU the first time, hence ``slow``.
"""
from __future__ import annotations

import functools

import pytest
import torch

import kernels
import roofline
from workbench import cli, isa
from workbench.isa import waits as isa_waits
from workbench.isa.parse import category, mnemonic
from workbench.model import gemm, loop, predict

pytestmark = pytest.mark.slow

SHAPE = (4096, 4096, 4096)
GPUS = ("MI300X", "MI355X")


@functools.lru_cache(maxsize=None)
def _predict(rung: str, shape: tuple, gpu: str, dtype: str = "bf16"):
    return predict("gemm", rung, shape, dtype, gpu)


def test_the_model_covers_every_aot_rung():
    """A new GEMM rung (or variant beside the ladder) with an ``aot`` must be added to the
    model, not skipped silently."""
    rungs = kernels.variants("gemm") + kernels.registry.beside("gemm")
    assert [r.label for r in rungs if r.aot is not None] == list(gemm.RUNGS)


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("rung", gemm.RUNGS)
def test_every_rung_is_predicted_with_its_inputs(rung, gpu):
    p = _predict(rung, SHAPE, gpu)
    assert 0 < p.tflops <= roofline.spec(gpu).peak("bf16")
    assert p.time_s * p.tflops * 1e12 == pytest.approx(2 * 4096 ** 3)
    assert p.bound in p.breakdown
    assert all(source for _, source in p.inputs.values())
    assert any(name.startswith("MFMA cycles v_mfma") for name in p.inputs)
    assert p.label == "model" and "[model]" in repr(p)


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("rung", gemm.RUNGS)
def test_hot_loop_loads_one_tile_of_a_and_b_per_k_step(rung, gpu):
    """The loop the model weighs is the K loop: per iteration a workgroup loads its A and B
    blocks once per K step it covers (the compiler may unroll the loop)."""
    spec = roofline.spec(gpu)
    plan = gemm.plan(rung, SHAPE, spec.target, spec.compute_units)
    report = isa.inspect("gemm", rung, spec.target, torch.bfloat16, overrides=plan.overrides or None)
    mix = loop.mix(report.hot_loop, spec.target)
    steps = gemm.steps_per_iteration(plan.cfg, report.options["num_warps"], mix.mfma_flops)
    cfg = plan.cfg
    assert report.options["num_warps"] * mix.global_bytes == \
        steps * (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"] * 2


def test_fp16_runs_at_its_own_measured_clock():
    p = _predict("v4", SHAPE, "MI300X", "fp16")
    assert p.inputs["engine clock under MFMA load (MHz)"] == (1115, "MAF2")
    assert p.dtype == "fp16" and p.tflops > 0


def test_fp32_without_a_measured_clock_says_it_uses_the_spec_clock():
    p = _predict("v4", SHAPE, "MI300X", "fp32")
    clock, source = p.inputs["engine clock under MFMA load (MHz)"]
    assert clock == 2100 and "spec clock_ghz" in source
    assert any(name.endswith("_f32") for name in p.inputs["hot loop per wave and iteration"][0]["MFMAs"])
    assert 0 < p.tflops <= roofline.spec("MI300X").peak("fp32")


@pytest.mark.parametrize(("lower", "upper", "shape"), [
    ("v2", "v3", (8192, 8192, 8192)),
    ("v4", "v5", (8192, 8192, 8192)),
    ("v5", "v6", (3072, 4096, 8192)),   # 384 tiles of 128x256 on 304 CUs: v6 splits the tail's K
])
@pytest.mark.parametrize("gpu", GPUS)
def test_each_rung_is_not_slower_than_the_one_below(lower, upper, shape, gpu):
    """The docstrings claim each rung is faster at these shapes (v3: no slower where v2 is
    not memory bound); v4 claims no win over v3 (the test below)."""
    assert _predict(upper, shape, gpu).time_s <= _predict(lower, shape, gpu).time_s


def _global_waits(report) -> list[bool]:
    """For each global load the hot loop waits for: was it issued in the previous iteration?"""
    return [previous for w in isa_waits.waits(report.hot_loop) for text, previous in w.retires
            if category(mnemonic(text), "amdgcn") == "global_load"]


@pytest.mark.parametrize("gpu", GPUS)
def test_v4_is_below_v3_for_the_reasons_its_docstring_gives(gpu):
    """v4's docstring: ``waves_per_eu=2`` halves v3's waves per SIMD, and on gfx942 the
    pipeline's loads are waited on in the iteration that issues them (on gfx950 some only
    in the next); the model, which weighs those waves, puts v4 below v3 at 8192³."""
    spec, shape = roofline.spec(gpu), (8192, 8192, 8192)
    v3, v4 = (isa.inspect("gemm", r, spec.target, torch.bfloat16) for r in ("v3", "v4"))
    assert (v3.occupancy.value, v4.occupancy.value) == (4, 2)
    carried = _global_waits(v4)
    assert carried and any(carried) == (spec.target == "gfx950") and not all(carried)
    assert _predict("v4", shape, gpu).time_s > _predict("v3", shape, gpu).time_s


def test_cli_predict_prints_labelled_rows(capsys):
    assert cli.main(["predict", "gemm", "--rung", "v4", "--shape", "4096x4096x4096", "--gpu", "MI300X"]) == 0
    out = capsys.readouterr().out
    assert "model" in out.splitlines()[2] and "v4" in out and "4096x4096x4096" in out
    assert f"{_predict('v4', SHAPE, 'MI300X').tflops:.3g}" in out.split()   # 3 significant digits


def test_cli_predict_names_what_is_covered(capsys):
    assert cli.main(["predict", "gemm_mxfp4"]) == 2
    assert "gemm, attention" in capsys.readouterr().err
