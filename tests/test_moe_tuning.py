"""The fused MoE rung's tuning: its table prunes the grouped GEMM's kept configs again for
v3's two kernels (``kernels/moe/layer_ladder/tuned_space.json``), and its tuner times the
per-problem prune once per key (on the CPU with a fake clock)."""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels import tuning
from kernels.moe.grouped_gemm import configs as grouped
from kernels.moe.layer_ladder import configs
from workbench.isa import tune_space
from workbench.check import check_rung

from table_sections import SECTIONS, assert_verdicts, target_of


def _entries(target: str) -> list[dict]:
    table = tuning.shipped(configs.TABLE)[target]
    return table["kept"] + table["dropped"]


@pytest.mark.parametrize("section", SECTIONS)
def test_table_covers_exactly_what_the_grouped_gemm_keeps(section):
    """A changed grouped GEMM table without ``python -m workbench.isa.tune_space --op moe --write``
    fails here. Both sections compile the configs the grouped GEMM's bf16 verdicts keep."""
    target = target_of(section)
    wanted = [tuning.as_dict(c) for c in tuning.kept(grouped.TABLE, target, grouped.candidates(target))]
    assert sorted(map(str, (e["config"] for e in _entries(section)))) == sorted(map(str, wanted))


@pytest.mark.parametrize("section", SECTIONS)
def test_kept_configs_fit_both_kernels_and_dropped_ones_do_not(section):
    """configs' docstring: AMD entries count each kernel's 8/16-bit LDS ops, and none has any."""
    table = tuning.shipped(configs.TABLE)[section]
    assert_verdicts(section, table)
    if target_of(section) != "sm90":
        assert {r["narrow_lds_ops"] for e in table["kept"] + table["dropped"]
                for r in tune_space.compiles(e).values()} == {0}


@pytest.mark.parametrize("target", ("gfx942", "gfx950"))
def test_gate_up_spills_in_tiles_the_grouped_gemm_keeps(target):
    """v3's Limits: 256 x 128, 128 x 256 and, capped at 2 waves, 128 x 128 at 4 warps."""
    dropped = {(c["BLOCK_M"], c["BLOCK_N"], c["num_warps"], c["waves_per_eu"])
               for e in tuning.shipped(configs.TABLE)[target]["dropped"] for c in [e["config"]]}
    assert dropped == {(256, 128, 8, 2), (256, 128, 8, 0), (128, 256, 8, 2), (128, 256, 8, 0), (128, 128, 4, 2)}
    assert all(e["why"].startswith("gate_up: spills") for e in tuning.shipped(configs.TABLE)[target]["dropped"])


def test_table_entry_is_what_the_compiler_gives():
    cfg = tuning.shipped(configs.TABLE)["gfx942"]["kept"][0]
    assert tune_space.measure("moe", "gfx942", {**cfg["config"], "kernel": "gate_up"}) == cfg["gate_up"]


FAKE_SPACE = [grouped._cfg(32, 32, 32, 4, 1), grouped._cfg(16, 32, 16, 4, 1), grouped._cfg(32, 16, 32, 4, 1)]
# 40 rows per expert: every fake tile fits both kernels. top_k 2: at top_k 1 the renormalized weight
# is p/p = 1, so the router's gradient is exactly 0 and every rung's (and the float64 reference's)
# is rounding noise, which the harness's relative error would compare noise against noise
SHAPE = (40, 24, 36, 2, 2, 0)


def test_tuner_times_the_pruned_space_once_per_key_and_runs_the_fastest(monkeypatch):
    ms = iter([3.0, 1.0, 2.0] * 2)   # per kernel: the second candidate wins
    timed = []
    monkeypatch.setattr(configs, "space", lambda backend, arch="gfx942", dtype=None: FAKE_SPACE)
    monkeypatch.setattr(tuning, "time_ms", lambda fn: fn() or timed.append(1) or next(ms))
    with tuning.recording() as chosen:
        report = check_rung(kernels.get("moe", "v3"), SHAPE, torch.float32)
    assert report.passed, report.message
    assert len(timed) == 6
    assert [how for (op, _), how in chosen.items() if op == "moe/v3"] == [("timed", tuning.as_dict(FAKE_SPACE[1]))] * 2
    assert check_rung(kernels.get("moe", "v3"), (44, 24, 36, 2, 2, 1), torch.float32).passed
    assert len(timed) == 6   # same buckets: nothing timed again


def test_on_the_interpreter_there_is_one_config_so_nothing_is_timed():
    assert [tuning.as_dict(c) for c in configs.space("interpreter")] == \
        [tuning.as_dict(c) for c in grouped.interpreter_configs()]


def test_tuner_asks_the_ranker_about_each_kernel_and_times_its_shortlist(monkeypatch, shortlisting_ranker):
    """Each kernel's tuner hands a ranker the layer's (T, dim, hidden, E, top_k) with balanced
    routing and the kernel's name; only the shortlist is timed, its fastest kept."""
    ms = iter([2.0, 1.0] * 2)   # the shortlist's order per kernel: (32, 16), then (16, 32), which wins
    timed = []
    monkeypatch.setattr(configs, "space", lambda backend, arch="gfx942", dtype=None: FAKE_SPACE)
    monkeypatch.setattr(tuning, "time_ms", lambda fn: fn() or timed.append(1) or next(ms))
    asked = shortlisting_ranker([(32, 16), (16, 32)])
    with tuning.recording() as chosen, torch.no_grad():
        kernels.get("moe", "v3")(*kernels.spec("moe").make_inputs(SHAPE, torch.float32))
    assert [(p.op, p.rung, p.kernel, p.shape, p.dtype) for p in asked] == [
        ("moe", "v3", kernel, (*SHAPE[:5], 0), torch.float32) for kernel in ("gate_up", "down")]
    assert len(timed) == 4   # 2 of 3 per kernel
    assert [how for (op, _), how in chosen.items() if op == "moe/v3"] == [("timed", tuning.as_dict(FAKE_SPACE[1]))] * 2
