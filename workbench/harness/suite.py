"""Benchmark suites: every rung of every op, checked then timed, into one results file.

``quick`` is sized to finish in a few minutes on one GPU (a lent device gives a session
about 8 minutes): each op's ``quick_shapes``, bf16 and fp16 (or the op's own dtypes that
``ref`` takes here), every rung that runs there, with ``ref`` timed in the same run, in
every pass a rung has (forward; and backward and forward+backward for a rung with a
backward, e.g. attention's v5 and SDPA).
Correctness is checked on the GPU first, at the smoke shapes, rung by rung: a rung that
fails is not timed, and a rung whose check raises gets an error row for each of its
cases instead of ending the suite. Rows are saved to ``out`` as they are measured.
"""
from __future__ import annotations

from pathlib import Path

import kernels

from . import results
from .bench import Budget, bench, error_message
from .check import check
from .timing import require_gpu

SUITES = ("quick",)


def run_suite(name: str = "quick", out: str | Path | results.Recorder | None = None,
              progress: bool = True, budget: Budget | None = None):
    """Check and benchmark every op; returns (check reports, result rows), saving rows to ``out``
    (a path, or a :class:`~workbench.harness.results.Recorder` that later rows share).

    With a ``budget``, no op starts its checks and no case starts once it is spent; what
    was left out is listed in ``budget.skipped``.
    """
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; suites: {', '.join(SUITES)}")
    require_gpu()
    recorder = out if isinstance(out, results.Recorder) else results.Recorder(out)
    first = len(recorder.rows)
    reports = []
    for op in kernels.ops():
        if budget is not None and budget.spent():
            budget.skipped.append(f"{op}: checks and every case")
            continue
        spec = kernels.spec(op)
        op_reports, raised = [], {}
        for r in kernels.variants(op):
            if r.runs_here():
                try:
                    op_reports += check(op, rung=r.label, progress=progress)
                except Exception as exc:
                    raised[r.label] = f"correctness check raised {error_message(exc)}; not timed"
        reports += op_reports
        failed = {r.rung for r in op_reports if not r.passed}
        healthy = [r.label for r in kernels.variants(op, include_ref=False)
                   if r.title not in failed and r.runs_here()]
        names = spec.quick_shapes or tuple(spec.bench_shapes)[:2]
        shapes = [spec.bench_shapes[n] for n in names]
        bench(op, shapes=shapes, rungs=healthy, progress=progress, out=recorder, budget=budget,
              not_timed=raised)
    return reports, recorder.rows[first:]
