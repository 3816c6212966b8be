"""``workbench comm --backend nccl``: on fewer than two GPUs it says so and records nothing; with two
(mocked here: gloo ranks stand in for NCCL) it records result rows in bus bandwidth."""
from __future__ import annotations

import pytest

from kernels.comm import measure as comm_measure
from workbench.comm import bench as bench_comm
from workbench import cli, results

# above the runs' own deadlines (which end a hang) by the fork server's start on a loaded machine
pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("gpus", [0, 1])
def test_fewer_than_two_gpus_records_nothing(gpus, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bench_comm.torch.cuda, "device_count", lambda: gpus)
    out = tmp_path / "comm.json"
    assert cli.main(["comm", "--backend", "nccl", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"needs at least 2 GPUs, this machine has {gpus}; nothing measured, nothing recorded" in said
    assert not out.exists()


def test_bus_bandwidth_is_the_ring_volume_over_the_time():
    n = 256 << 20
    assert bench_comm.bus_gbps("all_reduce", 8, n, 1.0) == pytest.approx(2 * 7 / 8 * n / 1e9)
    assert bench_comm.bus_gbps("all_gather", 8, n, 2.0) == pytest.approx(7 / 8 * n / 2e9)


def test_two_gpus_record_rows_with_the_library_as_ref(monkeypatch, tmp_path):
    calls = []

    def on_gloo(*args, **kwargs):   # the NCCL launch, replaced by gloo ranks on this CPU
        calls.append(kwargs["backend"])
        return comm_measure.measure(*args, **{**kwargs, "backend": "gloo"})

    monkeypatch.setattr(bench_comm.torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(bench_comm, "measure", on_gloo)
    out = tmp_path / "comm.json"
    sizes = (1 << 12, 1 << 14)
    rows, lines = bench_comm.run(out=out, sizes=sizes, collectives=("all_reduce",), repeats=1,
                                 ep_shape=None, timeout=60)
    assert calls == ["nccl"] and lines == bench_comm.verdict(rows, nbytes=sizes[-1])
    assert [(r.rung, r.shape) for r in rows] == [(rung, f"2x{n}") for rung in ("ref", "ring", "ring_chunked")
                                                 for n in sizes]
    assert all(r.ok and r.gbps > 0 for r in rows)
    assert [r.ratio_to_ref for r in rows if r.rung == "ref"] == [1.0, 1.0]
    assert results.load(out) == rows
    lines = bench_comm.verdict(rows, nbytes=sizes[-1])
    assert len(lines) == 2 and all("goal" in line for line in lines)
    with pytest.raises(ValueError, match="all_to_all"):
        bench_comm.run(collectives=("all_to_all",))


def test_run_local_refuses_an_unknown_backend():
    from kernels.comm.launch import run_local

    with pytest.raises(ValueError, match="backend"):
        run_local(print, 2, backend="mpi")


def test_two_gpus_time_the_ep_layer_unchunked_as_ref_and_pipelined(monkeypatch, tmp_path):
    from workbench.comm import ep_overlap

    calls = []

    def on_gloo(*args, **kwargs):   # the NCCL ranks, replaced by gloo ranks on this CPU
        calls.append(kwargs["backend"])
        return ep_overlap.measure(*args, **{**kwargs, "backend": "gloo", "repeats": 1})

    monkeypatch.setattr(bench_comm.torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(bench_comm, "measure", lambda *a, **k: [])
    monkeypatch.setattr(bench_comm, "measure_ep", on_gloo)
    shape = dict(tokens=12, dim=16, hidden=16, top_k=2, experts=4)
    rows, lines = bench_comm.run(out=tmp_path / "ep.json", ep_shape=shape, timeout=120)
    assert calls == ["nccl"]
    assert [(r.op, r.rung) for r in rows] == [("ep_moe", "ref"), ("ep_moe", f"chunks{bench_comm.EP_CHUNKS[-1]}")]
    assert rows[0].ratio_to_ref == 1.0 and rows[1].ratio_to_ref > 0 and rows[0].shape == "2x12x16x16x2"
    assert "communication" in lines[0] and "host clock" in lines[0]
    assert f"{bench_comm.EP_GOAL}x goal" in lines[1]
    assert results.load(tmp_path / "ep.json") == rows
