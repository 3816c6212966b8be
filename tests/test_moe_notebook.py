"""The host-side views the MoE notebook prints (``workbench.views.moe``) agree with the kernels.

The schedule is checked against the device's own :func:`~kernels.moe.grouped_gemm.schedule.locate`
(run per program under the interpreter), so the table the notebook prints is the mapping the
one-launch rungs use, not a second opinion. The launch counter is checked on rungs whose
launches are known, and it must leave ``torch.Tensor`` and Triton as it found them.
"""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import kernels
from kernels.moe.grouped_gemm import spec
from kernels.moe.grouped_gemm.schedule import group_tiles, locate
from workbench.views import moe as moe_views


@triton.jit
def _locate_kernel(offsets_ptr, out_ptr, G, T, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr):
    starts, ends, tiles, cum = group_tiles(offsets_ptr, G, T, BLOCK_M, BLOCK_G)
    group, start, end = locate(tl.program_id(0), starts, ends, tiles, cum, BLOCK_M, BLOCK_G)
    tl.store(out_ptr + 3 * tl.program_id(0), group)
    tl.store(out_ptr + 3 * tl.program_id(0) + 1, start)
    tl.store(out_ptr + 3 * tl.program_id(0) + 2, tl.minimum(start + BLOCK_M, end))


@pytest.mark.parametrize("sizes, block_m", [([28, 15, 0, 2, 51, 0], 16), ([0, 0, 7], 4), ([5], 8),
                                            ([33, 1, 0, 40, 9], 32)])
def test_schedule_is_the_device_mapping(sizes, block_m):
    offsets = spec.offsets_from_sizes(torch.tensor(sizes))
    plan = moe_views.schedule(offsets, block_m)
    located = torch.full((len(plan), 3), -1, dtype=torch.int32)
    _locate_kernel[(len(plan),)](offsets, located, len(sizes), sum(sizes), BLOCK_M=block_m,
                                 BLOCK_G=triton.next_power_of_2(len(sizes)))
    assert [(p["group"], p["rows"]) for p in plan] == [(g, f"{s}:{e}") for g, s, e in located.tolist()]
    assert [p["tile"] for p in plan] == list(range(len(plan)))


def test_schedule_covers_every_row_once_and_skips_empty_groups():
    sizes = [3, 0, 70, 0, 1]
    plan = moe_views.schedule(spec.offsets_from_sizes(torch.tensor(sizes)), 32)
    rows = [r for p in plan for r in range(*map(int, p["rows"].split(":")))]
    assert rows == list(range(sum(sizes))) and {p["group"] for p in plan} == {0, 2, 4}


def test_waves_counts_the_partial_last_wave():
    assert moe_views.waves(448, 304) == (2, pytest.approx(1 - 448 / 608))
    assert moe_views.waves(608, 304) == (2, 0.0)
    assert moe_views.waves(0, 304) == (0, 0.0)


def _counted(label, sizes):
    x, w, _ = spec.make_inputs((sum(sizes), 8, 12, len(sizes), 0), seed=0)
    offsets = spec.offsets_from_sizes(torch.tensor(sizes))
    fn = kernels.get("grouped_gemm", label)
    with moe_views.count_launches() as counts:
        fn(x, w, offsets) if label == "v0" else fn(x, w, offsets, check_offsets=False)
    return counts


def test_count_launches_sees_per_expert_and_single_launches():
    sizes = [5, 0, 9, 3]
    assert _counted("v1", sizes) == {"Triton launches": 3, "library GEMMs": 0, "host reads": 1}
    assert _counted("v0", sizes)["library GEMMs"] == 3
    for label in ("v2", "v4"):
        assert _counted(label, sizes) == {"Triton launches": 1, "library GEMMs": 0, "host reads": 0}


def test_count_launches_restores_what_it_wrapped():
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    before = {name: torch.Tensor.__dict__.get(name) for name in moe_views.HOST_READS}
    runs = (InterpretedFunction.run, JITFunction.run)
    with pytest.raises(RuntimeError):
        with moe_views.count_launches():
            raise RuntimeError("inside")
    assert {name: torch.Tensor.__dict__.get(name) for name in moe_views.HOST_READS} == before
    assert (InterpretedFunction.run, JITFunction.run) == runs
