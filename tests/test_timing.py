"""Timing refuses to invent numbers on the interpreter and measures on a GPU."""
from __future__ import annotations

import pytest
import torch

import kernels
from workbench import PerformanceUnavailable, time_ms
from workbench.harness.bench import bench


def test_interpreter_refuses_to_time():
    if kernels.backend.current().is_gpu:
        pytest.skip("a GPU is present")
    with pytest.raises(PerformanceUnavailable, match="no GPU here"):
        time_ms(lambda: None)
    with pytest.raises(PerformanceUnavailable):
        bench("gemm", shapes=[(64, 64, 64)])


@pytest.mark.gpu
def test_gpu_timing_and_bench_rows():
    rows = bench("gemm", shapes=[(512, 512, 512)], dtypes=[torch.float16], rungs=[2], progress=False)
    assert [r.rung for r in rows] == ["ref", "v2"]
    ref, v2 = rows
    assert ref.ratio_to_ref == 1.0 and v2.ms > 0
    assert v2.tflops == pytest.approx(2 * 512**3 / v2.ms / 1e9)
    assert v2.gpu == kernels.backend.current().device_name


def test_quick_suite_refuses_on_the_interpreter_and_checks_its_name():
    from workbench.harness.suite import run_suite
    with pytest.raises(ValueError, match="unknown suite 'full'"):
        run_suite("full")
    if kernels.backend.current().is_interpreter:
        with pytest.raises(PerformanceUnavailable):
            run_suite("quick")


def test_every_op_names_quick_shapes_it_has():
    for op in kernels.ops():
        spec = kernels.spec(op)
        assert set(spec.quick_shapes) <= set(spec.bench_shapes), op


@pytest.mark.gpu
def test_quick_suite_writes_one_results_file(tmp_path):
    from workbench import results
    from workbench.harness.suite import run_suite
    reports, rows = run_suite("quick", out=tmp_path / "quick.json", progress=False)
    assert all(r.passed for r in reports)
    assert results.load(tmp_path / "quick.json") == rows
    assert {r.op for r in rows} == set(kernels.ops()) and any(r.rung == "ref" for r in rows)


def test_timing_reads_throughput_off_the_work_given():
    from workbench.harness.timing import Timing
    t = Timing(median_ms=2.0, min_ms=1.9, max_ms=2.5, reps=10, flops=4e12, bytes_moved=8e9)
    assert t.tflops == pytest.approx(2000.0) and t.gbps == pytest.approx(4000.0)
    assert Timing(2.0, 1.9, 2.5, 10).tflops is None
