"""``workbench comm``: measured rows say gloo/CPU and carry the ratio to the library; the
8-GPU rows say model."""

import pytest

from workbench import cli
from workbench.comm.bench import bench_rows

pytestmark = pytest.mark.timeout(60)


@pytest.mark.timeout(120)
def test_cli_comm_labels_cpu_and_model(capsys):
    assert cli.main(["comm", "--world", "2", "--collective", "all_to_all", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "2 gloo ranks on this machine's CPU (not GPU performance)" in out
    measured = [line for line in out.splitlines() if line.startswith("all_to_all")]
    assert [line.split()[1] for line in measured] == ["library"] * 3 + ["pairwise"] * 3 + ["direct"] * 3
    assert all(line.split()[-1] == "gloo/CPU" for line in measured)
    modelled = [line for line in out.splitlines() if line.startswith("model ")]
    assert {line.split()[1] for line in modelled} == {"MI300X", "H200"}
    assert all(" all_to_all " in line for line in modelled)


def test_unknown_collective_is_refused_before_launching():
    with pytest.raises(ValueError, match="broadcast"):
        bench_rows(collectives=("broadcast",))


@pytest.mark.parametrize("gpus, backend", [(0, "gloo"), (1, "gloo"), (2, "nccl")])
def test_one_command_picks_its_backend_by_the_gpus_here(gpus, backend, monkeypatch):
    from workbench.comm import bench

    ran = []
    monkeypatch.setattr(bench.torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(bench, "report", lambda **kw: ran.append("gloo") or "gloo report")
    monkeypatch.setattr(bench, "run", lambda **kw: ran.append("nccl") or ([], []))
    assert cli.main(["comm"]) == 0
    assert ran == [backend]


def test_gloo_timings_are_not_recorded(capsys):
    assert cli.main(["comm", "--backend", "gloo", "--out", "comm.json"]) == 2
    assert "not GPU performance and are not recorded" in capsys.readouterr().err
