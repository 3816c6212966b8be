"""Attention backward tuning: the ahead-of-time pruned space of v5's two kernels (dK/dV and
dQ, tuned apart), the per-shape prune and v5's tuner.

The shipped table (``kernels/attention/tuned_space_backward.json``) is checked for
coverage and for its verdicts from the numbers it stores; a few entries are recompiled
to show the numbers are true. The tuner is tested on the CPU with a fake clock.
"""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels import tuning
from kernels.attention import configs, configs_backward as space_bwd, v5_backward as v5
from kernels.attention.launch import head_block
from table_sections import DEVICE_OF, DEVICES, SECTIONS, assert_verdicts, config_key, target_of
from workbench.isa import tune_space
from workbench.check import check_rung


def _entries(target: str) -> list[dict]:
    table = space_bwd.shipped()[target]
    return table["kept"] + table["dropped"]


@pytest.mark.parametrize("section", SECTIONS)
def test_shipped_table_covers_exactly_the_candidates(section):
    """A changed candidate list without ``python -m workbench.isa.tune_space --op attention_backward
    --write`` fails here."""
    recorded = [config_key(entry["config"]) for entry in _entries(section)]
    assert sorted(recorded) == sorted(config_key(tuning.as_dict(c)) for c in space_bwd.candidates(target_of(section)))


@pytest.mark.parametrize("section", SECTIONS)
def test_each_config_is_compiled_as_its_kernel_at_its_head_dim_and_kept_only_if_it_fits(section):
    table = space_bwd.shipped()[section]
    for entry in _entries(section):
        cfg = entry["config"]
        name = f"{cfg['KERNEL']}_D{cfg['BLOCK_D']}"
        assert list(tune_space.compiles(entry)) == [name, f"{name}_packed"], entry   # dense and VARLEN
        if target_of(section) != "sm90":   # AMD entries count the 8/16-bit LDS ops
            assert all("narrow_lds_ops" in r for r in tune_space.compiles(entry).values()), entry
    assert_verdicts(section, table, lambda cfg: (cfg["KERNEL"], cfg["BLOCK_D"]))
    assert {(e["config"]["KERNEL"], e["config"]["BLOCK_D"]) for e in table["kept"]} == \
        {(kernel, d) for kernel in space_bwd.KERNELS for d in configs.HEAD_DIMS}


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
@pytest.mark.parametrize("d", configs.HEAD_DIMS)
def test_the_priors_move_no_narrow_elements_through_lds_and_come_first(target, d):
    """The configs a launch runs untimed (each kernel's prior) have no 8/16-bit LDS ops at
    either head dim, the table keeps none that has some beside one that has none
    (:func:`tune_space.clean_lds`), and each group's kept configs are in the prior's order
    (:func:`tune_space.prior_first`). The per-compile verdict itself does not judge them."""
    section = space_bwd.shipped()[target]
    recorded = {config_key(e["config"]): e for e in section["kept"]}
    for kernel, cfg in v5.prior("hip", target, d).items():
        assert recorded[config_key(cfg)][f"{kernel}_D{d}"]["narrow_lds_ops"] == 0, cfg
    group = tune_space.OPS["attention_backward"].group
    assert tune_space.prior_first(target, {"kept": list(section["kept"])}, group)["kept"] == section["kept"]
    assert tune_space.verdict(target, {"spills": 0, "sgpr_spills": 0, "scratch_bytes": 0,
                                       "lds_bytes": 0, "narrow_lds_ops": 4}) is None


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_at_d128_dkdv_keeps_no_config_of_two_waves(target):
    """v5's Limits: at D = 128 every 2-wave dK/dV candidate spills or has 8/16-bit LDS ops,
    so its prior runs 1 wave/SIMD; the other priors run 2 or more."""
    section = space_bwd.shipped()[target]
    two = [e for e in section["kept"] + section["dropped"] if tune_space.waves(e) >= 2
           and (e["config"]["KERNEL"], e["config"]["BLOCK_D"]) == ("dkdv", 128)]
    assert two and not [e for e in two if e in section["kept"]]
    kept = {config_key(e["config"]): e for e in section["kept"]}
    waves = {(kernel, d): tune_space.waves(kept[config_key(cfg)])
             for d in configs.HEAD_DIMS for kernel, cfg in v5.prior("hip", target, d).items()}
    assert waves.pop(("dkdv", 128)) == 1 and min(waves.values()) >= 2, waves


def _entry(name: str, kernel: str = "dq", narrow: int = 0, occupancy: int = 2, spills: int = 0,
           mma_sync: int = 0) -> dict:
    """A made-up table entry: config ``name`` of ``kernel`` at D = 64, one compile."""
    return {"config": {"KERNEL": kernel, "BLOCK_D": 64, "name": name},
            "dq_D64": {"spills": spills, "sgpr_spills": 0, "scratch_bytes": 0, "lds_bytes": 0,
                       "narrow_lds_ops": narrow, "mma_sync_ops": mma_sync, "occupancy": occupancy}}


GROUP = tune_space.OPS["attention_backward"].group


def test_clean_lds_drops_narrow_configs_only_where_the_group_keeps_a_clean_one():
    table = {"kept": [_entry("a", narrow=8), _entry("b"), _entry("c", "dkdv", narrow=72)], "dropped": []}
    pruned = tune_space.clean_lds(table, GROUP)
    assert [e["config"]["name"] for e in pruned["kept"]] == ["b", "c"]   # dK/dV has no clean one
    assert [(e["config"]["name"], e["why"]) for e in pruned["dropped"]] == [("a", "dq_D64: 8 8/16-bit LDS ops")]


def test_prior_first_prefers_no_spills_then_no_narrow_lds_ops_then_more_waves():
    kept = [_entry("narrow", narrow=8, occupancy=4), _entry("one wave", occupancy=1),
            _entry("two waves"), _entry("spills", spills=3, occupancy=4), _entry("two waves, later"),
            _entry("other kernel", "dkdv")]
    ordered = tune_space.prior_first("gfx942", {"kept": kept}, GROUP)["kept"]
    assert [e["config"]["name"] for e in ordered] == \
        ["two waves", "two waves, later", "one wave", "narrow", "spills", "other kernel"]
    sm90 = [e for e in kept if e["config"]["name"] != "spills"]   # there neither LDS ops nor waves rank
    assert tune_space.prior_first("sm90", {"kept": sm90}, GROUP)["kept"] == sm90


def test_prior_first_on_sm90_prefers_no_spills_then_wgmma_only():
    """sm90: a config with ``mma.sync`` products (a tile with no warpgroup shape) ranks after the
    ``wgmma`` ones, whatever their waves; ties keep candidate order. AMD ignores the count."""
    kept = [_entry("mma.sync", mma_sync=128, occupancy=2), _entry("spills", spills=3), _entry("wgmma", occupancy=1),
            _entry("wgmma, later"), _entry("other kernel", "dkdv", mma_sync=64)]
    ordered = tune_space.prior_first("sm90", {"kept": kept}, GROUP)["kept"]
    assert [e["config"]["name"] for e in ordered] == ["wgmma", "wgmma, later", "mma.sync", "spills", "other kernel"]
    assert [e["config"]["name"] for e in tune_space.prior_first("gfx942", {"kept": kept[:1] + kept[2:4]}, GROUP)["kept"]] \
        == ["mma.sync", "wgmma, later", "wgmma"]   # by waves alone


@pytest.mark.parametrize("d", configs.HEAD_DIMS)
def test_the_sm90_priors_take_wgmma_only_and_come_first(d):
    """Each kernel's sm90 prior at either head dim is recorded without ``mma.sync`` products in
    either compile (dense and packed; ``tests/test_attention_isa.py`` compiles them) and the
    table's sm90 section is in prior_first's order; the 32 x 32 dK/dV tile, the D = 128 prior
    before, is kept there behind it, with mma.sync."""
    section = space_bwd.shipped()["sm90"]
    recorded = {config_key(e["config"]): e for e in section["kept"]}
    for kernel, cfg in v5.prior("cuda", "sm90", d).items():
        assert [r["mma_sync_ops"] for r in tune_space.compiles(recorded[config_key(cfg)]).values()] == [0, 0], cfg
    group = tune_space.OPS["attention_backward"].group
    assert tune_space.prior_first("sm90", {"kept": list(section["kept"])}, group)["kept"] == section["kept"]
    narrow = [e for e in section["kept"] if (e["config"]["KERNEL"], e["config"]["BLOCK_D"], e["config"]["BLOCK_N"])
              == ("dkdv", 128, 32)]
    assert narrow and all(tune_space.warp_products(e) for e in narrow)
    if d == 128:   # v5's docstring: the 16 x 128 tile from 65 keys on, the 32 x 32 one (mma.sync) at 64 or fewer
        tiles = {sk: (lambda c: (c["BLOCK_M"], c["BLOCK_N"]))(v5.prior("cuda", "sm90", d, 4096, sk)["dkdv"])
                 for sk in (64, 65)}
        assert tiles == {64: (32, 32), 65: (16, 128)}, tiles
        # configs_backward's comment: the 16 x 128 tile is clean with 3 stages, not 2 (packed)
        wide = {e["config"]["num_stages"]: e.get("why") for part in ("kept", "dropped") for e in section[part]
                if e["config"] | {"num_stages": 0} == dict(KERNEL="dkdv", BLOCK_M=16, BLOCK_N=128, BLOCK_D=128,
                                                           num_warps=8, num_stages=0)}
        assert wide[3] is None and wide[2] == "dkdv_D128_packed: 8 bytes of scratch per thread", wide


@pytest.mark.parametrize("backend,arch", DEVICES)
@pytest.mark.parametrize("kernel", space_bwd.KERNELS)
@pytest.mark.parametrize("d", [16, 64, 96, 128])
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
def test_space_is_the_kept_part_of_the_table_for_the_kernel_and_head_dim_class(backend, arch, kernel, d, dtype):
    space = [tuning.as_dict(c) for c in space_bwd.space(backend, arch, d, kernel, dtype)]
    kept = space_bwd.shipped()[tuning.target(space_bwd.TABLE, backend, arch, dtype)]["kept"]
    assert space == [e["config"] for e in kept
                     if (e["config"]["KERNEL"], e["config"]["BLOCK_D"]) == (kernel, 64 if d <= 64 else 128)]


SAMPLE = [   # (target, kernel, head dim) whose prior is recompiled; each compiles in seconds
    ("gfx942", "dkdv", 128),
    ("gfx950", "dq", 64),
    ("sm90", "dq", 128),
]


@pytest.mark.parametrize("target,kernel,d", SAMPLE)
def test_table_entries_are_what_the_compiler_gives(target, kernel, d):
    backend, arch = DEVICE_OF[target]
    cfg = tuning.as_dict(space_bwd.space(backend, arch, d, kernel)[0])
    entry = {config_key(e["config"]): e for e in _entries(target)}[config_key(cfg)]
    assert tune_space.compiled("attention_backward", target, cfg) == tune_space.compiles(entry)


def test_a_dropped_entry_is_what_the_compiler_gives():
    entry = space_bwd.shipped()["gfx942"]["dropped"][0]
    cfg = entry["config"]
    assert tune_space.compiled("attention_backward", "gfx942", cfg) == tune_space.compiles(entry)


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_the_two_kernels_get_their_own_tiles_on_amd(arch):
    """dK/dV's prior keeps a key block no narrower than its query steps (at D = 64 the square
    32 x 32 tile on 2 warps, the only one without 8/16-bit LDS ops, ``configs_backward.HIP_TILES``),
    dQ's a wider query block than its key steps, both with 16x16 MFMAs."""
    for d in configs.HEAD_DIMS:
        prior = v5.prior("hip", arch, d)
        assert (prior["dkdv"]["BLOCK_M"], prior["dkdv"]["BLOCK_N"]) == (32, 32) if d == 64 else \
            prior["dkdv"]["BLOCK_N"] > prior["dkdv"]["BLOCK_M"], prior
        assert prior["dq"]["BLOCK_M"] > prior["dq"]["BLOCK_N"], prior
        assert prior["dkdv"]["matrix_instr_nonkdim"] == prior["dq"]["matrix_instr_nonkdim"] == 16


@pytest.mark.parametrize("backend,arch", DEVICES)
def test_timed_set_per_shape_is_small_and_never_empty(backend, arch):
    spec = kernels.spec("attention")
    for b, hq, hkv, s, sk, d, causal in [*spec.bench_shapes.values(), *spec.smoke_shapes]:
        for kernel in space_bwd.KERNELS:
            timed = v5._pruned(backend, arch, s, sk, d, kernel)
            assert 1 <= len(timed) <= configs.TIMED, (s, sk, d, len(timed))
            assert all(c["KERNEL"] == kernel and c["BLOCK_D"] == head_block(d) for c in timed)


# -- v5's tuner, with a fake clock ---------------------------------------------------

FAKE_MS = {(32, 32): 3.0, (16, 32): 1.0, (32, 16): 2.0}   # (BLOCK_M, BLOCK_N) -> "milliseconds"
SHAPE = (1, 2, 1, 20, 24, 32, 1)


def _fake_space(backend, arch, d, kernel, dtype=None):
    return [space_bwd._cfg(kernel, bm, bn, 64, 4, 1) for bm, bn in FAKE_MS]


@pytest.fixture
def fake_clock(monkeypatch, fake_tuner_clock):
    """Three candidates per kernel on the interpreter; timing runs the real launch and reads a fake time."""
    monkeypatch.setattr(space_bwd, "space", _fake_space)
    monkeypatch.setattr(v5, "_CHOSEN", {})
    return fake_tuner_clock(v5, "launch", FAKE_MS)


def test_v5_tuner_picks_the_fastest_per_kernel_and_caches_per_bucket(fake_clock):
    rung = kernels.get("attention", "v5")
    # the first shape times each candidate of each kernel once; the second is in its bucket
    # (untimed); the third, not causal, is another bucket (timed)
    for shape, timed in ((SHAPE, 6), ((2, 4, 2, 30, 17, 32, 1), 6), (SHAPE[:-1] + (0,), 12)):
        report = check_rung(rung, shape, torch.float32)
        assert report.passed and len(fake_clock) == timed, (shape, report.message, fake_clock)
    assert sorted(fake_clock) == sorted([*FAKE_MS] * 4)
    chosen = v5.chosen_config(SHAPE, torch.float32)
    assert {kernel: (cfg["KERNEL"], cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_D"]) for kernel, cfg in chosen.items()} \
        == {"dkdv": ("dkdv", 16, 32, 32), "dq": ("dq", 16, 32, 32)}


def test_a_pinned_setting_skips_the_tuner(fake_clock):
    q, k, v, _ = kernels.spec("attention").make_inputs(SHAPE, torch.float32)
    o, lse = kernels.attention.v3_causal_lse.launch(q, k, v, True, 0.5, dict(
        BLOCK_M=32, BLOCK_N=32, BLOCK_D=32, num_warps=4, num_stages=1))
    grads = v5.backward(q, k, v, o, lse, torch.randn_like(o), True, 0.5, overrides={"BLOCK_N": 16})
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    assert not fake_clock
    assert {kernel: cfg["BLOCK_N"] for kernel, cfg in v5.chosen_config(SHAPE, torch.float32).items()} \
        == {"dkdv": 16, "dq": 16}
    with pytest.raises(ValueError, match="NOT_A_SETTING"):
        v5.backward(q, k, v, o, lse, torch.randn_like(o), True, 0.5, overrides={"NOT_A_SETTING": 1})


@pytest.mark.parametrize("backend,arch,d,shape", [
    ("hip", "gfx942", 64, (1, 4, 2, 75, 90, 64, 1)), ("hip", "gfx950", 64, (1, 4, 2, 75, 90, 64, 1)),
    ("cuda", "sm90", 128, (1, 2, 1, 75, 150, 128, 1))], ids=["gfx942-D64", "gfx950-D64", "sm90-D128"])
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_the_priors_tiles_give_right_gradients(monkeypatch, backend, arch, d, shape, dtype):
    """The tiles the D = 64 priors launch on AMD (dK/dV 32 x 32, dQ 64 x 32 or 128 x 32), and the
    D = 128 ones on sm90 (dK/dV 16 x 128, a query step narrower than the key block), meet the
    harness rule on the interpreter (which ignores warps and AMD knobs), causal, GQA, on a
    shape that is no multiple of them."""
    tiles = {kernel: (cfg["BLOCK_M"], cfg["BLOCK_N"]) for kernel, cfg in v5.prior(backend, arch, d).items()}
    monkeypatch.setattr(space_bwd, "space", lambda backend, a, d, kernel, dtype=None: [
        space_bwd._cfg(kernel, *tiles[kernel], d, 4, 1)])
    monkeypatch.setattr(v5, "_CHOSEN", {})
    report = check_rung(kernels.get("attention", "v5"), shape, dtype)
    assert report.passed, report.message
    assert {kernel: (c["BLOCK_M"], c["BLOCK_N"]) for kernel, c in v5.chosen_config(shape, dtype).items()} == tiles


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_a_key_block_narrower_than_the_query_block_gives_right_gradients(monkeypatch, dtype):
    """A 16-key block under 32-row query steps: no target's space holds one (every candidate's
    BLOCK_N is a multiple of its BLOCK_M), but ``overrides`` pins one (``{"BLOCK_N": 16}`` on
    the interpreter's 32 x 32, :func:`test_a_pinned_setting_skips_the_tuner`). dK/dV's key
    block 16..31 must start its causal query steps at row 0, the query block holding its
    diagonal, not at row 16: from row 16, that masked step and the unmasked one from row 32
    would both add rows 32..47. Causal, GQA, lengths no multiple of either tile; the
    harness's rule on fresh inputs, outputs poisoned."""
    monkeypatch.setattr(space_bwd, "space", lambda backend, a, d, kernel, dtype=None: [
        space_bwd._cfg(kernel, 32, 16, head_block(d), 4, 1)])
    monkeypatch.setattr(v5, "_CHOSEN", {})
    shape = (1, 4, 2, 45, 45, 32, 1)
    report = check_rung(kernels.get("attention", "v5"), shape, dtype)
    assert report.passed, report.message
    assert {kernel: (c["BLOCK_M"], c["BLOCK_N"]) for kernel, c in v5.chosen_config(shape, dtype).items()} \
        == {"dkdv": (32, 16), "dq": (32, 16)}


def test_on_the_interpreter_nothing_is_timed(monkeypatch):
    monkeypatch.setattr(tuning, "time_ms", lambda fn: pytest.fail("timed on the interpreter"))
    shape = (1, 2, 2, 9, 33, 40, 0)
    assert check_rung(kernels.get("attention", "v5"), shape, torch.float32).passed
    only = {c.kwargs["KERNEL"]: dict(tuning.as_dict(c), BLOCK_D=head_block(40))
            for c in space_bwd.interpreter_configs() if c.kwargs["BLOCK_D"] == 64}
    assert v5.chosen_config(shape, torch.float32) == only


@pytest.mark.gpu
def test_on_a_gpu_the_tuner_times_the_pruned_sets_and_shows_the_winners(monkeypatch, real_tuner_clock):
    """Not run here (no GPU): the first call of a bucket times each pruned config of each kernel once."""
    here = kernels.backend.current()
    shape = (1, 32, 8, 2048, 2048, 128, 1)
    q, k, v, _ = kernels.spec("attention").make_inputs(shape, torch.bfloat16, here.device)
    kernels.get("attention", "v5")(q.requires_grad_(), k, v, True).sum().backward()
    pruned = {kernel: v5._pruned(here.name, here.arch, 2048, 2048, 128, kernel) for kernel in space_bwd.KERNELS}
    assert len(real_tuner_clock) == sum(map(len, pruned.values())) > 2
    assert all(cfg in pruned[kernel] for kernel, cfg in v5.chosen_config(shape, torch.bfloat16).items())


def test_v5_asks_the_ranker_about_each_backward_kernel_and_times_its_shortlist(fake_clock, shortlisting_ranker):
    """dK/dV's and dQ's tuners hand a ranker the pass's shape and the kernel's name; only the
    shortlist is timed, its fastest kept."""
    asked = shortlisting_ranker([(32, 16), (16, 32)])
    assert check_rung(kernels.get("attention", "v5"), SHAPE, torch.float32).passed
    v5_asked = [p for p in asked if p.rung == "v5"]
    assert [(p.op, p.kernel, p.shape, p.dtype) for p in v5_asked] == [
        ("attention", "dkdv", SHAPE, torch.float32), ("attention", "dq", SHAPE, torch.float32)]
    assert len(fake_clock) == 4 and set(fake_clock) == {(16, 32), (32, 16)}
    chosen = v5.chosen_config(SHAPE, torch.float32)
    assert {kernel: (cfg["BLOCK_M"], cfg["BLOCK_N"]) for kernel, cfg in chosen.items()} == {
        "dkdv": (16, 32), "dq": (16, 32)}
