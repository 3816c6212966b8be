"""The model on the compiled attention forward ladder (v2-v4) on gfx942 (MI300X) and gfx950
(MI355X): causal work skipped, uneven programs, the ladder's order against its docstrings.

Each rung is compiled once per target for the whole suite (the ISA inspector's cache; the
validation test reuses gfx950's); a compile takes seconds, hence ``slow``.
"""
from __future__ import annotations

import functools

import pytest

import roofline
from kernels.attention import spec
from workbench import cli
from workbench.model import attention, predict, predict_backward

pytestmark = pytest.mark.slow

SHAPE = (4, 32, 8, 4096, 4096, 128, 1)   # "llama3-8b S=4K causal"
GPUS = ("MI300X", "MI355X")


@functools.lru_cache(maxsize=None)
def _predict(rung: str, shape: tuple = SHAPE, gpu: str = "MI300X"):
    return predict("attention", rung, shape, "bf16", gpu)


def _open(shape: tuple) -> tuple:
    return (*shape[:6], 0)


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("rung", ("v2", "v3", "v4"))
def test_every_rung_is_predicted_with_its_inputs(rung, gpu):
    p = _predict(rung, SHAPE, gpu)
    assert 0 < p.tflops <= roofline.spec(gpu).peak("bf16")
    assert p.time_s * p.tflops * 1e12 == pytest.approx(spec.flops(SHAPE))
    assert p.bound in p.breakdown
    assert all(source for _, source in p.inputs.values())
    assert "unmasked key loop per wave and iteration" in p.inputs
    assert p.label == "model" and "[model]" in repr(p)


@pytest.mark.parametrize("gpu", GPUS)
def test_the_ladder_gets_faster_causal_and_not(gpu):
    """The docstrings: v3 skips the masked half and drops the masks from the main loop; v4's
    tiles and pipeline beat v3's."""
    for shape in (SHAPE, _open(SHAPE)):
        times = [_predict(r, shape, gpu).time_s for r in ("v2", "v3", "v4")]
        assert times == sorted(times, reverse=True), (shape, times)


def test_v5s_forward_is_v3s_launch():
    """v5's autograd forward launches v3's kernel with v3's config; its backward is predict_backward's."""
    v3, v5 = _predict("v3"), _predict("v5")
    assert (v5.rung, v5.time_s, v5.inputs["compiled kernel"]) == ("v5", v3.time_s, v3.inputs["compiled kernel"])
    assert "backward: predict_backward" in v5.inputs["config"][1]


def test_v2_computes_the_masked_half_and_v3_skips_it():
    wasted = {r: _predict(r).inputs["key tiles computed / visible (query, key) pairs"][0] for r in ("v2", "v3")}
    assert wasted["v2"] == pytest.approx(2.0, rel=0.01)   # every tile of S_k, twice the visible pairs
    assert wasted["v3"] == pytest.approx(1.0, rel=0.05)   # only the diagonal tiles' masked half is wasted
    assert _predict("v2").time_s == pytest.approx(_predict("v2", _open(SHAPE)).time_s)   # causal or not
    assert _predict("v3").time_s < 0.6 * _predict("v3", _open(SHAPE)).time_s


def test_causal_programs_are_uneven_and_leave_slots_idle():
    idle = "idle slots (uneven programs, last wave)"
    assert _predict("v4").breakdown[idle] > _predict("v4", _open(SHAPE)).breakdown[idle]


def test_the_softmax_exp_runs_at_the_transcendental_rate():
    """Every key tile exponentiates BLOCK_M x BLOCK_N scores: at least that many v_exp_f32
    lanes per iteration, each charged 16 cycles, in the VALU the model weighs against the MFMAs."""
    p = _predict("v4")
    cfg = p.inputs["config"][0]
    unmasked = p.inputs["unmasked key loop per wave and iteration"][0]
    assert unmasked["of them transcendental"] * 64 * cfg["num_warps"] >= cfg["BLOCK_M"] * cfg["BLOCK_N"]
    assert p.inputs["transcendental_cycles"] == (16, "LLVM-SCHED")


def test_v3_on_gfx942_repeats_mfmas_and_v4_does_not():
    """v3's 64-row tile over 4 waves with 32x32 MFMAs: the compile issues more MFMA work per
    iteration than the tile's QKᵀ + PV (waves repeat rows), v4's 16x16 prior exactly that."""
    ratio = "MFMA work per iteration / the tile's QKᵀ + PV"
    assert _predict("v3").inputs[ratio][0] > 1
    assert _predict("v4").inputs[ratio][0] == 1


def test_cli_predicts_attention(capsys):
    assert cli.main(["predict", "attention", "--rung", "v4", "--shape", "4x32x8x4096x4096x128x1"]) == 0
    out = capsys.readouterr().out
    assert "attention" in out and f"{_predict('v4').row()['TFLOP/s']:.3g}" in out.split()


def test_cli_predicts_the_backward_pass(capsys):
    """``--backward``: the backward pass's row, as :func:`workbench.model.predict_backward` gives
    it, the footer says which pass; an op without a modelled backward is named with the ones
    that have one."""
    shape = "4x32x8x4096x4096x128x1"
    assert cli.main(["predict", "attention", "--backward", "--shape", shape, "--gpu", "H200"]) == 0
    out = capsys.readouterr().out
    want = predict_backward("attention", "v5", tuple(map(int, shape.split("x"))), gpu="H200")
    assert f"{want.row()['TFLOP/s']:.3g}" in out.split() and "backward pass" in out.splitlines()[-1]
    assert cli.main(["predict", "gemm", "--backward"]) == 2
    assert "backward passes of ops attention, grouped_gemm, moe, not gemm's" in capsys.readouterr().err
    assert cli.main(["predict", "--against", "rows.json", "--backward"]) == 2
    assert "drop --backward" in capsys.readouterr().err


def test_v5s_backward_is_both_launches_and_the_delta():
    """v5's docstring: seven products per pair against the forward's two; the model charges
    the dK/dV and dQ launches (their own compiled loops and occupancy) and Δ's bytes."""
    p = predict_backward("attention", "v5", SHAPE, "bf16", "MI300X")
    assert p.time_s * p.tflops * 1e12 == pytest.approx(spec.backward_flops(SHAPE))
    launches = p.inputs["dkdv launch (ms)"][0] + p.inputs["dq launch (ms)"][0]
    assert p.time_s * 1e3 == pytest.approx(launches + p.breakdown["Δ preprocess: HBM"] * 1e3, rel=1e-3)
    assert p.time_s > 3.5 * _predict("v3").time_s
    assert predict_backward("attention", "v5", _open(SHAPE), "bf16", "MI300X").time_s > p.time_s
    assert p.label == "model" and all(source for _, source in p.inputs.values())
