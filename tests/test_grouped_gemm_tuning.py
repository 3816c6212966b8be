"""Grouped GEMM tuning: the ahead-of-time pruned space, the per-problem prune and v4's
tuner (the rung ``kernels.grouped_gemm`` runs, forward, dx and dw).

The shipped table (``kernels/moe/grouped_gemm/tuned_space.json``) is checked for coverage
and for its verdicts from the numbers it stores; a few entries are recompiled to show the
numbers are true. The tuner is tested on the CPU with a fake clock.
"""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels import tuning
from kernels.moe.grouped_gemm import configs, spec, v4_persistent as v4
from workbench.isa import tune_space
from workbench.check import check_rung

from table_sections import DEVICES, SECTIONS, assert_verdicts, config_key, dtype_of, target_of


def _table(target: str) -> dict:
    return tuning.shipped(configs.TABLE)[target]


def _by_config(target: str) -> dict[tuple, dict]:
    """Every entry of the target's table, kept or dropped, by its config."""
    return {config_key(e["config"]): e for e in _table(target)["kept"] + _table(target)["dropped"]}


@pytest.mark.parametrize("section", SECTIONS)
def test_shipped_table_covers_exactly_the_candidates(section):
    """A changed candidate list without ``python -m workbench.isa.tune_space --op grouped_gemm
    --write`` fails here."""
    wanted = [config_key(tuning.as_dict(c)) for c in configs.candidates(target_of(section))]
    assert sorted(_by_config(section)) == sorted(wanted) and len(set(wanted)) == len(wanted)


@pytest.mark.parametrize("section", SECTIONS)
def test_kept_configs_fit_in_all_three_kernels_and_dropped_ones_do_not(section):
    for entry in _by_config(section).values():
        assert set(tune_space.compiles(entry)) == set(configs.KERNELS), entry
    assert_verdicts(section, _table(section))


@pytest.mark.parametrize("target", ("gfx942", "gfx950"))
def test_the_256_square_tile_is_dropped_for_spilling(target):
    """configs.py's note: the tile is in the space to be pruned, and the table prunes it."""
    dropped = [e for e in _table(target)["dropped"]
               if (e["config"]["BLOCK_M"], e["config"]["BLOCK_N"]) == (256, 256)]
    assert dropped and all("forward: spills" in e["why"] for e in dropped)
    with pytest.raises(ValueError, match="no tuned config space"):
        configs.space("rocm")


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
@pytest.mark.parametrize("backend,arch", DEVICES)
def test_space_is_the_kept_part_of_the_table(backend, arch, dtype):
    """float32 tunes among its own section's kept configs (kernels.tuning.section)."""
    space = [tuning.as_dict(c) for c in configs.space(backend, arch, dtype)]
    section = tuning.target(configs.TABLE, backend, arch, dtype)
    assert section.endswith(tuning.WIDE) == (dtype == torch.float32)
    assert space == [e["config"] for e in _table(section)["kept"]]


SAMPLE = [   # (target, the kernel compiled); the prior of the ISA's launch, a compile each
    ("gfx942", "forward"),
    ("gfx950", "dw"),
    ("sm90", "dx"),
    ("gfx942:fp32", "forward"),
]


@pytest.mark.parametrize("section,kernel", SAMPLE)
def test_table_entries_are_what_the_compiler_gives(section, kernel):
    cfg = _table(section)["kept"][0]["config"]
    entry = _by_config(section)[config_key(cfg)]
    assert tune_space.measure("grouped_gemm", target_of(section), {**cfg, "kernel": kernel},
                              dtype_of(section)) == entry[kernel]


@pytest.mark.parametrize("backend,arch", DEVICES)
def test_timed_set_per_problem_is_small_and_never_empty(backend, arch):
    space = configs.space(backend, arch)
    for t, k, n, g, _ in [*spec.BENCH_SHAPES.values(), *spec.SMOKE_SHAPES]:
        for kernel in ("forward", "dw"):
            timed = configs.prune(space, *v4._tile_extent(kernel, t, k, n, g))
            assert 1 <= len(timed) <= configs.TILE_SIZES * configs.PER_TILE, (t, k, n, g, len(timed))
    big = configs.prune(space, 1024, 7168)
    assert len({tuning.tile(c) for c in big}) > 1      # tile sizes compete
    assert all(c.kwargs["BLOCK_M"] <= 64 for c in configs.prune(space, 40, 7168))   # few rows per group


# -- v4's tuner, with a fake clock ---------------------------------------------------

FAKE_SPACE = [configs._cfg(32, 32, 32, 4, 1), configs._cfg(16, 32, 16, 4, 1), configs._cfg(32, 16, 32, 4, 1)]
FAKE_MS = {(32, 32): 3.0, (16, 32): 1.0, (32, 16): 2.0}   # (BLOCK_M, BLOCK_N) -> "milliseconds"
SHAPE = (40, 24, 36, 2, 0)       # 20 rows per group: every fake tile fits forward, dx and dw


@pytest.fixture
def fake_clock(monkeypatch, fake_tuner_clock):
    """Three candidates on the interpreter; timing runs the real launch and reads a fake time."""
    monkeypatch.setattr(configs, "space", lambda backend, arch="gfx942", dtype=None: FAKE_SPACE)
    monkeypatch.setattr(v4, "_CHOSEN", {})
    return fake_tuner_clock(v4, "_launch", FAKE_MS)


def _tile(cfg: dict) -> tuple:
    return cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]


def test_v4_tuner_picks_the_fastest_and_caches_per_key(fake_clock):
    rung = kernels.get("grouped_gemm", 4)
    report = check_rung(rung, SHAPE, torch.float32)
    assert report.passed, report.message
    assert len(fake_clock) == 9 and set(fake_clock) == set(FAKE_MS)   # forward, dx, dw: 3 each
    for kernel in ("forward", "dx", "dw"):
        assert _tile(v4.chosen_config(SHAPE, torch.float32, kernel)) == (16, 32, 16), kernel
    assert v4.chosen_config(SHAPE, torch.float32, "dx")["layout"] == "NT"     # wᵀ: its own key
    assert {"NUM_XCDS", "NUM_PROGS"} <= set(v4.chosen_config(SHAPE, torch.float32))
    assert "NUM_PROGS" not in v4.chosen_config(SHAPE, torch.float32, "dw")
    assert check_rung(rung, (48, 20, 40, 2, 1), torch.float32).passed   # same buckets: no timing
    assert len(fake_clock) == 9
    assert check_rung(rung, SHAPE, torch.float32, layout="col").passed  # new layouts: timed
    assert len(fake_clock) == 18


def test_kernels_grouped_gemm_runs_the_tuned_config(fake_clock):
    x, w, offsets = spec.make_inputs(SHAPE, torch.float16)
    x.requires_grad_()
    w.requires_grad_()
    out = kernels.grouped_gemm(x, w, offsets)
    torch.testing.assert_close(out.double(), spec.reference(x, w, offsets), rtol=1e-2, atol=1e-2)
    out.sum().backward()
    for kernel in ("forward", "dx", "dw"):
        assert _tile(v4.chosen_config(SHAPE, torch.float16, kernel)) == (16, 32, 16), kernel


def test_a_pinned_tile_skips_the_tuner(fake_clock):
    x, w, offsets = spec.make_inputs(SHAPE, torch.float32)
    x.requires_grad_()
    v4.grouped_gemm_v4(x, w, offsets, overrides={"BLOCK_M": 16, "BLOCK_K": 16}).sum().backward()
    assert not fake_clock
    assert all(v4.chosen_config(SHAPE, torch.float32, kernel)["BLOCK_M"] == 16
               for kernel in ("forward", "dx"))
    assert x.grad.shape == x.shape
    with pytest.raises(ValueError, match="NOT_A_SETTING"):
        v4.grouped_gemm_v4(x, w, offsets, overrides={"NOT_A_SETTING": 1})


def test_persistent_settings_keep_the_tuner_and_any_program_count_is_right(fake_clock):
    """NUM_PROGS and NUM_XCDS are not tile settings: the tuner still chooses the tile. Five
    programs over three XCDs run the remap unevenly on the CPU, and the result stays right."""
    x, w, offsets = spec.make_inputs(SHAPE, torch.float32)
    out = v4.grouped_gemm_v4(x, w, offsets, overrides={"NUM_PROGS": 5, "NUM_XCDS": 3})
    torch.testing.assert_close(out.double(), spec.reference(x, w, offsets), rtol=1e-5, atol=1e-5)
    chosen = v4.chosen_config(SHAPE, torch.float32)
    assert (chosen["NUM_PROGS"], chosen["NUM_XCDS"]) == (5, 3) and fake_clock


def test_on_the_interpreter_nothing_is_timed(monkeypatch):
    monkeypatch.setattr(tuning, "time_ms", lambda fn: pytest.fail("timed on the interpreter"))
    shape = (33, 17, 9, 3, 1)
    x, w, offsets = spec.make_inputs(shape, torch.float32)
    kernels.get("grouped_gemm", 4)(x.requires_grad_(), w.requires_grad_(), offsets).sum().backward()
    only = tuning.as_dict(configs.interpreter_configs()[0])
    for kernel in ("forward", "dx", "dw"):
        chosen = v4.chosen_config(shape, torch.float32, kernel)
        assert {k: chosen[k] for k in only} == only, kernel
    forward = v4.chosen_config(shape, torch.float32)
    assert forward["layout"] == "NN" and forward["NUM_PROGS"] == 4 and forward["NUM_XCDS"] == 1


@pytest.mark.gpu
def test_on_a_gpu_the_tuner_times_the_pruned_set_and_shows_the_winner(monkeypatch):
    """Not run here (no GPU): the first call of a key times each pruned config once."""
    here = kernels.backend.current()
    shape = spec.BENCH_SHAPES["dsv3 down (32 experts)"]
    timed, real = [], tuning.time_ms
    monkeypatch.setattr(tuning, "time_ms", lambda fn: timed.append(real(fn)) or timed[-1])
    kernels.grouped_gemm(*spec.make_inputs(shape, torch.bfloat16, here.device))
    pruned = [tuning.as_dict(c) for c in configs.prune(configs.space(here.name, here.arch),
                                                      *v4._tile_extent("forward", *shape[:4]))]
    chosen = v4.chosen_config(shape, torch.bfloat16)
    assert len(timed) == len(pruned) > 1 and {k: chosen[k] for k in pruned[0]} in pruned


def test_v4_asks_the_ranker_about_each_launch_and_times_its_shortlist(fake_clock, shortlisting_ranker):
    """The tuner hands a ranker (the performance model in training) each launch as a
    :class:`kernels.tuning.Problem`: the forward and dW at the forward's (T, K, N, G), the dX
    launch at its own (K and N swapped), balanced routing (the tuner sees T and G only)."""
    asked = shortlisting_ranker([(16, 32), (32, 16)])
    x, w, offsets = spec.make_inputs(SHAPE, torch.float32)
    v4.grouped_gemm_v4(x.requires_grad_(), w.requires_grad_(), offsets).sum().backward()
    t, k, n, g, _ = SHAPE
    assert {(p.op, p.rung, p.kernel, p.shape, p.dtype) for p in asked} == {
        ("grouped_gemm", "v4", "forward", (t, k, n, g, 0), torch.float32),
        ("grouped_gemm", "v4", "dx", (t, n, k, g, 0), torch.float32),
        ("grouped_gemm", "v4", "dw", (t, k, n, g, 0), torch.float32)}
    assert len(fake_clock) == 6 and set(fake_clock) == {(16, 32), (32, 16)}   # 2 of 3 per launch
    for kernel in ("forward", "dx", "dw"):
        assert _tile(v4.chosen_config(SHAPE, torch.float32, kernel)) == (16, 32, 16), kernel
