"""GEMM tuning: the ahead-of-time pruned space, the per-shape prune, v6's tuner, and the
machine code of the tuned loop (no masks, no peeled K step when K allows).

The shipped table (``kernels/gemm/tuned_space.json``) is checked for coverage and
for its verdicts from the numbers it stores; a few entries are recompiled to show
the numbers are true. The tuner is tested on the CPU with a fake clock.
"""
from __future__ import annotations

import collections
import dataclasses
import re

import pytest
import torch

import kernels
from kernels import plans, tuning
from kernels.gemm import configs, v6_persistent as v6
from workbench import isa
from workbench.isa import parse as isa_parse, tune_space
from workbench.check import check_rung

from table_sections import DEVICE_OF, DEVICES, SECTIONS, TARGETS, assert_verdicts, config_key, dtype_of, target_of

MAX_TIMED = configs.TILE_SIZES * configs.PER_TILE


def _entries(target: str) -> list[dict]:
    table = configs.shipped()[target]
    return table["kept"] + table["dropped"]


@pytest.mark.parametrize("section", SECTIONS)
def test_shipped_table_covers_exactly_the_candidates(section):
    """A changed candidate list without ``python -m workbench.isa.tune_space --write`` fails here."""
    recorded = [config_key(entry["config"]) for entry in _entries(section)]
    wanted = [config_key(tuning.as_dict(c)) for c in configs.candidates(target_of(section))]
    assert sorted(recorded) == sorted(wanted)


COMPILES = (*configs.LAYOUTS, "NT_bias")   # each layout, and nn.Linear's launch with its bias epilogue


@pytest.mark.parametrize("section", SECTIONS)
def test_kept_configs_fit_in_every_compile_and_dropped_ones_do_not(section):
    table = configs.shipped()[section]
    assert all(list(tune_space.compiles(e)) == list(COMPILES) for e in table["kept"] + table["dropped"])
    assert_verdicts(section, table)
    assert not any(e.get("spilling") for e in table["kept"]), "every GEMM section keeps a config that fits"
    assert list(tune_space.OPS["gemm"].compiles(table["kept"][0]["config"])) == list(COMPILES)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, torch.float32), ids=str)
@pytest.mark.parametrize("backend,arch,target", [("hip", "gfx942", "gfx942"), ("hip", "gfx950", "gfx950"),
                                                 ("cuda", "sm_90", "sm90")])
def test_space_is_the_kept_part_of_the_table(backend, arch, target, dtype):
    """A float32 call tunes among its own section's kept configs; fp16 among bf16's."""
    space = [tuning.as_dict(c) for c in configs.space(backend, arch, dtype)]
    target = tuning.section(target, dtype)
    assert space == [e["config"] for e in configs.shipped()[target]["kept"]]


def test_the_table_compiles_every_layout_a_training_step_runs(monkeypatch):
    """nn.Linear's forward and its two backward GEMMs launch v6 on NT, NN (dgrad) and TN (wgrad):
    the layouts the table compiles, or a config that spills in one of them would be timed there."""
    seen = set()
    real = v6.layout
    monkeypatch.setattr(v6, "layout", lambda a, b: seen.add(real(a, b)) or real(a, b))
    plans.invalidate()
    layer = kernels.nn.Linear(24, 16)
    y = layer(torch.randn(2, 5, 24, requires_grad=True))
    y.backward(torch.randn_like(y))   # a loss's gradient, contiguous (sum's is a stride-0 view)
    plans.invalidate()
    assert seen == {"NT", "NN", "TN"} and seen <= set(configs.LAYOUTS)


# (target, config, layout): the issue's claims and the prior; each compiles in a few seconds.
BIG = dict(BLOCK_M=256, BLOCK_N=256, BLOCK_K=64, GROUP_M=4, matrix_instr_nonkdim=16, kpack=2, num_stages=2)
# fits in NN and NT, spills VGPRs in TN (M-contiguous A, every weight gradient) on gfx942
WGRAD_SPILLS = dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=128, GROUP_M=8, waves_per_eu=2, matrix_instr_nonkdim=16,
                    kpack=2, num_warps=4, num_stages=2)
SAMPLE = [
    ("gfx942", dict(BIG, num_warps=8, waves_per_eu=2), "NN"),       # the issue: spills
    ("gfx942", dict(BIG, num_warps=4, waves_per_eu=0), "NN"),
    ("gfx942", dict(BIG, BLOCK_M=128, num_warps=8, waves_per_eu=2), "NT"),  # the issue: 186 VGPRs
    ("sm90", None, "NN"),                                            # the first kept config
    ("gfx942", None, "NT_bias"),                                     # the prior, as nn.Linear runs it
    ("gfx942", WGRAD_SPILLS, "TN"),                                  # spills in the wgrad's layout only
    ("gfx950", None, "NT_bias"),
    ("gfx942:fp32", None, "TN"),                                     # float32's first kept config
    ("sm90:fp32", None, "NN"),
]


@pytest.mark.parametrize("target,cfg,compile_name", SAMPLE, ids=lambda v: str(v) if not isinstance(v, dict) else "")
def test_table_entries_are_what_the_compiler_gives(target, cfg, compile_name):
    entries = {config_key(e["config"]): e for e in _entries(target)}
    cfg = cfg or configs.shipped()[target]["kept"][0]["config"]
    entry = entries[config_key(cfg)]
    extra = tune_space.OPS["gemm"].compiles(cfg)[compile_name]
    assert tune_space.measure("gemm", target_of(target), {**cfg, **extra}, dtype_of(target)) == entry[compile_name]


@pytest.mark.parametrize("target,compile_name", [("gfx942", "NT_bias"), ("gfx950", "NT"), ("sm90", "NN")])
def test_fp16_fits_where_bf16_does(target, compile_name):
    """fp16 takes bf16's verdicts (kernels.tuning.section): the same bytes per element, and no
    more registers (gfx942 rounds to bf16 in software: the v5 256x256 test below); shown on
    the first kept config."""
    cfg = configs.shipped()[target]["kept"][0]
    extra = tune_space.OPS["gemm"].compiles(cfg["config"])[compile_name]
    fp16 = tune_space.measure("gemm", target, {**cfg["config"], **extra}, torch.float16)
    assert tune_space.verdict(target, fp16) is None
    assert fp16["vgprs"] <= cfg[compile_name]["vgprs"] and fp16["lds_bytes"] == cfg[compile_name]["lds_bytes"]


@pytest.mark.parametrize("target", TARGETS)
def test_float32s_section_drops_what_float32_cannot_hold(target):
    """At float32 a tile needs twice bf16's LDS and registers: bf16's prior for a large square
    GEMM spills, or on gfx942 cannot launch at all (more LDS than a CU has), and leaves
    float32's section, whose own prior fits."""
    wide = tuning.section(target, torch.float32)
    bf16_prior = configs.prune(configs.space(*DEVICE_OF[target]), 4096, 4096, 4096)[0]
    dropped = {config_key(e["config"]): e["why"] for e in configs.shipped()[wide]["dropped"]}
    assert config_key(tuning.as_dict(bf16_prior)) in dropped
    fp32_prior = configs.prune(configs.space(*DEVICE_OF[target], torch.float32), 4096, 4096, 4096)[0]
    assert tuning.as_dict(fp32_prior) in [e["config"] for e in configs.shipped()[wide]["kept"]]
    if target == "gfx942":
        assert "bytes of LDS > 65536" in dropped[config_key(tuning.as_dict(bf16_prior))]


def test_a_config_that_spills_only_in_the_wgrads_layout_is_not_in_the_space():
    entry = next(e for e in configs.shipped()["gfx942"]["dropped"] if e["config"] == WGRAD_SPILLS)
    assert entry["why"].startswith("TN: spills") and tune_space.verdict("gfx942", entry["NT"]) is None
    assert WGRAD_SPILLS not in [tuning.as_dict(c) for c in configs.space("hip", "gfx942")]


def test_the_issues_spilling_config_is_not_in_the_space():
    spilling = dict(BIG, num_warps=8, waves_per_eu=2)
    assert spilling not in [tuning.as_dict(c) for c in configs.space("hip", "gfx942")]


def test_a_config_that_spills_sgprs_is_dropped_like_one_that_spills_vgprs():
    fits = {"vgprs": 128, "agprs": 0, "spills": 0, "sgpr_spills": 0, "scratch_bytes": 0, "lds_bytes": 0,
            "occupancy": 2}
    assert tune_space.verdict("gfx942", fits) is None
    assert tune_space.verdict("gfx942", {**fits, "sgpr_spills": 4}) == "spills 4 SGPRs"
    assert tune_space.verdict("gfx942", {**fits, "spills": 3}) == "spills 3 VGPRs"


@pytest.mark.parametrize("backend,arch", DEVICES)
def test_timed_set_per_shape_is_small_and_never_empty(backend, arch):
    space = configs.space(backend, arch)
    spec = kernels.spec("gemm")
    for shape in [*spec.bench_shapes.values(), *spec.smoke_shapes, (8192, 8192, 8192), (64, 4096, 4096)]:
        timed = configs.prune(space, *shape)
        assert 1 <= len(timed) <= MAX_TIMED, (shape, len(timed))
    decode = configs.prune(space, 16, 14336, 4096)
    assert all(c.kwargs["BLOCK_M"] <= 16 for c in decode)
    big = configs.prune(space, 8192, 8192, 8192)
    assert len({(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in big}) > 1  # tile sizes compete


# -- v6's tuner, with a fake clock ---------------------------------------------------

FAKE_SPACE = [configs._cfg(32, 32, 32, 4, 2, group_m=2), configs._cfg(16, 32, 16, 4, 2, group_m=2),
              configs._cfg(32, 16, 32, 4, 2, group_m=2)]
FAKE_MS = {(32, 32): 3.0, (16, 32): 1.0, (32, 16): 2.0}   # (BLOCK_M, BLOCK_N) -> "milliseconds"


@pytest.fixture
def fake_clock(monkeypatch, fake_tuner_clock):
    """Three candidates on the interpreter; timing runs the real launch and reads a fake time."""
    monkeypatch.setattr(configs, "space", lambda backend, arch="gfx942", dtype=None: FAKE_SPACE)
    monkeypatch.setattr(v6, "_CHOSEN", {})
    return fake_tuner_clock(v6, "_launch", FAKE_MS)


def test_v6_tuner_picks_the_fastest_and_caches_per_bucket(fake_clock):
    rung = kernels.get("gemm", 6)
    report = check_rung(rung, (40, 36, 20), torch.float32)
    assert report.passed, report.message
    assert sorted(fake_clock) == sorted(FAKE_MS)               # each candidate timed once
    chosen = v6.chosen_config((40, 36, 20), torch.float32)
    assert (chosen["BLOCK_M"], chosen["BLOCK_N"], chosen["BLOCK_K"]) == (16, 32, 16)
    assert {"num_warps", "num_stages", "NUM_XCDS", "NUM_PROGS", "SPLITS", "layout"} <= set(chosen)
    assert check_rung(rung, (48, 60, 30), torch.float32).passed  # same bucket: no new timing
    assert len(fake_clock) == 3
    assert check_rung(rung, (40, 36, 20), torch.float32, layout="col").passed  # new layout: timed
    assert len(fake_clock) == 6 and v6.chosen_config((40, 36, 20), torch.float32)["layout"] == "TT"


def test_kernels_matmul_runs_the_tuned_config(fake_clock):
    a, b = kernels.spec("gemm").make_inputs((40, 36, 20), torch.float16)
    out = kernels.matmul(a, b)
    torch.testing.assert_close(out.float(), a.float() @ b.float(), rtol=1e-2, atol=1e-2)
    chosen = v6.chosen_config((40, 36, 20), torch.float16)
    assert (chosen["BLOCK_M"], chosen["BLOCK_N"]) == (16, 32) and len(fake_clock) == 3


def test_a_pinned_tile_skips_the_tuner(fake_clock):
    pinned = v6.gemm_v6(*kernels.spec("gemm").make_inputs((40, 36, 20), torch.float32),
                        overrides={"BLOCK_M": 16})
    assert pinned.shape == (40, 36) and not fake_clock
    assert v6.chosen_config((40, 36, 20), torch.float32)["BLOCK_M"] == 16


def test_on_the_interpreter_nothing_is_timed(monkeypatch):
    monkeypatch.setattr(tuning, "time_ms", lambda fn: pytest.fail("timed on the interpreter"))
    a, b = kernels.spec("gemm").make_inputs((33, 17, 9), torch.float32)
    kernels.get("gemm", 6)(a, b)
    only = tuning.as_dict(configs.interpreter_configs()[0])
    chosen = v6.chosen_config((33, 17, 9), torch.float32)
    assert {k: chosen[k] for k in only} == only


# -- machine code of the tuned loop ----------------------------------------------------

def _mnemonics(text: str) -> collections.Counter:
    return collections.Counter(isa_parse.mnemonic(line) for line in text.splitlines())


@pytest.mark.parametrize("target", ("gfx942", "gfx950"))
def test_top_rung_hot_loop_has_no_masks(target):
    """Wrapped offsets and the peeled K step leave the loop without a vector compare or select."""
    loop = _mnemonics(isa.inspect("gemm", "v6", target).hot_loop)
    masks = {op: n for op, n in loop.items() if op and op.startswith(("v_cmp", "v_cndmask"))}
    assert not masks and any(op and op.startswith("v_mfma") for op in loop), masks


@pytest.mark.parametrize("rung", ("v5", "v6"))
def test_even_k_compiles_no_peeled_step(rung):
    """K=8192 is a multiple of BLOCK_K: the kernel has fewer MFMAs than with the ragged step."""
    def mfmas(report):
        return sum(n for op, n in report.matrix_instructions.items() if op.startswith("v_mfma"))

    even = isa.inspect("gemm", rung, "gfx942")
    ragged = isa.inspect("gemm", rung, "gfx942", overrides={"EVEN_K": False})
    assert mfmas(even) < mfmas(ragged)


def test_inspector_overrides_change_the_compile_and_are_cached_apart(monkeypatch):
    prior = isa.inspect("gemm", "v6", "gfx942")
    other = isa.inspect("gemm", "v6", "gfx942", overrides={"waves_per_eu": 0})
    assert other.options["waves_per_eu"] == 0 and other is not prior
    assert isa.inspect("gemm", "v6", "gfx942", overrides={"waves_per_eu": 0}) is other
    assert isa.inspect("gemm", "v4", "gfx942", overrides={"waves_per_eu": 3}).options["waves_per_eu"] == 3
    with pytest.raises(RuntimeError, match="kpack"):   # not a setting of the FP8 rungs
        isa.inspect("gemm_fp8", "v1", "gfx942", overrides={"kpack": 2})
    with pytest.raises(RuntimeError, match="NOT_A_SETTING"):
        isa.inspect("gemm", "v6", "gfx942", overrides={"NOT_A_SETTING": 1})
    fixed = dataclasses.replace(kernels.get("gemm", "v4"), aot=lambda dtype, backend, arch: [])
    monkeypatch.setattr(kernels, "get", lambda op, which: fixed)   # a rung without settings
    with pytest.raises(ValueError, match="takes no overrides"):
        isa.inspect("gemm", "v4", "gfx942", overrides={"kpack": 1})


def test_k_contiguous_b_fills_lds_with_16_byte_writes():
    """``torch.nn.Linear``'s weight as B ("NT") goes to LDS in ds_write_b128 only; row-major B
    ("NN") needs narrower writes: why the table is compiled, and tuned, per layout."""
    def writes(overrides):
        loop = _mnemonics(isa.inspect("gemm", "v6", "gfx942", overrides=overrides).hot_loop)
        return {op for op in loop if op and op.startswith("ds_write")}

    assert writes({"layout": "NT"}) == {"ds_write_b128"}
    assert writes(None) - {"ds_write_b128"}


def _spilled_sgpr_writers(asm: str) -> collections.Counter:
    """Per mnemonic, how many of the SGPRs spilled into VGPR lanes (``v_writelane_b32 vN, sK, lane``)
    that instruction computed: the last writer of ``sK`` above the spill, in text order. An
    instruction's first operand is its destination, except for compares into SCC and stores."""
    writer, found = {}, collections.Counter()
    for line in isa_parse.code_lines(asm, "amdgcn"):
        op = isa_parse.mnemonic(line)
        if not op or op.startswith(("s_cmp", "s_bitcmp", "s_store", "s_buffer_store")):
            continue
        operands = [o.strip() for o in line.split(";")[0].split(None, 1)[-1].split(",")]
        if op == "v_writelane_b32":
            found[writer.get(operands[1])] += 1
        elif pair := re.fullmatch(r"s\[(\d+):(\d+)\]", operands[0]):
            writer.update({f"s{i}": op for i in range(int(pair[1]), int(pair[2]) + 1)})
        else:
            writer[operands[0]] = op
    return found


def test_spilled_sgpr_writers_reads_the_spill_back_to_its_compare():
    asm = "\n".join(["v_cmp_o_f32_e64 s[2:3], v0, v0", "s_cmp_lg_u32 s2, 1", "s_mov_b32 s4, 7",
                     "v_writelane_b32 v255, s2, 0", "v_writelane_b32 v255, s3, 1",
                     "v_writelane_b32 v255, s4, 2 ; a comment"])
    assert _spilled_sgpr_writers(asm) == {"v_cmp_o_f32_e64": 2, "s_mov_b32": 1}


def test_v5_256x256_tile_spills_sgprs_on_gfx942_only_for_the_software_bf16_rounding():
    """At 256x256x64 with 4 warps each thread holds 256 fp32 accumulators (506 of its 512
    VGPRs+AGPRs, no VGPR spill). gfx942 has no fp32 -> bf16 instruction: the store rounds in
    software with one NaN check per element (``v_cmp_o_f32``), whose result is a 64-bit lane
    mask in an SGPR pair. The compiler computes the checks ahead of their selects, so more
    masks are live than SGPRs exist, and it spills them into VGPR lanes after the K loop:
    every spilled SGPR holds a NaN mask. At fp16 (the conversion is one instruction) and on
    gfx950 (``v_cvt_pk_bf16_f32``) the same tile compiles without spills.

    The tile still never runs: the tuners' space is v6's prune (:mod:`kernels.gemm.configs`),
    and v6's second epilogue (a split's fp32 partial tile) spills VGPRs at every 256x256
    config on both targets (in one layout at least), so the shipped table drops them all."""
    cfg = dict(BIG, num_warps=4, waves_per_eu=0)
    bf16 = isa.inspect("gemm", "v5", "gfx942", torch.bfloat16, overrides=cfg)
    ops = _mnemonics(bf16.asm)
    per_thread = cfg["BLOCK_M"] * cfg["BLOCK_N"] // (64 * cfg["num_warps"])
    assert (bf16.spills, bf16.vgprs + bf16.agprs, bf16.occupancy.value) == (0, 506, 1), bf16.summary()
    assert sum(n for op, n in ops.items() if op and op.startswith("v_cmp_o_f32")) == per_thread
    assert bf16.sgpr_spills == ops["v_writelane_b32"] > 0 and not ops["v_cvt_pk_bf16_f32"]
    assert _spilled_sgpr_writers(bf16.asm) == {"v_cmp_o_f32_e64": bf16.sgpr_spills}
    assert "v_writelane_b32" not in _mnemonics(bf16.hot_loop)
    fp16 = isa.inspect("gemm", "v5", "gfx942", torch.float16, overrides=cfg)
    gfx950 = isa.inspect("gemm", "v5", "gfx950", torch.bfloat16, overrides={**cfg, "kpack": 1})
    for fits in (fp16, gfx950):
        assert (fits.spills, fits.sgpr_spills) == (0, 0), fits.summary()
        assert not any(op and op.startswith("v_cmp_o_f32") for op in _mnemonics(fits.asm))
    assert "v_cvt_pk_bf16_f32" in _mnemonics(gfx950.asm)
    for target in ("gfx942", "gfx950"):
        big = [e for e in _entries(target) if (e["config"]["BLOCK_M"], e["config"]["BLOCK_N"]) == (256, 256)]
        assert big and all(any(e[layout]["spills"] for layout in configs.LAYOUTS) for e in big), target
        assert not [e for e in configs.shipped()[target]["kept"] if e in big], target
