"""The notebook's views of the collectives (``workbench.views.comm``) tell the truth.

The ring tables come from running the ring code itself on threads; these tests hold the
traced messages to the ring's known shape (p-1 steps per pass, right neighbour, every
segment once per step), the traced results to the collective's meaning, and the derived
segment states to the buffers the ring really wrote.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("ipywidgets", reason="the notebook extra is not installed (e.g. on a bare GPU image)")
pytest.importorskip("altair", reason="the notebook extra is not installed (e.g. on a bare GPU image)")

from kernels.comm import collectives, ring
from kernels.comm.cost_model import Fit
from workbench.views import comm as views
from workbench.views.render import static_renderer

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("world, chunks, numel", [(2, 1, None), (3, 2, 7), (4, 1, None), (5, 3, 4)])
def test_traced_all_reduce_sums_every_rank(world, chunks, numel):
    trace = views.trace_ring("all_reduce", world, chunks=chunks, numel=numel)
    full = float(2 ** world - 1)
    assert all(torch.equal(out, torch.full_like(out, full)) for out in trace.outputs)
    assert trace.steps == 2 * (world - 1)
    for m in trace.messages:
        assert m["dst"] == (m["src"] + 1) % world     # always to the right neighbour


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
def test_traced_single_pass_collectives(collective):
    world = 4
    trace = views.trace_ring(collective, world)
    assert trace.steps == world - 1
    if collective == "reduce_scatter":
        assert [out.tolist() for out in trace.outputs] == [[15.0]] * world
    else:
        expected = [float(2 ** r) for r in range(world) for _ in range(world)]
        assert all(out.tolist() == expected for out in trace.outputs)


def test_schedule_rows_each_rank_sends_and_receives_one_segment_per_step():
    world = 4
    rows = views.schedule_rows(views.trace_ring("all_reduce", world))
    assert len(rows) == 2 * (world - 1) * world
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(1, world):
            now = [r for r in rows if r["phase"] == phase and r["step"] == step]
            assert sorted(r["send"] for r in now) == [f"s{j}" for j in range(world)]
            assert sorted(r["receive"] for r in now) == [f"s{j}" for j in range(world)]
    # after reduce-scatter, rank r holds the full sum of segment r (the ring's docstring)
    last = [r for r in rows if r["phase"] == "reduce-scatter" and r["step"] == world - 1]
    assert {r["rank"]: r["holds_after"] for r in last} == {
        r: f"s{r} = r0+r1+r2+r3" for r in range(world)}
    grid = views.schedule_grid(views.trace_ring("all_reduce", world))
    assert len(grid) == 2 * (world - 1) and set(grid[0]) == {"pass", "step"} | {
        f"rank {r}" for r in range(world)}


def test_chunked_ring_sends_every_piece():
    rows = views.schedule_rows(views.trace_ring("all_reduce", 3, chunks=2, numel=12))
    assert {r["pieces"] for r in rows} == {2}


def test_segment_states_end_where_the_buffers_end():
    world = 3
    for collective in views.RING_COLLECTIVES:
        trace = views.trace_ring(collective, world)
        states = views.segment_states(trace)
        final = {(s["rank"], s["segment"]): s["holds"] for s in states if s["step"] == trace.steps}
        for rank, out in enumerate(trace.outputs):
            if collective == "reduce_scatter":   # the rank's own segment is its output
                written = {(rank, rank): out}
            else:
                written = {(rank, j): part for j, part in enumerate(out.chunk(world))}
            for key, part in written.items():
                assert final[key] == views._ranks(int(part[0])), (collective, key)
        assert max(s["ranks_in"] for s in states if s["step"] == 0) == 1


def test_trace_leaves_torch_distributed_in_place():
    before = (ring.dist, collectives.dist)
    with pytest.raises(ValueError, match="multiple of world"):
        views.trace_ring("reduce_scatter", 3, numel=4)
    views.trace_ring("all_gather", 2)
    assert (ring.dist, collectives.dist) == before
    assert ring.dist is torch.distributed


@pytest.mark.parametrize("kwargs, match", [(dict(collective="broadcast"), "collective"),
                                           (dict(world=1), "world"), (dict(chunks=0), "chunks")])
def test_trace_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        views.trace_ring(**kwargs)


def test_model_vs_measured_puts_the_fit_beside_each_rung_row():
    rows = [dict(collective="all_reduce", algorithm=a, world=2, bytes=n, seconds=s, backend="gloo/CPU")
            for a in ("library", "ring") for n, s in ((1000, 1e-4), (10 ** 6, 1e-3))]
    fit = Fit(alpha=1e-5, beta=1e-9, rel_rms=0.0)
    compared = views.model_vs_measured(rows, fit)
    assert [r["algorithm"] for r in compared] == ["ring", "ring"]   # library has no model
    # ring all_reduce on 2 ranks: 2 steps, volume = n
    assert compared[1]["model_ms"] == pytest.approx((2 * 1e-5 + 1e6 * 1e-9) * 1e3)
    assert "svg" in static_renderer(views.model_chart(compared, "t").to_dict())["image/svg+xml"]


def test_a_fit_with_time_falling_as_bytes_grow_is_named_and_not_drawn():
    rows = [dict(collective="all_reduce", algorithm="ring", world=3, bytes=n, seconds=s, backend="gloo/CPU")
            for n, s in ((4096, 3e-3), (1 << 22, 2e-3))]
    noise = Fit(alpha=2.3e-3, beta=-5.6e-11, rel_rms=0.5)
    assert not views.fit_is_physical(noise) and views.fit_is_physical(Fit(1e-5, 1e-9, 0.1))
    line = views.fit_summary(noise, "gloo/CPU")
    assert "not physical" in line and "GB/s" not in line
    assert views.fit_summary(Fit(1e-5, 1e-9, 0.1), "gloo/CPU").endswith("1/beta = 1 GB/s, relative rms error 0.1")
    compared = views.model_vs_measured(rows, noise)
    assert [r["model_ms"] for r in compared] == [None, None]
    chart = views.model_chart(compared, "t").to_dict()
    assert {r["source"] for r in chart["data"]["values"]} == {"measured"}
    assert "svg" in static_renderer(chart)["image/svg+xml"]


def _events(world=2, chunks=3):
    out = []
    for rank in range(world):
        for chunk in range(chunks):
            for i, phase in enumerate(views.PHASES):
                start = 0.01 * (chunk + i)
                out.append(dict(rank=rank, chunk=chunk, phase=phase, start_s=start, end_s=start + 0.008))
    return out


def test_timeline_chart_draws_synthetic_events():
    chart = views.timeline_chart(_events(), "overlap")
    values = chart.to_dict()["data"]["values"]
    assert len(values) == 18 and min(v["start_ms"] for v in values) == 0.0
    assert "svg" in static_renderer(chart.to_dict())["image/svg+xml"]


@pytest.mark.parametrize("bad, match", [(dict(phase="wait"), "phase"), (dict(end_s=-1.0), "before"),
                                        (dict(rank=None), None)])
def test_timeline_refuses_bad_events(bad, match):
    events = _events()
    events[1] = {k: v for k, v in {**events[1], **bad}.items() if v is not None}
    with pytest.raises(ValueError, match=match or "lacks"):
        views.timeline_chart(events, "t")
    with pytest.raises(ValueError, match="no events"):
        views.timeline_chart([], "t")


def test_volume_chart_renders():
    rows = [dict(payload=p, layout=l, MB=mb) for p in ("bf16", "fp8") for l, mb in (("naive", 8.0), ("dedup", 5.0))]
    assert "svg" in static_renderer(views.volume_chart(rows, "v").to_dict())["image/svg+xml"]
