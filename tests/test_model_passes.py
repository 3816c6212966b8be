"""The model on passes of several launches: grouped GEMM's backward (v2, v4: dX and dW), the
FP8 grouped GEMM (v0) and the MoE layer's top rung (v3, forward and backward), compiled for
gfx942 (MI300X) and gfx950 (MI355X). One compile per kernel, config and target for the suite
(the ISA inspector's cache), hence ``slow``.
"""
from __future__ import annotations

import functools

import pytest

import kernels
import roofline
from workbench.model import NotCovered, grouped_gemm_backward, machine, predict, predict_backward

pytestmark = pytest.mark.slow

DOWN = kernels.spec("grouped_gemm").bench_shapes["dsv3 down (32 experts)"]
QWEN = kernels.spec("moe").bench_shapes["qwen3-moe (128 experts)"]
GPUS = ("MI300X", "MI355X")


@functools.lru_cache(maxsize=None)
def _p(backward: bool, op: str, rung: str, shape: tuple, gpu: str = "MI300X", dtype: str = "bf16"):
    return (predict_backward if backward else predict)(op, rung, shape, dtype, gpu)


def _launch_ms(p) -> dict[str, float]:
    return {name: value for name, (value, _) in p.inputs.items() if name.endswith("(ms)")}


def _twice_t(shape: tuple) -> tuple:
    return (2 * shape[0],) + shape[1:]


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("rung", grouped_gemm_backward.RUNGS)
def test_grouped_backward_is_its_dx_and_dw_launches(rung, gpu):
    p, forward = _p(True, "grouped_gemm", rung, DOWN, gpu), _p(False, "grouped_gemm", rung, DOWN, gpu)
    assert p.time_s * p.tflops * 1e12 == pytest.approx(kernels.spec("grouped_gemm").backward_flops(DOWN))
    assert 0 < p.tflops <= roofline.spec(gpu).peak("bf16") and p.label == "model"
    assert set(_launch_ms(p)) == {"dX launch (ms)", "dW launch (ms)"}
    assert p.time_s * 1e3 == pytest.approx(sum(_launch_ms(p).values()), rel=1e-3)
    assert "dW: idle slots (uneven programs, last wave)" in p.breakdown
    assert 1.5 * forward.time_s < p.time_s < 3 * forward.time_s   # twice the forward's FLOPs, like kernels


def test_dw_balances_a_skewed_routing():
    """v4's docstring: dW's grid is exact and the dispatcher hands the next tile to whichever
    CU frees up, which balances a skewed routing: its dW costs what a balanced one's does."""
    skewed = kernels.spec("grouped_gemm").bench_shapes["dsv3 gate+up skewed"]
    balanced = kernels.spec("grouped_gemm").bench_shapes["dsv3 gate+up (32 experts)"]
    dw = {name: _launch_ms(_p(True, "grouped_gemm", "v4", shape))["dW launch (ms)"]
          for name, shape in (("skewed", skewed), ("balanced", balanced))}
    assert dw["skewed"] == pytest.approx(dw["balanced"], rel=0.05), dw


@pytest.mark.parametrize(("op", "rung", "shape", "dtype", "backward"), [
    ("grouped_gemm", "v4", DOWN, "bf16", True),
    ("grouped_gemm_fp8", "v0", DOWN, "fp8", False),
    ("moe", "v3", QWEN, "bf16", False),
    ("moe", "v3", QWEN, "bf16", True)])
def test_time_grows_with_the_tokens(op, rung, shape, dtype, backward):
    assert _p(backward, op, rung, _twice_t(shape), dtype=dtype).time_s > 1.5 * _p(
        backward, op, rung, shape, dtype=dtype).time_s


@pytest.mark.parametrize("gpu", GPUS)
def test_fp8_grouped_beats_bf16_grouped_v2(gpu):
    """grouped_gemm_fp8 v0's docstring: half the bytes and twice the multiply-adds per cycle
    of grouped GEMM v2 on bf16 operands."""
    p = _p(False, "grouped_gemm_fp8", "v0", DOWN, gpu, "fp8")
    mix = p.inputs["hot loop per wave and iteration"][0]
    assert mix["MFMAs"] and all("fp8" in op or "f8f6f4" in op for op in mix["MFMAs"])
    assert 0 < p.tflops <= roofline.spec(gpu).peak("fp8")
    assert p.time_s < _p(False, "grouped_gemm", "v2", DOWN, gpu).time_s


@pytest.mark.parametrize("gpu", GPUS)
def test_moe_forward_is_its_launches(gpu):
    p = _p(False, "moe", "v3", QWEN, gpu)
    launches = _launch_ms(p)
    assert set(launches) == {"gate_up launch (ms)", "down launch (ms)", "router (torch, fp32) (ms)", "k-sum (ms)"}
    assert p.time_s * 1e3 == pytest.approx(sum(launches.values()), rel=1e-3)
    assert p.time_s * p.tflops * 1e12 == pytest.approx(kernels.spec("moe").flops(QWEN))
    assert sum(p.inputs["rows per expert"][0]) == QWEN[0] * QWEN[4]
    # kernel 1's loop feeds two products (gate, up) from each A tile: twice the MFMA FLOPs per K step
    for kernel, products in (("gate_up", 2), ("down", 1)):
        cfg, steps = p.inputs[f"{kernel}: config"][0], p.inputs[f"{kernel}: K steps per iteration"][0]
        mfmas = p.inputs[f"{kernel}: hot loop per wave and iteration"][0]["MFMAs"]
        flops = sum(n * machine.mfma_flops(op) for op, n in mfmas.items()) * cfg["num_warps"]
        assert flops == products * steps * 2 * cfg["BLOCK_M"] * cfg["BLOCK_N"] * cfg["BLOCK_K"]
        assert p.breakdown[f"{kernel}: tile schedule"] > 0   # grouped GEMM v2's offsets scan, per program


@pytest.mark.parametrize("gpu", GPUS)
def test_moe_backward_runs_two_grouped_gemms_per_expert_gemm(gpu):
    """v3's docstring: the backward runs a dX and a dW grouped GEMM per expert GEMM on saved
    activations (no forward GEMM again): its six launches do twice the forward GEMMs' FLOPs."""
    p, forward = _p(True, "moe", "v3", QWEN, gpu), _p(False, "moe", "v3", QWEN, gpu)
    launches = _launch_ms(p)
    gemms = {name: ms for name, ms in launches.items() if name.endswith(("dX launch (ms)", "dW launch (ms)"))}
    assert len(gemms) == 6
    assert p.time_s * 1e3 == pytest.approx(sum(launches.values()), rel=1e-3)
    fwd_gemms = _launch_ms(forward)["gate_up launch (ms)"] + _launch_ms(forward)["down launch (ms)"]
    assert 1.5 * fwd_gemms < sum(gemms.values()) < 3 * fwd_gemms
    assert p.time_s * p.tflops * 1e12 == pytest.approx(kernels.spec("moe").backward_flops(QWEN))


def test_moe_backward_charges_one_swiglu_kernel_and_no_torch_elementwise_pass():
    """v3_backward: SwiGLU's derivative, the routing weights' gradient and h·w run in one kernel
    that reads dh, g, u and h and writes dg, du and h·w once (7 elements of x's dtype per
    (row, hidden) element, 8 fp32 bytes per row); torch only gathers dy's and x's rows."""
    t, dim, hidden, _, top_k, _ = QWEN
    streams = {name: ms for name, ms in _launch_ms(_p(True, "moe", "v3", QWEN)).items()
               if not name.endswith("launch (ms)")}
    assert [name for name in streams if "torch" in name] == ["gathers of dy and x (torch) (ms)"]
    rows = t * top_k
    assert streams["SwiGLU backward kernel (ms)"] / streams["gathers of dy and x (torch) (ms)"] == pytest.approx(
        rows * (7 * hidden * 2 + 8) / (4 * rows * dim * 2), rel=1e-3)


@pytest.mark.parametrize(("op", "rung"), [("grouped_gemm", "v1"), ("moe", "v2")])
def test_uncovered_backward_rungs_say_so(op, rung):
    shape = DOWN if op == "grouped_gemm" else QWEN
    with pytest.raises(NotCovered, match="covers"):
        predict_backward(op, rung, shape)


def test_a_tuned_launch_is_predicted_at_each_candidate():
    """What the tuners' ranker asks (``workbench.model.tuning``): one launch of a rung that
    tunes several, at a pinned candidate; unpinned, the launch takes its prior."""
    from kernels.attention import v5_backward
    from workbench.model import predict_launch
    from workbench.model.candidates import predict_config

    shape = kernels.spec("attention").bench_shapes["llama3-8b S=4K causal"]
    cands = v5_backward._pruned("hip", "gfx942", *shape[3:6], "dkdv")
    found = [predict_config("attention", "v5", shape, "bf16", "MI300X", c, "dkdv") for c in cands]
    assert [p.inputs["config"][0] for p in found] == cands and len({p.time_s for p in found}) > 1
    assert predict_launch("attention", "v5", "dkdv", shape).time_s == found[0].time_s   # the prior: first
    whole = _p(True, "attention", "v5", shape)
    assert found[0].time_s < whole.time_s   # one launch of the pass
    with pytest.raises(NotCovered, match="dkdv"):
        predict_launch("attention", "v5", "forward", shape)
    with pytest.raises(NotCovered, match="covers ops grouped_gemm, moe, attention, gemm_fp8, not 'gemm'"):
        predict_launch("gemm", "v4", "forward", QWEN)   # an op that tunes one launch: its ops are named
    grouped = predict_launch("grouped_gemm", "v4", "forward", DOWN)
    assert grouped.time_s == _p(False, "grouped_gemm", "v4", DOWN).time_s


def test_attention_v4_is_predicted_at_each_candidate():
    """attention v4's tuner passes its launch as a Problem; the model takes its candidates."""
    from kernels.attention import v4_amd_tuned
    from workbench.model.candidates import predict_config

    shape = kernels.spec("attention").bench_shapes["llama3-8b S=4K causal"]
    cands = v4_amd_tuned._pruned("hip", "gfx942", shape[3], shape[4], shape[5])[:3]
    found = [predict_config("attention", "v4", shape, "bf16", "MI300X", c) for c in cands]
    assert [p.inputs["config"][0] for p in found] == cands
    assert found[0].time_s == _p(False, "attention", "v4", shape).time_s   # the prior comes first
