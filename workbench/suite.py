"""Benchmark suites: every rung of every op, checked then timed, into one results file.

``quick`` is sized to finish in a few minutes on one GPU (a lent device gives a session
about 8 minutes): each op's ``quick_shapes``, bf16 and fp16, every rung that runs there,
with ``ref`` timed in the same run. Correctness is checked on the GPU first, at the smoke
shapes, and a rung that fails is not timed.
"""
from __future__ import annotations

from pathlib import Path

import kernels

from . import results
from .bench import bench
from .check import check
from .timing import require_gpu

SUITES = ("quick",)


def run_suite(name: str = "quick", out: str | Path | None = None, progress: bool = True):
    """Check and benchmark every op; returns (check reports, result rows), saving rows to ``out``."""
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; suites: {', '.join(SUITES)}")
    require_gpu()
    reports, rows = [], []
    for op in kernels.ops():
        spec = kernels.spec(op)
        op_reports = check(op, progress=progress)
        reports += op_reports
        failed = {r.rung for r in op_reports if not r.passed}
        healthy = [r.label for r in kernels.variants(op, include_ref=False)
                   if r.title not in failed and r.runs_here()]
        names = spec.quick_shapes or tuple(spec.bench_shapes)[:2]
        shapes = [spec.bench_shapes[n] for n in names]
        rows += bench(op, shapes=shapes, rungs=healthy, progress=progress)
    if out is not None:
        results.save(rows, out)
    return reports, rows
