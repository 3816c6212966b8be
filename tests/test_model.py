"""The performance model's parts, on synthetic input: no compile, no GPU.

The compiled ladder is predicted in ``test_model_gemm.py``; published measurements
are compared in ``test_model_validation.py``.
"""
from __future__ import annotations

import dataclasses

import pytest

import roofline
from kernels.gemm import v6_persistent
from workbench.model import (NotCovered, Prediction, attention, combine, gemm, grouped_gemm, loop, machine,
                             predict, tile_schedule, tiles)

# One full-rate MFMA per dtype: with the datasheet's CUs and clock, 4 matrix cores per CU
# at these cycle counts must give the datasheet's peak, or the table is wrong.
FULL_RATE = {
    ("MI300X", "bf16"): "v_mfma_f32_16x16x16_bf16", ("MI300X", "fp16"): "v_mfma_f32_32x32x8_f16",
    ("MI300X", "fp32"): "v_mfma_f32_32x32x2_f32", ("MI300X", "fp8"): "v_mfma_f32_16x16x32_fp8_fp8",
    ("MI325X", "bf16"): "v_mfma_f32_32x32x8_bf16",
    ("MI355X", "bf16"): "v_mfma_f32_16x16x32_bf16", ("MI355X", "fp16"): "v_mfma_f32_32x32x16_f16",
    ("MI355X", "fp32"): "v_mfma_f32_16x16x4_f32", ("MI355X", "fp8"): "v_mfma_f32_16x16x128_f8f6f4",
}


@pytest.mark.parametrize(("gpu", "dtype"), list(FULL_RATE), ids=lambda v: str(v))
def test_mfma_cycles_give_the_spec_peak(gpu, dtype):
    spec = roofline.spec(gpu)
    op = FULL_RATE[gpu, dtype]
    per_cycle = machine.mfma_flops(op) / machine.mfma_cycles(op, spec.target)
    peak = per_cycle * 4 * spec.compute_units * spec.clock_ghz * 1e9 / 1e12
    assert peak == pytest.approx(spec.peak(dtype), rel=1e-3)


def test_cdna3_shapes_run_at_half_rate_on_gfx950():
    new, old = "v_mfma_f32_16x16x32_bf16", "v_mfma_f32_16x16x16_bf16"
    rate = {op: machine.mfma_flops(op) / machine.mfma_cycles(op, "gfx950") for op in (new, old)}
    assert rate[new] == 2 * rate[old]


def test_unknown_mfma_and_target_are_named():
    with pytest.raises(KeyError, match="v_mfma_f32_4x4x4_16b_f16"):
        machine.mfma_cycles("v_mfma_f32_4x4x4_16b_f16", "gfx942")
    with pytest.raises(ValueError, match="gfx90a"):
        machine.mfma_cycles("v_mfma_f32_16x16x16_bf16", "gfx90a")


def test_every_constant_has_a_known_source():
    known = set(machine.sources())
    for name in ("valu_cycles", "transcendental_cycles", "salu_cycles", "lds_bank_bytes", "memory_latency_cycles"):
        assert machine.constant(name).source in known, name
    assert {arch: machine.lds_bytes_per_clk(arch)[:2] for arch in ("gfx942", "gfx950")} == {
        "gfx942": (128, "S7b"), "gfx950": (256, "CDNA4-WP")}   # CDNA 4 doubles the LDS read rate
    assert machine.load_clock_mhz("MI300X", "bf16")[1] in known
    assert machine.load_clock_mhz("MI355X", "bf16") is None   # no measurement: the spec clock is used


@pytest.mark.parametrize(("op", "access"), [
    ("ds_read_b128", (1, 16)), ("ds_read2st64_b64", (2, 8)), ("ds_write2_b32", (2, 4)),
    ("ds_read_u16", (1, 2)), ("ds_write_b16_d16_hi", (1, 2)), ("ds_read_b64_tr_b16", (1, 8)),
])
def test_lds_access_widths(op, access):
    assert loop.lds_access(op) == access


@pytest.mark.parametrize(("op", "width"), [
    ("buffer_load_dwordx4", 16), ("global_load_dwordx2", 8), ("buffer_store_dword", 4),
    ("global_store_short", 2), ("global_load_ubyte", 1), ("global_load_short_d16_hi", 2),
    ("global_load_lds_dwordx4", 16),
])
def test_global_widths(op, width):
    assert loop.global_width(op) == width


def test_unknown_widths_are_errors():
    with pytest.raises(ValueError, match="ds_swizzle_b32"):
        loop.lds_access("ds_swizzle_b32")
    with pytest.raises(ValueError, match="buffer_load_format_x"):
        loop.global_width("buffer_load_format_x")


LOOP = """\
.LBB0_1:                                ; =>This Inner Loop Header: Depth=1
\tv_mfma_f32_16x16x16_bf16 v[0:3], v[4:5], v[6:7], v[0:3]
\tv_mfma_f32_16x16x16_bf16 v[0:3], v[4:5], v[6:7], v[0:3]
\tds_read_b128 v[8:11], v1
\tds_read_u16 v12, v1
\tds_write2st64_b64 v1, v[2:3], v[4:5] offset1:1
\tbuffer_load_dwordx4 v[8:11], v2, s[0:3], 0 offen
\tbuffer_load_dwordx4 v2, s[0:3], 0 offen lds
\tglobal_store_short v[0:1], v3, off
\tv_add_u32_e32 v1, 64, v1
\tv_exp_f32_e32 v5, v5
\ts_add_i32 s1, s1, 64
\ts_waitcnt lgkmcnt(0)
\ts_barrier
\ts_cbranch_scc1 .LBB0_1
"""


def test_loop_mix_weighs_each_unit():
    mix = loop.mix(LOOP, "gfx942")
    assert mix.mfma == {"v_mfma_f32_16x16x16_bf16": 2}
    assert (mix.mfma_cycles, mix.mfma_flops) == (32, 2 * 2 * 16 * 16 * 16)
    assert (mix.valu, mix.transcendental, mix.salu) == (2, 1, 1)   # waits, barriers, branches are free
    # lanes x bytes: b128, u16, two b64 per lane, then the load that lands in LDS
    assert mix.lds_bytes == 64 * (16 + 2 + 16 + 16)
    assert mix.lds_slot_bytes == 64 * (16 + 4 + 16 + 16)    # the u16 read takes a whole bank slot
    assert mix.global_bytes == 64 * (16 + 16 + 2)


def test_a_kernel_without_a_loop_cannot_be_modelled():
    with pytest.raises(ValueError, match="no hot loop"):
        loop.mix("", "gfx942")


def test_grouped_order_by_hand():
    # 3 x 2 tiles, groups of 2 rows walked column by column, the last group one row high
    order = [tiles.grouped(i, 3, 2, 2) for i in range(6)]
    assert order == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (2, 1)]


@pytest.mark.parametrize(("tiles_m", "tiles_n", "group_m"), [(7, 5, 3), (1, 9, 8), (16, 16, 8)])
def test_grouped_order_covers_each_tile_once(tiles_m, tiles_n, group_m):
    order = {tiles.grouped(i, tiles_m, tiles_n, group_m) for i in range(tiles_m * tiles_n)}
    assert order == {(i, j) for i in range(tiles_m) for j in range(tiles_n)}


def test_traffic_shares_operands_within_a_wave_and_an_xcd():
    # 2 x 2 tiles of 128 on 2 XCDs, each XCD holding a diagonal: it reads both row and both
    # column blocks, the chip as a whole too; every tile requests its own.
    wave = tiles.Wave(((0, (0, 0)), (1, (0, 1)), (1, (1, 0)), (0, (1, 1))), k=64)
    got = tiles.traffic(wave, (256, 256, 64), (128, 128), 2, xcds=2)
    out = 256 * 256 * 2
    assert got["hbm"] == (256 + 256) * 64 * 2 + out
    assert got["llc"] == 2 * (256 + 256) * 64 * 2 + out
    assert got["l2"] == 4 * 256 * 64 * 2 + out


def test_traffic_clips_ragged_tiles():
    wave = tiles.Wave(((0, (1, 0)),), k=10)
    got = tiles.traffic(wave, (200, 100, 10), (128, 128), 1, xcds=1)
    assert got["hbm"] == (72 + 100) * 10 + 72 * 100


def test_waves_quantize():
    assert [len(w) for w in tiles.waves(10, 4)] == [4, 4, 2]


def test_round_time_rules():
    costs = {"matrix cores": 100.0, "LDS": 60.0}
    assert combine.round_time(costs, 1, 1, 2, 0) == (160.0, "matrix cores", 0.0)   # one wave: serial
    assert combine.round_time(costs, 4, 1, 2, 0)[:2] == (115.0, "matrix cores")    # 3/4 of LDS hidden
    assert combine.round_time(costs, 4, 1, 2, 800)[:2] == (800.0, "memory latency")
    assert combine.round_time(costs, 4, 1, 3, 800)[:2] == (400.0, "memory latency")  # two ahead
    assert combine.round_time(costs, 4, 2, 1, 800)[:2] == (800 + 115 / 2, "memory latency")


CHIP = combine.Chip(clock_hz=1e9, compute_units=2, xcds=1, l1_bytes_per_clk=64, lds_bytes_per_clk=128,
                    valu_cycles=4, transcendental_cycles=16, salu_cycles=4, latency_cycles=0, bandwidth={"hbm": 1e12})
MIX = loop.LoopMix(mfma={"v_mfma_f32_16x16x16_bf16": 4}, mfma_cycles=64, mfma_flops=32768, valu=0,
                   transcendental=0, salu=0, lds_bytes=0, lds_slot_bytes=0, lds_ops={}, global_bytes=0, lines=4)


def _launch(programs: int, bandwidth: float = 1e12):
    chip = dataclasses.replace(CHIP, bandwidth={"hbm": bandwidth})
    waves = [tiles.Wave(tuple((0, (i, 0)) for i in ids), k=64) for ids in tiles.waves(programs, 2)]
    return combine.launch(MIX, 4, 2, 1, waves, lambda k: 10, 0, lambda w: {"hbm": 1e3 * len(w.placed)}, chip)


def test_a_partial_last_wave_costs_a_whole_one():
    full, _, _ = _launch(4)
    partial, _, _ = _launch(3)
    assert partial == full == 2 * 10 * 64 / 1e9


def test_a_tile_schedule_delays_every_wave_and_its_surplus_takes_slots():
    """Per tile before each wave's loads, once before the first, and surplus programs'
    cycles spread over the chip's slots (2 CUs x 1 resident here)."""
    waves = [tiles.Wave(tuple((0, (i, 0)) for i in ids), k=64) for ids in tiles.waves(4, 2)]
    plain = combine.launch(MIX, 4, 2, 1, waves, lambda k: 10, 0, lambda w: {}, CHIP)[0]
    scheduled, _, breakdown = combine.launch(MIX, 4, 2, 1, waves, lambda k: 10, 0, lambda w: {}, CHIP,
                                             combine.Schedule(per_tile=100, once=50, surplus=6))
    extra = (2 * 100 + 50 + 6 * 150 / 2) / 1e9
    assert scheduled - plain == pytest.approx(extra) and breakdown["tile schedule"] == pytest.approx(extra)


def test_a_schedule_issues_its_instructions_per_wave_and_waits_on_its_loads():
    """8 waves over 4 SIMDs: two per SIMD; waits free; a global load adds one latency."""
    chip = dataclasses.replace(CHIP, latency_cycles=800)
    ops = ["v_add_u32_e32", "s_add_i32", "s_waitcnt", "ds_read_b32"]
    assert tile_schedule.cycles(ops, 8, chip) == 2 * 3 * 4
    assert tile_schedule.cycles([*ops, "global_load_dword"], 8, chip) == 2 * 4 * 4 + 800
    # PTX (sm_90): moves and branches free, the rest at the ALU rate; ld.param is not a global load
    ptx = ["add.s32", "mov.u32", "shfl.sync.up.b32", "ld.param.b32", "bra.uni"]
    assert tile_schedule.cycles(ptx, 8, chip, "ptx") == 2 * 3 * 4
    assert tile_schedule.cycles([*ptx, "ld.global.b32"], 8, chip, "ptx") == 2 * 4 * 4 + 800


def test_memory_binds_when_its_bandwidth_is_low():
    seconds, bound, breakdown = _launch(2, bandwidth=1e6)
    assert bound == "HBM" and seconds == pytest.approx(2e3 / 1e6)
    assert breakdown["matrix cores"] == pytest.approx(10 * 64 / 1e9)


def _prediction() -> Prediction:
    return Prediction("gemm", "v4", (1, 2, 3), "bf16", "MI300X", 1e-3, 2.0, "LDS",
                      {"LDS": 1e-3}, {"clock": (1.2, "MAF2")})


def test_prediction_is_labelled_model_everywhere():
    p = _prediction()
    assert "[model]" in repr(p)
    assert p.row()["label"] == "model"
    assert {row["label"] for row in p.table()} == {"model"}


@pytest.mark.parametrize(("args", "error", "named"), [
    (("layernorm", "v1", (1, 1, 1)), NotCovered, "gemm, attention"),
    (("moe", "v2", (8, 8, 8, 4, 2, 0)), NotCovered, "v3"),
    (("moe", "v3", (8, 8, 8, 4, 8, 0)), ValueError, "top_k"),
    (("moe", "v3", (8, 8, 8, 4, 2, 5)), ValueError, "routing"),
    (("grouped_gemm_fp8", "v0", (8, 8, 8, 2, 0), "bf16"), NotCovered, "fp8"),
    (("grouped_gemm", "v0", (8, 8, 8, 2, 0)), NotCovered, "v1, v2, v4"),
    (("grouped_gemm", "v2", (8, 8, 8, 2, 9)), ValueError, "routing"),
    (("grouped_gemm", "v2", (8, 8, 0, 2, 0)), ValueError, "shape"),
    (("gemm_fp8", "v1", (8, 8, 8), "bf16"), NotCovered, "fp8"),
    (("gemm_fp8", "v0", (8, 8, 8), "fp8"), NotCovered, "v1"),
    (("gemm", "v4", (1, 1, 1), "bf16", "B200"), NotCovered, "gfx942, gfx950, sm_90"),
    (("gemm", "v4", (0, 1, 1)), ValueError, "shape"),
    (("gemm", "v4", (4, 4)), ValueError, "shape"),
    (("gemm", "v4", (4, 4, 4), "fp8"), NotCovered, "dtype"),
    (("gemm", "v0", (4, 4, 4)), NotCovered, "v2, v3"),
    (("gemm", "ref", (4, 4, 4)), NotCovered, "v2, v3"),
    (("attention", "v1", (1, 4, 1, 8, 8, 64, 1)), NotCovered, "v2, v3, v4"),
    (("attention", "v0", (1, 4, 1, 8, 8, 64, 1)), NotCovered, "v2, v3, v4, v5"),
    (("attention", "v4", (1, 4, 3, 8, 8, 64, 1)), ValueError, "multiple of Hkv"),
    (("attention", "v4", (1, 4, 1, 8, 8, 64)), ValueError, "shape"),
    (("attention", "v4", (1, 4, 1, 8, 8, 256, 0)), ValueError, "D <= 128"),
    (("attention", "v4", (1, 4, 1, 8, 8, 64, 0), "fp32"), NotCovered, "bf16, fp16"),
    (("attention", "v2", (1, 4, 1, 8, 8, 64, 0)), NotCovered, "head dim 128"),
])
def test_bad_requests_name_what_is_covered(args, error, named):
    """Bad input is a ValueError; what the model does not cover is a NotCovered, which is
    a NotImplementedError for callers written before it existed."""
    with pytest.raises(error, match=named):
        predict(*args)
    assert issubclass(NotCovered, NotImplementedError)


def test_traffic_of_partials_and_their_fixup():
    split = tiles.Wave(((0, (0, 0)), (0, (0, 0))), k=64, out_bytes=128 * 128 * 4)
    fixup = tiles.Wave(((0, (0, 0)),), k=0, read_bytes=2 * 128 * 128 * 4)
    shape, block = (128, 128, 128), (128, 128)
    assert tiles.traffic(split, shape, block, 2, 1)["hbm"] == (128 + 128) * 64 * 2 + 2 * 128 * 128 * 4
    assert tiles.traffic(fixup, shape, block, 2, 1)["hbm"] == 128 * 128 * 2 + 2 * 128 * 128 * 4


def test_v2_walks_tile_rows_first_and_deals_programs_to_xcds():
    plan = gemm.plan("v2", (512, 512, 64), "gfx942", 304)
    (wave,) = plan.waves((512, 512, 64), slots=304, xcds=8)
    assert [tile for _, tile in wave.placed[:5]] == [(0, 0), (1, 0), (2, 0), (3, 0), (0, 1)]
    assert [xcd for xcd, _ in wave.placed[:9]] == [0, 1, 2, 3, 4, 5, 6, 7, 0]


def test_v3_gives_each_xcd_a_contiguous_run_of_tiles():
    plan = gemm.plan("v3", (2048, 2048, 64), "gfx942", 304)   # 16 x 16 tiles of 128
    (wave, _) = plan.waves((2048, 2048, 64), slots=128, xcds=8)
    on_xcd0 = [tile for xcd, tile in wave.placed if xcd == 0]
    assert on_xcd0 == [tiles.grouped(i, 16, 16, plan.cfg["GROUP_M"]) for i in range(16)]


def test_v6_splits_the_tail_and_adds_its_fixup():
    plan = gemm.plan("v6", (1000, 1000, 1000), "gfx942", 304)
    cfg = plan.cfg
    got = plan.waves((1000, 1000, 1000), slots=304, xcds=8)
    sched = v6_persistent.schedule(1000, 1000, 1000, cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], 304)
    assert sched.splits > 1 and sched.dp_tiles == 0
    split, fixup = got
    assert len(split.placed) == sched.sk_tiles * sched.splits and split.k == sched.split_k
    assert split.out_bytes == cfg["BLOCK_M"] * cfg["BLOCK_N"] * 4
    assert len(fixup.placed) == sched.sk_tiles and fixup.k == 0
    assert fixup.read_bytes == sched.splits * split.out_bytes


def test_workbench_predict_is_the_model():
    import workbench
    from workbench import model

    assert workbench.predict is model.predict
    with pytest.raises(AttributeError, match="no_such_name"):
        workbench.no_such_name  # noqa: B018


@pytest.mark.parametrize(("causal", "expected"), [
    # S = S_k = 512, 128 x 64 tiles: causal block i runs 2i unmasked tiles and 2 diagonal ones
    (1, [(0, 2), (2, 2), (4, 2), (6, 2)]),
    (0, [(8, 0)] * 4),
])
def test_attention_trips_follow_the_kernels_bounds(causal, expected):
    cfg = {"BLOCK_M": 128, "BLOCK_N": 64}
    assert [attention.trips("v4", cfg, i, 512, 512, causal) for i in range(4)] == expected
    assert {attention.trips("v2", cfg, i, 512, 512, causal) for i in range(4)} == {(8,)}   # v2 skips nothing


def test_attention_trips_of_a_ragged_key_length():
    cfg = {"BLOCK_M": 64, "BLOCK_N": 64}
    assert attention.trips("v3", cfg, 0, 100, 100, 0) == (1, 1)    # one whole tile, then the ragged one masked


def test_uneven_programs_leave_slots_idle():
    from workbench.model import uneven

    assert uneven.makespan([4.0, 1.0, 1.0, 1.0, 1.0], 2) == 4.0
    assert uneven.makespan([1.0, 1.0, 1.0, 1.0, 4.0], 2) == 6.0   # the long one starts last


def test_matrix_loops_are_every_innermost_loop_with_mfmas():
    from workbench.isa import parse as isa_parse

    text = LOOP + LOOP.replace(".LBB0_1", ".LBB0_2") + ".LBB0_3:\n\tv_add_u32_e32 v1, 1, v1\n\ts_cbranch_scc1 .LBB0_3\n"
    loops = isa_parse.matrix_loops(text.splitlines(), "amdgcn")
    assert [lines[0].split(":")[0] for lines in loops] == [".LBB0_1", ".LBB0_2"]


def test_grouped_row_tiles_split_each_group():
    assert grouped_gemm.row_tiles([300, 0, 128], 128) == [(0, 128), (0, 128), (0, 44), (2, 128)]
    assert grouped_gemm.group_rows((100, 8, 8, 4, 0)) == [25, 25, 25, 25]


@pytest.mark.parametrize("rung", ["v2", "v4"])
def test_grouped_waves_cover_every_tile_once(rung):
    shape = (300, 64, 300, 3, 0)
    cfg = {"BLOCK_M": 64, "BLOCK_N": 128, "NUM_PROGS": 4, "NUM_XCDS": 2}
    sizes = grouped_gemm.group_rows(shape)
    table = grouped_gemm.row_tiles(sizes, 64)
    got = [tile for w in grouped_gemm.waves(rung, cfg, shape, table, sizes, 4, 2, "gfx942", 4) for _, tile in w.placed]
    assert sorted(got) == [(i, j) for i in range(len(table)) for j in range(3)]
    assert all(w.k == 64 for w in grouped_gemm.waves(rung, cfg, shape, table, sizes, 4, 2, "gfx942", 4))


def test_grouped_traffic_reads_each_experts_weights():
    # two row tiles of expert 0 and one of expert 1, one column block: w blocks (0, 0) and (1, 0)
    wave = tiles.Wave(((0, (0, 0)), (0, (1, 0)), (0, (2, 0))), k=8)
    table = [(0, 4), (0, 4), (1, 4)]
    got = tiles.block_traffic(wave, lambda i: table[i][1], lambda j: 16, lambda i, j: (table[i][0], j), 1, 1)
    assert got["hbm"] == (3 * 4 + 2 * 16) * 8 + 3 * 4 * 16


def test_backward_trips_follow_the_kernels_bounds():
    from workbench.model import attention_backward as bwd

    kv = {"BLOCK_M": 32, "BLOCK_N": 128}
    # S = 256: key block 0 (keys 0..127) sees query blocks 0..3 masked, 4..7 unmasked; x2 heads
    assert bwd.dkdv_trips(kv, 0, 256, 2, 1) == (8, 8)
    assert bwd.dkdv_trips(kv, 1, 256, 2, 1) == (8, 0)
    assert bwd.dkdv_trips(kv, 1, 256, 2, 0) == (0, 16)
    q = {"BLOCK_M": 128, "BLOCK_N": 32}
    assert bwd.dq_trips(q, 0, 256, 1) == (0, 4)     # keys 0..127: all on the diagonal
    assert bwd.dq_trips(q, 1, 256, 1) == (4, 4)
    assert bwd.dq_trips(q, 1, 256, 0) == (8, 0)


@pytest.mark.parametrize(("args", "named"), [
    (("gemm", "v4", (8, 8, 8)), "attention"),
    (("attention", "v4", (1, 4, 1, 8, 8, 128, 1)), "v5"),
    (("attention", "v5", (1, 4, 1, 8, 8, 64, 1), "bf16", "H200"), "head dims that pad to 128"),   # on sm_90 too
])
def test_backward_requests_name_what_is_covered(args, named):
    from workbench.model import predict_backward

    with pytest.raises(NotCovered, match=named):
        predict_backward(*args)


@pytest.mark.parametrize("gpu", ["MI300X", "MI325X", "MI355X"])
def test_the_models_lds_rate_is_the_roofline_specs(gpu):
    """The model charges LDS at machine.yaml's bytes per clock per CU; the roofline draws the
    spec's LDS roof: one number, written twice, so they must agree (to the spec's rounding)."""
    from workbench.model import machine

    chip_spec = roofline.spec(gpu)
    per_clock = machine.lds_bytes_per_clk(chip_spec.target).value
    tbps = per_clock * chip_spec.compute_units * chip_spec.clock_ghz * 1e9 / 1e12
    assert chip_spec.bandwidth("lds") == pytest.approx(tbps, rel=5e-3), (gpu, per_clock)
