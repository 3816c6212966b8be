"""The model on the grouped GEMM ladder (v1, v2, v4) and the FP8 GEMM (v1), compiled for
gfx942 (MI300X) and gfx950 (MI355X). One compile per rung and target for the suite (the
ISA inspector's cache), seconds each, hence ``slow``.
"""
from __future__ import annotations

import functools

import pytest
import torch

import kernels
import roofline
from workbench import cli, isa
from workbench.model import gemm, grouped_gemm, loop, predict, tile_schedule

pytestmark = pytest.mark.slow

DOWN = kernels.spec("grouped_gemm").bench_shapes["dsv3 down (32 experts)"]
SKEWED = kernels.spec("grouped_gemm").bench_shapes["dsv3 gate+up skewed"]
SQUARE = (8192, 8192, 8192)
GPUS = ("MI300X", "MI355X")


@functools.lru_cache(maxsize=None)
def _predict(op: str, rung: str, shape: tuple, gpu: str = "MI300X", dtype: str = "bf16"):
    return predict(op, rung, shape, dtype, gpu)


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("rung", grouped_gemm.RUNGS)
def test_every_grouped_rung_is_predicted(rung, gpu):
    p = _predict("grouped_gemm", rung, DOWN, gpu)
    assert 0 < p.tflops <= roofline.spec(gpu).peak("bf16")
    assert p.time_s * p.tflops * 1e12 == pytest.approx(kernels.spec("grouped_gemm").flops(DOWN))
    assert p.inputs["rows per group"][0] == [1024] * 32 and p.inputs["row tiles"][0] == 32 * 1024 // 128
    assert p.bound in p.breakdown and p.label == "model"


@pytest.mark.parametrize("shape", [DOWN, SKEWED], ids=["balanced", "skewed"])
def test_one_launch_beats_a_launch_per_expert(shape):
    """v2's docstring: every expert's tiles fill the CUs together, the last partial wave
    paid once, not once per expert (v1's launch gaps are not even modelled)."""
    assert _predict("grouped_gemm", "v2", shape).time_s < _predict("grouped_gemm", "v1", shape).time_s


def test_persistent_beats_one_launch():
    """v4's docstring: no surplus programs (v2's 32 x 56 = 1792 scan the offsets and exit) and
    one offsets scan per program, not one per tile; the model charges both from the
    compiled schedule (:mod:`workbench.model.tile_schedule`)."""
    v2, v4 = (_predict("grouped_gemm", r, DOWN) for r in ("v2", "v4"))
    s2, s4 = (p.inputs["tile schedule (cycles)"][0] for p in (v2, v4))
    assert s2["surplus programs"] == 32 * 56 and s4["surplus programs"] == 0
    assert s2["once"] == 0 < s4["once"] and s4["per tile"] < s2["per tile"]
    assert v4.time_s < v2.time_s


@pytest.mark.parametrize("rung", ["v2", "v4"])
def test_the_schedule_is_weighed_from_its_compiled_lines(rung):
    """The offsets are loaded on the scan's lines (a latency the first operand loads wait
    on) and located without a load; both issue instructions in the compiled kernel."""
    _, report = grouped_gemm.compiled(rung, "forward", DOWN, torch.bfloat16, "gfx942", 304)
    scan, locate = (tile_schedule.instructions(report, f) for f in (tile_schedule.SCAN, tile_schedule.LOCATE))
    loads = lambda ops: [op for op in ops if op.startswith(("buffer_load", "global_load", "s_load", "s_buffer_load"))]
    assert loads(scan) and not loads(locate) and len(locate) > 10


@pytest.mark.parametrize("gpu", GPUS)
def test_fp8_runs_on_fp8_mfmas_and_loads_one_byte_per_element(gpu):
    spec = roofline.spec(gpu)
    p = _predict("gemm_fp8", "v1", SQUARE, gpu, "fp8")
    mix = p.inputs["hot loop per wave and iteration"][0]
    assert all("fp8" in op or "f8f6f4" in op for op in mix["MFMAs"])
    cfg, steps = p.inputs["config"][0], p.inputs["K steps per iteration"][0]
    assert cfg["num_warps"] * mix["global bytes"] == steps * (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"]
    assert 0 < p.tflops <= spec.peak("fp8")


@pytest.mark.parametrize("gpu", GPUS)
def test_fp8_beats_the_bf16_ladder_at_a_large_square(gpu):
    """gemm_fp8 v1's docstring: the FP8 matrix cores do twice the multiply-adds per cycle."""
    assert _predict("gemm_fp8", "v1", SQUARE, gpu, "fp8").time_s < _predict("gemm", "v4", SQUARE, gpu).time_s


@pytest.mark.parametrize("gpu", GPUS)
def test_fp8_v2_scales_each_k_block_on_the_vector_units(gpu):
    """gemm_fp8 v2 multiplies each K block's partial product by its scales on the fp32
    accumulator, where v1 scales once per tile in the epilogue: at the same config, the same
    FP8 MFMAs in the hot loop and more VALU work, so the model puts v2 below v1."""
    v1, v2 = (_predict("gemm_fp8", rung, SQUARE, gpu, "fp8") for rung in ("v1", "v2"))
    assert v1.inputs["config"][0] == v2.inputs["config"][0]
    mix1, mix2 = (p.inputs["hot loop per wave and iteration"][0] for p in (v1, v2))
    assert mix2["MFMAs"] == mix1["MFMAs"] and mix2["global bytes"] > mix1["global bytes"]   # + the scales
    assert v2.breakdown["VALU"] > v1.breakdown["VALU"] and v1.time_s < v2.time_s


def test_v1_compiles_gemm_v4s_kernel_per_expert():
    report = isa.inspect("grouped_gemm", "v1", "gfx942", torch.bfloat16)
    cfg = grouped_gemm.config("v1", DOWN, "gfx942", 304)[0]
    assert cfg == gemm.plan("v4", (1024, 7168, 2048), "gfx942", 304).cfg
    assert loop.mix(report.hot_loop, "gfx942").mfma   # the K loop is the hot loop


def test_cli_predicts_fp8_by_default_and_says_which_dtype_it_takes(capsys):
    """The FP8 ops' model covers fp8 only: with no ``--dtype`` (and in the Python API, with no
    dtype) they are predicted in fp8, where the other ops take bf16; another dtype is refused."""
    want = f"{_predict('gemm_fp8', 'v1', SQUARE, 'MI300X', 'fp8').row()['TFLOP/s']:.3g}"
    for dtype in (["--dtype", "fp8"], []):
        assert cli.main(["predict", "gemm_fp8", *dtype, "--shape", "8192x8192x8192"]) == 0
        assert want in capsys.readouterr().out.split()
    assert predict("gemm_fp8", "v1", SQUARE).time_s == _predict("gemm_fp8", "v1", SQUARE, "MI300X", "fp8").time_s
    assert cli.main(["predict", "grouped_gemm_fp8"]) == 0
    assert " fp8 " in capsys.readouterr().out
    assert cli.main(["predict", "gemm_fp8", "--dtype", "bf16"]) == 2
    assert "covers fp8" in capsys.readouterr().err
