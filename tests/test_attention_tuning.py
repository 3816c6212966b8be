"""Attention tuning: the ahead-of-time pruned space of the forward, the per-shape prune and
v4's tuner (the forward ``kernels.flash_attention`` runs).

The shipped table (``kernels/attention/tuned_space.json``) is checked for coverage and
for its verdicts from the numbers it stores; a few entries are recompiled to show the
numbers are true. The tuner is tested on the CPU with a fake clock.
"""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels import tuning
from kernels.attention import configs, v4_amd_tuned as v4
from kernels.attention.launch import head_block
from workbench import isa
from workbench.isa import tune_space
from workbench.check import check_rung

from table_sections import DEVICE_OF, DEVICES, SECTIONS, assert_verdicts, config_key, dtype_of, target_of


@pytest.mark.parametrize("section", SECTIONS)
def test_shipped_table_covers_exactly_the_candidates(section):
    """A changed candidate list without ``python -m workbench.isa.tune_space --op attention --write`` fails here."""
    table = configs.shipped()[section]
    recorded = [config_key(entry["config"]) for entry in table["kept"] + table["dropped"]]
    assert sorted(recorded) == sorted(config_key(tuning.as_dict(c)) for c in configs.candidates(target_of(section)))


@pytest.mark.parametrize("section", SECTIONS)
def test_each_config_is_compiled_at_its_head_dim_and_kept_only_if_it_fits(section):
    table = configs.shipped()[section]
    for entry in table["kept"] + table["dropped"]:
        assert list(tune_space.compiles(entry)) == [f"D{entry['config']['BLOCK_D']}"], entry
        if target_of(section) != "sm90":   # AMD entries count the 8/16-bit LDS ops
            assert all("narrow_lds_ops" in r for r in tune_space.compiles(entry).values()), entry
    assert_verdicts(section, table, lambda cfg: (cfg["BLOCK_D"],))
    assert {e["config"]["BLOCK_D"] for e in table["kept"]} == set(configs.HEAD_DIMS)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
@pytest.mark.parametrize("backend,arch", DEVICES)
@pytest.mark.parametrize("d", [16, 40, 64, 96, 128])
def test_space_is_the_kept_part_of_the_table_for_the_head_dim_class(backend, arch, d, dtype):
    space = [tuning.as_dict(c) for c in configs.space(backend, arch, d, dtype)]
    kept = configs.shipped()[tuning.target(configs.TABLE, backend, arch, dtype)]["kept"]
    assert space == [e["config"] for e in kept if e["config"]["BLOCK_D"] == (64 if d <= 64 else 128)]


WIDE_KEYS_D128 = dict(BLOCK_M=128, BLOCK_N=64, BLOCK_D=128, waves_per_eu=2, matrix_instr_nonkdim=32,
                      num_warps=8, num_stages=2)
SAMPLE = [   # (target, config or the head dim whose prior is taken); each compiles in seconds
    ("gfx942", 128),
    ("gfx942", WIDE_KEYS_D128),    # v4's docstring: the prior's tile with 32x32 MFMAs, dropped
    ("gfx950", 64),
    ("sm90", 128),
    ("gfx942:fp32", 128),
]


@pytest.mark.parametrize("target,cfg", SAMPLE, ids=lambda v: str(v) if not isinstance(v, dict) else "wide")
def test_table_entries_are_what_the_compiler_gives(target, cfg):
    if isinstance(cfg, int):
        backend, arch = DEVICE_OF[target_of(target)]
        cfg = tuning.as_dict(configs.space(backend, arch, cfg, dtype_of(target))[0])
    table = configs.shipped()[target]
    entry = {config_key(e["config"]): e for e in table["kept"] + table["dropped"]}[config_key(cfg)]
    measured = tune_space.measure("attention", target_of(target), cfg, dtype_of(target))
    assert {f"D{cfg['BLOCK_D']}": measured} == tune_space.compiles(entry)


def test_the_d128_prior_with_32x32_mfmas_is_dropped_for_its_16_bit_lds_ops():
    """v4's docstring: the prior's tile compiles with 32x32 MFMAs too, without spilling, but moves
    elements through LDS two bytes at a time; the table drops it (``tune_space.clean_lds``: the
    16x16 prior has no such op)."""
    table = configs.shipped()["gfx942"]
    wide = {config_key(e["config"]): e for e in table["dropped"]}[config_key(WIDE_KEYS_D128)]
    assert wide["D128"]["narrow_lds_ops"] > 0 and wide["D128"]["spills"] == 0
    assert wide["why"] == f"D128: {wide['D128']['narrow_lds_ops']} 8/16-bit LDS ops"
    prior = {config_key(e["config"]): e
             for e in table["kept"]}[config_key(tuning.as_dict(configs.space("hip", "gfx942", 128)[0]))]
    assert prior["D128"]["narrow_lds_ops"] == 0


def test_matrix_instr_nonkdim_picks_the_mfma_shape():
    """The knob the space varies reaches the compiler: 16 gives 16x16 MFMAs, 32 gives 32x32."""
    for nonkdim in (16, 32):
        report = isa.inspect("attention", "v4", "gfx942", torch.bfloat16,
                             overrides={"BLOCK_D": 128, "matrix_instr_nonkdim": nonkdim})
        assert all(f"_{nonkdim}x{nonkdim}x" in op for op in report.matrix_instructions), report.matrix_instructions


@pytest.mark.parametrize("backend,arch", DEVICES)
def test_timed_set_per_shape_is_small_and_never_empty(backend, arch):
    spec = kernels.spec("attention")
    for b, hq, hkv, s, sk, d, causal in [*spec.bench_shapes.values(), *spec.smoke_shapes]:
        timed = configs.prune(configs.space(backend, arch, d), s, sk)
        assert 1 <= len(timed) <= configs.TIMED, (s, sk, d, len(timed))
        assert all(c.kwargs["BLOCK_D"] == configs.head_class(d) for c in timed)
    for d in configs.HEAD_DIMS:
        long = configs.prune(configs.space(backend, arch, d), 4096, 4096)
        assert len({tuning.tile(c) for c in long}) > 1     # tile sizes compete
        assert all(c.kwargs["BLOCK_M"] <= 64 for c in configs.prune(configs.space(backend, arch, d), 40, 4096))


@pytest.mark.parametrize("backend,arch", DEVICES)
@pytest.mark.parametrize("d", configs.HEAD_DIMS)
def test_timed_set_spans_the_space(backend, arch, d):
    """Issue 18: the configs timed for a long sequence differ from each other, and among them
    are each warp count, stage count, ``waves_per_eu`` and MFMA shape the kept space offers,
    not near-copies of the prior."""
    space = configs.space(backend, arch, d)
    timed = configs.prune(space, 4096, 4096)
    assert timed[0] is space[0] and len(timed) == min(configs.TIMED, len(space))
    assert len({tuple(sorted(tuning.as_dict(c).items())) for c in timed}) == len(timed)
    for setting in ("num_warps", "num_stages", "waves_per_eu", "matrix_instr_nonkdim"):
        offered = {tuning.as_dict(c).get(setting) for c in space}
        assert {tuning.as_dict(c).get(setting) for c in timed} == offered, setting
    if backend == "hip":   # at D = 64 on gfx942 every 8-warp config moves 16-bit elements through LDS
        assert {c.num_warps for c in timed} == ({4} if (arch, d) == ("gfx942", 64) else {4, 8})
        assert {c.num_stages for c in timed} == {1, 2} and {c.kwargs["waves_per_eu"] for c in timed} == {0, 1, 2}


def test_distinct_takes_new_settings_first():
    """The prune's rule on a hand-made space: the first config, then what differs most."""
    cfg = configs._cfg
    space = [cfg(64, 64, 64, 4, 1), cfg(64, 64, 64, 4, 2), cfg(64, 32, 64, 8, 2), cfg(64, 64, 64, 8, 1)]
    assert tuning.distinct(space, 2) == [space[0], space[2]]
    assert tuning.distinct(space, 9) == [space[0], space[2], space[1], space[3]]


# -- v4's tuner, with a fake clock ---------------------------------------------------

FAKE_SPACE = [configs._cfg(32, 32, 64, 4, 1), configs._cfg(16, 32, 64, 4, 1), configs._cfg(32, 16, 64, 4, 1)]
FAKE_MS = {(32, 32): 3.0, (16, 32): 1.0, (32, 16): 2.0}   # (BLOCK_M, BLOCK_N) -> "milliseconds"
SHAPE = (1, 2, 1, 20, 24, 32, 1)


@pytest.fixture
def fake_clock(monkeypatch, fake_tuner_clock):
    """Three candidates on the interpreter; timing runs the real launch and reads a fake time."""
    monkeypatch.setattr(configs, "space", lambda backend, arch, d, dtype=None: FAKE_SPACE)
    monkeypatch.setattr(v4, "_CHOSEN", {})
    return fake_tuner_clock(v4.v3_causal_lse, "launch", FAKE_MS)


def test_v4_tuner_picks_the_fastest_and_caches_per_bucket(fake_clock):
    rung = kernels.get("attention", 4)
    report = check_rung(rung, SHAPE, torch.float32)
    assert report.passed, report.message
    assert sorted(fake_clock) == sorted(FAKE_MS)               # each candidate timed once
    chosen = v4.chosen_config(SHAPE, torch.float32)
    assert chosen == dict(tuning.as_dict(FAKE_SPACE[1]), BLOCK_D=head_block(32))
    assert check_rung(rung, (2, 4, 2, 30, 17, 32, 1), torch.float32).passed  # same bucket: no timing
    assert len(fake_clock) == 3
    assert check_rung(rung, SHAPE[:-1] + (0,), torch.float32).passed       # not causal: timed
    assert len(fake_clock) == 6


def test_kernels_flash_attention_runs_the_tuned_config(fake_clock):
    q, k, v, _ = kernels.spec("attention").make_inputs(SHAPE, torch.float16)
    out = kernels.flash_attention(q, k, v, causal=True)
    torch.testing.assert_close(out.double(), kernels.spec("attention").reference(q, k, v, True),
                               rtol=1e-2, atol=1e-2, check_dtype=False)
    chosen = v4.chosen_config(SHAPE, torch.float16)
    assert (chosen["BLOCK_M"], chosen["BLOCK_N"]) == (16, 32) and len(fake_clock) == 3


def test_kernels_flash_attention_varlen_runs_the_tuned_config_of_its_bucket(fake_clock):
    """Issue 18: the packed forward is timed as it runs (VARLEN), per bucket of its longest
    lengths, apart from the dense bucket of the same lengths, not handed the untimed prior."""
    lengths = [20, 3, 11]
    q, k, v = (torch.randn(sum(lengths), h, 32) for h in (2, 1, 1))
    cu = torch.tensor([0, 20, 23, 34], dtype=torch.int32)
    out = kernels.flash_attention_varlen(q, k, v, cu, cu, 20, 20, causal=True)
    assert out.shape == q.shape and sorted(fake_clock) == sorted(FAKE_MS)
    packed = (1, 2, 1, 20, 20, 32, 1)
    assert v4.chosen_config(packed, torch.float32, packed=True)["BLOCK_M"] == 16
    assert v4.chosen_config(packed, torch.float32) is None      # the dense bucket is its own
    kernels.flash_attention_varlen(q, k, v, cu, cu, 20, 20, causal=True)
    assert len(fake_clock) == 3                                   # cached


def test_a_pinned_setting_skips_the_tuner(fake_clock):
    q, k, v, _ = kernels.spec("attention").make_inputs(SHAPE, torch.float32)
    assert v4.attention_v4(q, k, v, True, overrides={"BLOCK_N": 16}).shape == q.shape
    assert not fake_clock and v4.chosen_config(SHAPE, torch.float32)["BLOCK_N"] == 16
    with pytest.raises(ValueError, match="NOT_A_SETTING"):
        v4.attention_v4(q, k, v, True, overrides={"NOT_A_SETTING": 1})


def test_on_the_interpreter_nothing_is_timed(monkeypatch):
    monkeypatch.setattr(tuning, "time_ms", lambda fn: pytest.fail("timed on the interpreter"))
    shape = (1, 2, 2, 9, 33, 40, 0)
    kernels.get("attention", 4)(*kernels.spec("attention").make_inputs(shape, torch.float32)[:3])
    only = tuning.as_dict(configs.interpreter_configs()[0])
    assert v4.chosen_config(shape, torch.float32) == dict(only, BLOCK_D=head_block(40))


@pytest.mark.gpu
def test_on_a_gpu_the_tuner_times_the_pruned_set_and_shows_the_winner(monkeypatch):
    """Not run here (no GPU): the first call of a bucket times each pruned config once."""
    here = kernels.backend.current()
    shape = (1, 32, 8, 2048, 2048, 128, 1)
    timed, real = [], tuning.time_ms
    monkeypatch.setattr(tuning, "time_ms", lambda fn: timed.append(real(fn)) or timed[-1])
    q, k, v, _ = kernels.spec("attention").make_inputs(shape, torch.bfloat16, here.device)
    kernels.flash_attention(q, k, v, causal=True)
    pruned = v4._pruned(here.name, here.arch, 2048, 2048, 128)
    assert len(timed) == len(pruned) > 1 and v4.chosen_config(shape, torch.bfloat16) in pruned
