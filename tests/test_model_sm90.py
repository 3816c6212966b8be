"""The model on sm_90 (H100, H200): the PTX hot loop's weights on hand-written PTX (fast),
then the forward passes (GEMM, attention, grouped GEMM, the FP8 GEMMs, MoE v3), the backward
passes and the tuners' launches compiled for sm_90 ahead of time (``slow``: a compile per rung
and config, cached per process by the ISA inspector).
"""
from __future__ import annotations

import functools

import pytest
import torch

import kernels
import roofline
from kernels.attention import v5_backward
from kernels.gemm_fp8 import configs as fp8_configs
from kernels.moe.grouped_gemm import launch as grouped_launch
from kernels.moe.grouped_gemm import v4_persistent
from kernels.moe.layer_ladder import configs as moe_configs
from workbench import cli, isa
from workbench.isa import parse as isa_parse
from workbench.model import (BACKWARD, LAUNCHES, NotCovered, combine, grouped_gemm, machine,
                             predict, predict_backward, predict_launch, ptx_loop, tile_schedule)
from workbench.model.covered import default_dtype
from workbench.model.predict_gemm import DTYPES

WGMMA = "wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{t}.{t}"
ACC = "{%r1,%r2}"


@pytest.mark.parametrize(("dtype", "operand", "k"), [("bf16", "bf16", 16), ("fp16", "f16", 16),
                                                     ("tf32", "tf32", 8), ("fp8", "e4m3", 32)])
def test_wgmma_rates_give_the_spec_peak_at_the_tensor_clock(dtype, operand, k):
    """machine.yaml's FLOP per clock per SM, over the H100's 132 SMs at its 1830 MHz tensor
    clock, must give the datasheet's dense peak, or the table is wrong."""
    spec = roofline.spec("H100")
    op = WGMMA.format(n=256, k=k, t=operand)
    per_clock = machine.mfma_flops(op) / machine.mfma_cycles(op, spec.target)
    clock_mhz, _ = machine.tensor_clock_mhz(spec.name, spec.target)
    assert per_clock * spec.compute_units * clock_mhz * 1e6 / 1e12 == pytest.approx(spec.peak(dtype), rel=2e-3)


def test_sm90_constants_have_known_sources():
    known = set(machine.sources())
    for name in ("valu_cycles", "transcendental_cycles", "salu_cycles", "l1_bytes_per_clk", "memory_latency_cycles"):
        assert machine.constant(name, "sm_90").source in known, name
    assert machine.constant("valu_cycles", "sm_90").value == 1          # 32 FP32 lanes per sub-partition
    assert machine.constant("valu_cycles", "gfx942").value == 4         # AMD keeps the shared value
    assert machine.lds_bytes_per_clk("sm_90")[:2] == (128, "CUDA-SMEM")


LOOP = f"""
$L__BB0_2:
\tcp.async.cg.shared.global [ %r1 + 0 ], [ %rd1 + 0 ], 0x10, %r2;
\tcp.async.commit_group;
\tld.shared.v4.b32 {{%r3, %r4, %r5, %r6}}, [%r7];
\tst.shared.b16 [%r8], %rs1;
\tld.global.v2.b32 {{%r9, %r10}}, [%rd2];
\twgmma.fence.sync.aligned;
\t{WGMMA.format(n=128, k=16, t="bf16")} {ACC}, %rd3, %rd4, 0, 1, 1, 0, 0;
\t{WGMMA.format(n=64, k=16, t="bf16")} {ACC}, {{%r11,%r12,%r13,%r14}}, %rd5, %p1, 1, 1, 1;
\twgmma.commit_group.sync.aligned;
\twgmma.wait_group.sync.aligned 1;
\tmov.b32 %r15, %r16;
\tmul.f32 %r17, %r18, %r19;
\tex2.approx.ftz.f32 %r20, %r17;
\tbar.sync 0;
\t@%p2 bra $L__BB0_2;
"""


def test_ptx_loop_mix_weighs_each_unit():
    mix = ptx_loop.mix(LOOP, "sm_90")
    big, small = WGMMA.format(n=128, k=16, t="bf16"), WGMMA.format(n=64, k=16, t="bf16")
    assert mix.mfma == {big: 1, small: 1}
    assert mix.mfma_cycles == (2 * 64 * 128 * 16 + 2 * 64 * 64 * 16) / 4096       # 64 + 32 tensor cycles
    assert mix.mfma_flops == (2 * 64 * 128 * 16 + 2 * 64 * 64 * 16) // 4          # a quarter per warp
    assert (mix.valu, mix.transcendental, mix.salu) == (2, 1, 0)                    # mul, ex2; no mov, no bar
    # shared memory per warp: the A-from-shared wgmma reads A and B, the other B only (a
    # quarter each); cp.async 16 B, ld.shared.v4 16 B, st.shared.b16 2 B (a 4-byte slot) per lane
    wgmma_bytes = ((64 * 16 + 128 * 16) * 2 + 64 * 16 * 2) // 4
    assert mix.lds_bytes == wgmma_bytes + 32 * (16 + 16 + 2)
    assert mix.lds_slot_bytes == wgmma_bytes + 32 * (16 + 16 + 4)
    assert mix.global_bytes == 32 * (16 + 8)
    assert mix.matrix_in_flight == 1


def test_only_an_in_flight_wgmma_overlaps_the_async_units():
    costs = {"matrix cores": 100.0, "VALU": 40.0, "SALU": 0.0, "LDS": 80.0, "L1 requests": 20.0}
    waiting = ptx_loop.mix(LOOP.replace("aligned 1;", "aligned 0;"), "sm_90")
    assert combine.overlapped(waiting) == ()
    in_flight = combine.round_time(costs, 2, 1, 3, 0.0, combine.overlapped(ptx_loop.mix(LOOP, "sm_90")))
    serial = combine.round_time(costs, 2, 1, 3, 0.0, combine.overlapped(waiting))
    assert in_flight[:2] == (100 + 0.5 * 40, "matrix cores")       # LDS, L1 hidden; VALU half
    assert serial[:2] == (100 + 0.5 * (40 + 80 + 20), "matrix cores")


MMA = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"


def test_an_mma_sync_is_one_warps_product_on_its_sub_partition():
    """Triton's product where a tile has no warpgroup shape (attention v5's dK/dV on sm_90):
    all its FLOPs the issuing warp's, its tensor cycles at its sub-partition's quarter of the
    SM's rate (four warps on four sub-partitions: the SM's dense rate), no shared-memory bytes
    of its own (its operands come from registers, through the ldmatrix charged as such), none
    left in flight."""
    mma_line = f"\t{MMA} {{%f1,%f2,%f3,%f4}}, {{%r1,%r2,%r3,%r4}}, {{%r6,%r7}}, {{%f1,%f2,%f3,%f4}};\n"
    mix = ptx_loop.mix("$L__BB0_1:\n\tldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r1,%r2,%r3,%r4}, [%r5];\n"
                       + 2 * mma_line + "\t@%p1 bra $L__BB0_1;\n", "sm_90")
    assert mix.mfma == {MMA: 2} and mix.mfma_flops == 2 * (2 * 16 * 8 * 16)
    assert mix.mfma_cycles == 2 * 4 and 4 * machine.mfma_flops(MMA) / machine.mfma_cycles(MMA, "sm_90") == 4096
    assert (mix.lds_bytes, mix.matrix_in_flight) == (32 * 16, 0)


@pytest.mark.parametrize(("text", "error"), [
    ("cp.async.bulk.tensor.2d.shared::cluster.global.tile [%r1], [%rd1, {%r2, %r3}], [%r4];", "TMA"),
    (f"{WGMMA.format(n=64, k=16, t='s8')} {ACC}, %rd1, %rd2, 0, 1, 1, 0, 0;", "s8"),
    ("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%r1}, {%r2}, {%r3}, {%r4};", "s8"),
    ("", "no hot loop"),
])
def test_what_the_ptx_model_does_not_know_is_an_error(text, error):
    with pytest.raises((ValueError, KeyError), match=error):
        ptx_loop.mix(text, "sm_90")


def test_ptx_instructions_take_the_innermost_line_of_the_file_asked_for():
    """The line table as Triton's NVIDIA backend writes it: a ``.loc`` names one frame and
    the call site it was inlined at; a standard.py frame inlined into schedule.py, itself
    inlined into the kernel, charges schedule.py's line; a kernel line has none there."""
    lines = ['\t.loc\t1 65 32',
             '\tmov.u32 \t%r1, %tid.x;',
             '\t.loc\t2 36 30, function_name $L__info_string0, inlined_at 1 65 32',
             '\tadd.s32 \t%r2, %r1, 1;',
             '\t.loc\t3 43 13, function_name $L__info_string0, inlined_at 2 36 30',
             '\t@%p1 ld.global.b32 { %r3 }, [ %rd1 + 0 ];',
             '$L__tmp0:',
             '\t.loc\t1 66 25',
             '\tshfl.sync.up.b32 \t%r4, %r3, 1, 0, -1;',
             '\t.file\t1 "/x/kernels/moe/grouped_gemm/v2_one_launch.py"',
             '\t.file\t2 "/x/kernels/moe/grouped_gemm/schedule.py"',
             '\t.file\t3 "/x/triton/language/standard.py"']
    assert isa_parse.by_source_line(lines, "schedule.py", "ptx") == [
        ("mov.u32", None), ("add.s32", 36), ("ld.global.b32", 36), ("shfl.sync.up.b32", None)]


# --- the compiled ladders (slow) -----------------------------------------------------------

GEMM = (8192, 8192, 8192)
ATTENTION = (4, 16, 16, 4096, 4096, 128)


@functools.lru_cache(maxsize=None)
def _predict(op: str, rung: str, shape: tuple, gpu: str = "H100"):
    return predict(op, rung, shape, "bf16", gpu)


@pytest.mark.slow
def test_the_gemm_top_rung_issues_wgmma_in_its_hot_loop():
    """v5 (the tuned rung, the top of the ladder but for v6's persistent launch of the same
    tile) compiled for sm_90: its K loop holds wgmma, and the prediction is built on it."""
    report = isa.inspect("gemm", "v5", "sm90", torch.bfloat16)
    mix = ptx_loop.mix(report.hot_loop, "sm_90")
    assert sum(mix.mfma.values()) > 0 and all(op.startswith("wgmma.mma_async") for op in mix.mfma)
    p = _predict("gemm", "v5", GEMM)
    assert p.label == "model" and "[model]" in repr(p) and {r["label"] for r in p.table()} == {"model"}
    assert p.inputs["engine clock under MFMA load (MHz)"] == (1830, "H100-PEAK")
    assert any(name.startswith("tensor-core cycles wgmma") for name in p.inputs)
    assert 0 < p.tflops <= roofline.spec("H100").peak("bf16")
    assert p.time_s * p.tflops * 1e12 == pytest.approx(2 * 8192 ** 3)


@pytest.mark.slow
@pytest.mark.parametrize("gpu", ["H100", "H200"])
def test_the_gemm_ladder_gets_faster_on_sm90(gpu):
    """v2 -> v3 (the grouped order: the same loop, no slower), v3 -> v4 (cp.async pipeline:
    its loop leaves a wgmma group in flight), v4 -> v5 (a 128x256 tile)."""
    times = [_predict("gemm", rung, GEMM, gpu).time_s for rung in ("v2", "v3", "v4", "v5")]
    assert times[0] >= times[1] > times[2] > times[3]


@pytest.mark.slow
def test_a_decode_gemm_tile_without_a_warpgroup_shape_is_weighed_on_mma_sync():
    """At M = 16 GEMM v5's prior tile has 16 rows, no 64-row warpgroup shape: its loop compiles
    to mma.sync, weighed (it was refused with a ValueError), HBM-bound (model) below the peak."""
    p = _predict("gemm", "v5", kernels.spec("gemm").bench_shapes["decode M=16 (4096x14336)"], "H200")
    ops = p.inputs["hot loop per wave and iteration"][0]["MFMAs"]
    assert p.inputs["config"][0]["BLOCK_M"] == 16 and ops and all(op.startswith("mma.sync") for op in ops)
    assert p.bound == "HBM" and 0 < p.tflops <= roofline.spec("H200").peak("bf16")


@pytest.mark.slow
@pytest.mark.parametrize("causal", [0, 1])
def test_the_attention_ladder_gets_faster_on_sm90(causal):
    preds = [_predict("attention", rung, (*ATTENTION, causal)) for rung in ("v2", "v3", "v4")]
    assert preds[0].time_s > preds[1].time_s > preds[2].time_s
    assert all(p.label == "model" and p.gpu == "H100 SXM" for p in preds)
    assert preds[2].inputs["unmasked key loop per wave and iteration"][0]["of them transcendental"] > 0   # ex2


@pytest.mark.slow
def test_h200_is_h100_with_more_bandwidth():
    """The same compile and clock: the H200 is never slower, and its HBM term is shorter."""
    h100, h200 = _predict("gemm", "v2", GEMM), _predict("gemm", "v2", GEMM, "H200")
    assert h200.time_s <= h100.time_s
    assert h200.breakdown["HBM"] == pytest.approx(h100.breakdown["HBM"] * 3.35 / 4.8)


@pytest.mark.slow
def test_a_loop_without_wgmma_is_not_covered():
    """The GEMM rungs' fp32 dot compiles to FMAs on sm_90 (no tf32 wgmma): refused, not
    weighed as if the tensor cores ran it."""
    with pytest.raises(NotCovered, match="without matrix instructions"):
        predict("gemm", "v4", (256, 256, 256), "fp32", "H100")


# --- grouped GEMM (slow) --------------------------------------------------------------------

GROUPED = kernels.spec("grouped_gemm").bench_shapes
DOWN, SKEWED = GROUPED["dsv3 down (32 experts)"], GROUPED["dsv3 gate+up skewed"]


@pytest.mark.slow
@pytest.mark.parametrize("gpu", ["H100", "H200"])
@pytest.mark.parametrize("rung", grouped_gemm.RUNGS)
def test_every_grouped_rung_stays_below_the_peak_on_sm90(rung, gpu):
    """Every bench shape: a prediction above the dense bf16 peak weighs a loop that is not the
    compiled one (v1 once took GEMM v4's AMD warps over the sm_90 compile's: 1126 TFLOP/s)."""
    peak = roofline.spec(gpu).peak("bf16")
    for name, shape in GROUPED.items():
        p = _predict("grouped_gemm", rung, shape, gpu)
        assert 0 < p.tflops <= peak and p.label == "model", (name, p.tflops)
        assert p.time_s * p.tflops * 1e12 == pytest.approx(kernels.spec("grouped_gemm").flops(shape))


@pytest.mark.slow
def test_the_loop_is_weighed_with_the_compiles_warps_not_the_stated_ones(monkeypatch):
    """K steps per iteration come from the compiled kernel's warps: a stated config whose warps
    differ from its compile's (v1 on sm_90 once stated 8 over the compile's 4) leaves the time
    as it is (it doubled the steps and passed the peak); the config test keeps the two equal."""
    right = _predict("grouped_gemm", "v1", DOWN, "H200")
    config = grouped_gemm.config

    def stated_eight_warps(*args, **kwargs):
        cfg, compile_settings = config(*args, **kwargs)
        return {**cfg, "num_warps": 8}, compile_settings
    monkeypatch.setattr(grouped_gemm, "config", stated_eight_warps)
    wrong = predict("grouped_gemm", "v1", DOWN, "bf16", "H200")   # not _predict's cached one
    assert (wrong.inputs["config"][0]["num_warps"], wrong.inputs["compile options"][0]["num_warps"]) == (8, 4)
    assert wrong.time_s == right.time_s


@pytest.mark.slow
@pytest.mark.parametrize("shape", [DOWN, SKEWED], ids=["balanced", "skewed"])
@pytest.mark.parametrize("gpu", ["MI300X", "H200"])
def test_grouped_v1_is_gemm_v4_once_per_expert(gpu, shape):
    """v1 launches GEMM v4's kernel per non-empty expert, with GEMM v4's settings for the
    target: its time is GEMM v4's at each expert's (rows, N, K), summed, on AMD and sm_90 alike."""
    k, n = shape[1:3]
    rows = grouped_gemm.group_rows(shape)
    per_expert = [_predict("gemm", "v4", (r, n, k), gpu) for r in rows if r]
    p = _predict("grouped_gemm", "v1", shape, gpu)
    assert p.time_s == pytest.approx(sum(q.time_s for q in per_expert), rel=1e-9)
    assert p.inputs["config"][0] == per_expert[0].inputs["config"][0]
    assert p.inputs["compile options"][0] == per_expert[0].inputs["compile options"][0]


@pytest.mark.slow
@pytest.mark.parametrize("gpu", ["H100", "H200"])
def test_the_grouped_ladder_on_sm90(gpu):
    """At DeepSeek-V3's down projection v4's docstring holds on sm_90 (no surplus programs, one
    offsets scan per program: faster than v2, and than v1), on one program per SM, no remap."""
    v1, v2, v4 = (_predict("grouped_gemm", rung, DOWN, gpu) for rung in grouped_gemm.RUNGS)
    assert v4.time_s < v1.time_s < v2.time_s
    s2, s4 = (p.inputs["tile schedule (cycles)"][0] for p in (v2, v4))
    assert s2["surplus programs"] == 32 * 56 and s4["surplus programs"] == 0
    assert s2["once"] == 0 < s4["once"] and 0 < s4["per tile"] < s2["per tile"]
    cfg = v4.inputs["config"][0]
    assert cfg["NUM_PROGS"] == roofline.spec(gpu).compute_units and cfg["NUM_XCDS"] == 1


DSV3_BALANCED = {"dsv3 gate+up (32 experts)", "dsv3 down (32 experts)"}
QWEN3 = {"qwen3-moe gate+up (32 experts)", "qwen3-moe down (32 experts)", "qwen3-moe down skewed"}
V2_SLOWER = {"MI300X": set(), "MI355X": DSV3_BALANCED,
             "H100": DSV3_BALANCED | QWEN3 | {"dsv3 gate+up skewed"},
             "H200": DSV3_BALANCED | {"qwen3-moe down (32 experts)"}}
"""Where grouped GEMM v2's docstring says the model puts it more than 5 % below v1, per GPU."""


@pytest.mark.slow
@pytest.mark.parametrize("gpu", list(V2_SLOWER))
def test_v2_against_v1_per_target_as_its_docstring_states(gpu):
    """grouped GEMM v2's docstring, by the model, at every bench shape: more than 5 % slower
    than v1 exactly at the shapes it names per GPU, each HBM-bound with more HBM time than v1
    (a wave runs one column panel over nearly every row tile, so x comes from HBM once per
    panel; v1's grouped order shares x's rows); elsewhere faster or within 5 %."""
    slower = set()
    for name, shape in GROUPED.items():
        v1, v2 = (_predict("grouped_gemm", rung, shape, gpu) for rung in ("v1", "v2"))
        if v2.time_s > 1.05 * v1.time_s:
            slower.add(name)
            assert v2.bound == "HBM" and v2.breakdown["HBM"] > v1.breakdown["HBM"], name
            if name in DSV3_BALANCED:   # x once per column panel: more than twice v1's HBM time
                assert v2.breakdown["HBM"] > 2 * v1.breakdown["HBM"], name
    assert slower == V2_SLOWER[gpu]


@pytest.mark.slow
def test_the_grouped_schedule_is_read_from_the_ptx():
    """The offsets are loaded on the scan's lines and located without a load, as on AMD:
    the PTX line table puts both on schedule.py's lines, in every kernel that walks grouped
    GEMM v2's or v4's schedule (the FP8 grouped GEMM's, MoE v3's two)."""
    reports = {rung: grouped_gemm.compiled(rung, "forward", DOWN, torch.bfloat16, "sm_90", 132)[1]
               for rung in ("v2", "v4")}
    reports["fp8 v0"] = isa.inspect_all("grouped_gemm_fp8", "v0", "sm90")[0]
    reports |= dict(zip(("moe gate_up", "moe down"), isa.inspect_all("moe", "v3", "sm90")))
    for rung, report in reports.items():
        scan, locate = (tile_schedule.instructions(report, f) for f in (tile_schedule.SCAN, tile_schedule.LOCATE))
        assert any(op.startswith("ld.global") for op in scan), rung
        assert not any(op.startswith("ld.global") for op in locate) and len(locate) > 10, rung


FORWARDS = [("gemm_fp8", "v1", "fp8"), ("gemm_fp8", "v2", "fp8"), ("grouped_gemm_fp8", "v0", "fp8"),
            ("moe", "v3", "bf16"), ("moe", "v3", "fp16"), *(("grouped_gemm", rung, "fp16") for rung in grouped_gemm.RUNGS)]
OPERAND = {"fp8": "e4m3", "bf16": "bf16", "fp16": "f16"}   # wgmma's and mma.sync's type names


@pytest.mark.slow
@pytest.mark.parametrize("gpu", ["H100", "H200"])
@pytest.mark.parametrize(("op", "rung", "dtype"), FORWARDS)
def test_the_fp8_moe_and_fp16_forwards_weigh_wgmma_loops_below_the_peak_on_sm90(op, rung, dtype, gpu):
    """The FP8 GEMM and grouped GEMM (e4m3 operands), MoE v3's forward (bf16, fp16) and the
    grouped GEMM ladder in fp16 at their quick shapes: every launch's hot loop issues wgmma of
    that operand type, at the 1830 MHz tensor clock (where the prediction lists it: MoE's pass
    does not), and the time stays above what the dense peak of that type allows."""
    spec = kernels.spec(op)
    for name in spec.quick_shapes:
        p = predict(op, rung, spec.bench_shapes[name], dtype, gpu)
        assert 0 < p.tflops <= roofline.spec(gpu).peak(dtype) and p.label == "model", (name, p.tflops)
        clocks = [value[0] for key, value in p.inputs.items() if key.endswith("engine clock under MFMA load (MHz)")]
        assert set(clocks) == {1830} or (op == "moe" and not clocks), (name, clocks)   # MoE's pass lists no clock
        loops = [value[0]["MFMAs"] for key, value in p.inputs.items() if key.endswith("per wave and iteration")]
        assert loops and all(ops and all(op_.startswith("wgmma") and f".{OPERAND[dtype]}." in op_ for op_ in ops)
                             for ops in loops), (name, loops)


@pytest.mark.slow
def test_cli_predicts_the_grouped_ladder_on_h200(capsys):
    assert cli.main(["predict", "grouped_gemm", "--gpu", "H200"]) == 0
    out = capsys.readouterr().out
    assert all(f" {rung} " in out for rung in grouped_gemm.RUNGS) and "model" in out


# --- the backward passes and the tuners' launches (slow) ------------------------------------

def grouped_prior(rung: str, kernel: str, problem: tuple, dtype: str, gpu: str) -> dict:
    """Grouped GEMM ``rung``'s settings on "cuda" for ``kernel`` ("forward", "dx": the forward
    kernel on the launch's own (T, K, N, G); "dw"), from the kernels' own tables; v4's
    persistent launches one program per SM of ``gpu``."""
    if rung == "v2":
        return grouped_launch.config("cuda", "sm_90")
    t, k, n, g = problem[:4]
    prior = v4_persistent.prior("dw" if kernel == "dw" else "forward", "cuda", "sm_90", t, k, n, g, DTYPES[dtype])
    return prior if kernel == "dw" else {**prior, "NUM_XCDS": 1, "NUM_PROGS": roofline.spec(gpu).compute_units}


def cuda_prior(op: str, rung: str, kernel: str, shape: tuple, dtype: str, gpu: str) -> dict:
    """The settings launch ``kernel`` of ``op``'s ``rung`` (as its tuner names it, at the shape
    :func:`predict_launch` takes) runs at first on "cuda": its untimed prior there."""
    if op == "attention":
        return v5_backward.prior("cuda", "sm_90", shape[5], shape[3], shape[4])[kernel]
    if op == "grouped_gemm":
        return grouped_prior(rung, kernel, shape, dtype, gpu)
    if op == "moe":
        rows, n = shape[0] * shape[4], shape[2] if kernel == "gate_up" else shape[1]
        return moe_configs.pruned("cuda", "sm_90", rows, n, shape[3])[0]
    binary, layout = fp8_configs.parts(kernel)
    return {**fp8_configs.prior("cuda", "sm_90", *shape, binary, layout), "NUM_XCDS": 1}


def backward_priors(op: str, rung: str, shape: tuple, dtype: str, gpu: str) -> dict[str, dict]:
    """The "cuda" prior of every launch of the backward pass, by the key its prediction
    states it under."""
    if op == "attention":
        return {f"config {k}": cuda_prior(op, rung, k, shape, dtype, gpu) for k in ("dkdv", "dq")}
    if op == "grouped_gemm":
        t, k, n, g, routing = shape
        return {"dX: config": grouped_prior(rung, "dx", (t, n, k, g), dtype, gpu),
                "dW: config": grouped_prior(rung, "dw", shape, dtype, gpu)}
    t, dim, hidden, e, top_k, _ = shape
    down, gate_up = (t * top_k, hidden, dim, e), (t * top_k, dim, hidden, e)   # the forward problems
    return {"down dW: config": grouped_prior("v4", "dw", down, dtype, gpu),
            "down dX: config": grouped_prior("v4", "dx", gate_up, dtype, gpu),
            **{f"{w} dW: config": grouped_prior("v4", "dw", gate_up, dtype, gpu) for w in ("gate", "up")},
            **{f"{w} dX: config": grouped_prior("v4", "dx", down, dtype, gpu) for w in ("gate", "up")}}


def assert_sm90_prediction(p, gpu: str, dtype: str, expected: dict[str, dict]):
    """Finite, below the dense peak of its operand type, every hot loop's products ``wgmma``s of
    that type (attention v5's dK/dV loops too: its 16 x 128 prior at D = 128), and each launch's
    config the "cuda" prior ``expected`` names."""
    assert 0 < p.tflops <= roofline.spec(gpu).peak(dtype) and p.label == "model", p.tflops
    loops = {key: value[0]["MFMAs"] for key, value in p.inputs.items() if key.endswith("per wave and iteration")}
    assert loops
    for key, ops in loops.items():
        assert ops and all(op.startswith("wgmma.mma_async") and f".{OPERAND[dtype]}." in op for op in ops), (key, ops)
    assert {key: p.inputs[key][0] for key in expected} == expected


@pytest.mark.slow
@pytest.mark.parametrize("gpu", ["H100", "H200"])
@pytest.mark.parametrize(("op", "rung", "dtype"), [(op, rung, dtype) for op, (_, rungs) in BACKWARD.items()
                                                   for rung in rungs for dtype in ("bf16", "fp16")])
def test_every_backward_pass_on_sm90_weighs_its_cuda_launches(op, rung, dtype, gpu):
    """Each backward pass at its op's first quick shape: its launches at their "cuda" priors,
    read from the PTX: every launch compiles to wgmma (attention v5's dK/dV prior, 16 x 128 on
    8 warps, too; its 32 x 32 tile, the prior before, has no warpgroup shape: mma.sync)."""
    shape = kernels.spec(op).bench_shapes[kernels.spec(op).quick_shapes[0]]
    p = predict_backward(op, rung, shape, dtype, gpu)
    assert_sm90_prediction(p, gpu, dtype, backward_priors(op, rung, shape, dtype, gpu))
    assert p.time_s * p.tflops * 1e12 == pytest.approx(kernels.spec(op).backward_flops(shape))


LAUNCH_KERNELS = {("grouped_gemm", "v4"): ("forward", "dx", "dw"), ("moe", "v3"): moe_configs.KERNELS,
                  ("attention", "v5"): ("dkdv", "dq"),
                  **{("gemm_fp8", r): tuple(fp8_configs.part(name, b.layouts[-1]) for name, b in fp8_configs.BINARIES.items()
                                            if b.rung == r) for r in ("v1", "v2")}}   # each binary at its last layout


def test_every_rung_with_launches_is_in_the_launch_test():
    assert set(LAUNCH_KERNELS) == set(LAUNCHES)


@pytest.mark.slow
def test_an_fp32_backward_on_sm90_is_not_weighed_as_a_matrix_loop():
    """The rungs' fp32 dot compiles to FMAs on sm_90: grouped GEMM's dW loop is refused as the
    forward's is (it was weighed as a loop of no matrix products, read in the wrong dialect)."""
    shape = kernels.spec("grouped_gemm").bench_shapes[kernels.spec("grouped_gemm").quick_shapes[0]]
    with pytest.raises(NotCovered, match="without matrix instructions"):
        predict_backward("grouped_gemm", "v2", shape, "fp32", "H200")


@pytest.mark.slow
@pytest.mark.parametrize("gpu", ["H100", "H200"])
@pytest.mark.parametrize(("op", "rung", "kernel"), [(op, rung, k) for (op, rung), ks in LAUNCH_KERNELS.items()
                                                    for k in ks])
def test_every_tuned_launch_on_sm90_is_predicted_at_its_cuda_prior(op, rung, kernel, gpu):
    """The tuners' ranker's predictions (:data:`LAUNCHES`; every binary of the FP8 GEMM, at the
    last layout it is compiled at: the forward's NT is the forward test's) at the op's first
    quick shape, in its default dtype."""
    shape, dtype = kernels.spec(op).bench_shapes[kernels.spec(op).quick_shapes[0]], default_dtype(op)
    p = predict_launch(op, rung, kernel, shape, gpu=gpu)
    assert_sm90_prediction(p, gpu, dtype, {"config": cuda_prior(op, rung, kernel, shape, dtype, gpu)})
