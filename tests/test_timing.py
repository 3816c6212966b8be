"""Timing refuses to invent numbers on the interpreter and measures on a GPU."""
from __future__ import annotations

import pytest
import torch

import kernels
from workbench import PerformanceUnavailable, time_ms
from workbench.bench import bench


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
