"""The workbench command, driven in-process through its main()."""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels import registry
from kernels.registry import Rung
from workbench import cli
from workbench.cli import main


def test_info_lists_backend_and_rungs(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "backend: interpreter" in out and "v2" in out and "triton_tile" in out
    assert "recorded GPU results shipped" in out


def test_check_one_rung_passes(capsys):
    assert main(["check", "gemm", "--rung", "2", "--dtype", "fp32", "--shape", "5x7x3"]) == 0
    out = capsys.readouterr().out
    assert "v2 triton_tile" in out and "2 passed, 0 failed" in out   # row- and column-major


def test_check_exits_nonzero_on_a_failing_rung(monkeypatch, capsys):
    def wrong(a, b):
        return torch.matmul(a, b) + 1.0
    bad = Rung(op="gemm", rung=99, name="wrong", fn=wrong, backends=frozenset({"interpreter"}),
               dtypes=(torch.float32,), interpreter=True, kind="library", module=__name__)
    monkeypatch.setitem(registry._RUNGS, "gemm", [*kernels.variants("gemm"), bad])
    assert main(["check", "gemm", "--rung", "99", "--shape", "4x4x4"]) == 1
    assert "FAIL gemm v99 wrong" in capsys.readouterr().out


def test_tour_names_what_reproduces_a_failing_check(monkeypatch, capsys):
    """A tour that fails says which shape, layout, seed and tensor did, so it can be rerun."""
    import workbench.cli as cli
    from workbench.check import check_rung

    def wrong(a, b):
        return torch.matmul(a, b) + 1.0
    bad = Rung(op="gemm", rung=99, name="wrong", fn=wrong, backends=frozenset({"interpreter"}),
               dtypes=(torch.float32,), interpreter=True, kind="library", module=__name__)
    monkeypatch.setattr(cli, "_run_checks", lambda *a: [
        check_rung(bad, (4, 5, 3), torch.float32, seed=7, layout="col")])
    monkeypatch.setattr(cli, "_isa_rows", lambda target: [])
    assert main(["tour"]) == 1
    out = capsys.readouterr().out
    assert "FAIL gemm v99 wrong float32 shape=(4, 5, 3) layout=col" in out and "seed 7" in out
    assert "SOME CHECKS FAILED (0/1)" in out


def test_bench_on_the_interpreter_says_why_and_exits_2(capsys):
    if kernels.backend.current().is_gpu:
        pytest.skip("a GPU is present")
    assert main(["bench", "gemm", "--shape", "64x64x64"]) == 2
    assert "no GPU here" in capsys.readouterr().err


def test_bad_arguments_are_reported(capsys):
    assert main(["check", "gemm", "--rung", "v42"]) == 2
    assert "no rung 'v42'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["check", "gemm", "--shape", "4xfour"])
    assert main(["check", "gemm", "--shape", "4x4"]) == 2
    assert "gemm shapes are MxNxK (3 numbers), got 4x4" in capsys.readouterr().err
    assert main(["check", "--shape", "4x4x4"]) == 2
    assert "--shape needs an op" in capsys.readouterr().err


def test_a_shape_may_hold_zero_codes(capsys):
    """Attention's causal flag and grouped GEMM's routing are numbers in the shape; 0 is legal."""
    assert main(["check", "grouped_gemm", "--rung", "0", "--dtype", "fp32", "--shape", "9x8x5x3x0"]) == 0
    assert "2 passed, 0 failed" in capsys.readouterr().out   # row- and column-major


@pytest.mark.slow
def test_tour_checks_every_rung_and_passes(capsys, monkeypatch):
    """The whole tour, every stage, with its checks at each op's first smoke shape (both
    layouts, every dtype): every rung at every smoke shape and layout is the ladder tests' job
    (``test_smoke_shapes`` and friends, random seeds too), and the full tour in CI was a
    quarter of the suite's time, checking everything a second time."""
    full = cli._run_checks
    monkeypatch.setattr(cli, "_run_checks", lambda ops, rung, shapes, dtypes: [
        report for op in ops for report in full([op], rung, kernels.spec(op).smoke_shapes[:1], dtypes)])
    assert main(["tour"]) == 0
    out = capsys.readouterr().out
    for r in kernels.variants("gemm"):
        if r.runs_here():
            assert r.title in out
    assert "all checks passed" in out and "No timings shown" in out
    isa_table = out.split("Machine code on MI300X (gfx942)")[1].split("\n\n")[0]
    assert "v_mfma_f32_32x32x8_bf16" in isa_table and "v_mfma_f32_16x16x32_fp8_fp8" in isa_table


def test_bench_suite_on_the_interpreter_exits_2(capsys):
    if kernels.backend.current().is_gpu:
        pytest.skip("a GPU is present")
    assert main(["bench", "--suite", "quick"]) == 2
    assert main(["bench"]) == 2
    assert "name an op" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["train", "tune"])
def test_kernels_help_names_every_op_of_the_training_switch(command, capsys):
    """The help lists the ops without importing workbench.train (``workbench --help`` stays fast):
    the list it holds is the switch's."""
    from workbench.train.ops import OPS

    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert cli._TRAIN_OPS == ", ".join(OPS)
    assert f"per op ({cli._TRAIN_OPS}" in " ".join(capsys.readouterr().out.split())


class _Exited(Exception):
    """os._exit, as a test sees it: the status it was called with, the test process left alive."""


def test_a_torchrun_rank_that_left_its_group_ends_without_python_finalization(monkeypatch, capsys):
    """train and tune leave a torchrun group (``_leaving_the_group``); ``main`` then ends the
    process with ``os._exit`` and the command's status, its output flushed first, so gloo's
    threads never run into Python's finalization (``cli._exit_without_finalizing``). A process
    that joined no group returns from ``main`` as before (every other test here), and so does one
    that left a group it held itself, not torchrun's (no ``WORLD_SIZE`` > 1: a notebook's)."""
    left = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "destroy_process_group", lambda: left.append("left"))
    monkeypatch.setattr(cli, "_left_a_group", False)

    def exit_(code):
        raise _Exited(code)
    monkeypatch.setattr(cli.os, "_exit", exit_)
    assert main(["info"]) == 0 and not left             # nothing left yet: main returns
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert cli._leaving_the_group(lambda: "trained") == "trained" and left == ["left"]
    assert main(["info"]) == 0                          # not a torchrun rank: main returns
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli._leaving_the_group(lambda: "trained") == "trained" and left == ["left"] * 2
    capsys.readouterr()
    for argv, status in ((["info"], 0), (["check", "gemm", "--rung", "no-such-rung"], 2)):
        with pytest.raises(_Exited) as exited:
            main(argv)
        assert exited.value.args == (status,), argv
    assert "backend: interpreter" in capsys.readouterr().out
