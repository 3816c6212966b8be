"""The harness every notebook uses: correctness, timing, results, CLI.

    >>> import workbench
    >>> reports = workbench.check("gemm")                   # doctest: +SKIP
    >>> workbench.all_passed(reports)                      # doctest: +SKIP
    True

The packages, lowest first; each imports only packages above it in this table (and
``kernels``, ``roofline``, which import nothing of workbench). tests/test_layers.py reads
this table and fails on an import that runs up it, or on any import circle.

    LAYERS
    harness    check, tolerances, bench, timing, results, suites, ceilings, environment, tables
    isa        ahead-of-time compile, parse, occupancy, waits, LDS banks, tuning-space pruning, inspect()
    model      the performance model read from the compiled code (labelled "model")
    comm       collective benches (gloo ranks and GPUs), the 8-GPU model, EP overlap
    views      what notebooks show: rung pages, source and diffs, charts, MoE, comm and MFMA views
    train      the training-step benchmark
    learn      exercises, interview deck, flash cards
    widgets    ipywidgets; imported by notebooks and the tools only
    tools      cli, gpu_report (and its parts, gpu_report_fp8 and gpu_report_goals), grade (commands a user runs; nothing imports them but each other)

``views`` sits below ``learn``: an exercise shows its verdict and source with views' pages,
and no view needs an exercise. ``train`` sits below ``learn`` too: the training step never
reaches into the exercises (``learn`` may show a training run; ``train`` knows nothing of it).

Public faces that keep their old names: ``workbench.check`` (the function; ``from
workbench.check import X`` is :mod:`workbench.harness.check`), ``workbench.results``
(:mod:`workbench.harness.results`), ``workbench.exercises`` (:mod:`workbench.learn.exercises`,
loaded on first use), ``workbench.isa`` (the inspector, re-exported by the package).
"""
import sys

from .harness import check as _check_module, results
from .harness.check import CheckReport, all_passed, check, check_rung, compare, summarize
from .harness.environment import describe as info
from .harness.table import format_table
from .harness.timing import PerformanceUnavailable, time_ms

# ``import workbench.check`` / ``workbench.results`` name the harness modules themselves (one
# module object under two names); the attribute ``workbench.check`` stays the function.
sys.modules[__name__ + ".check"] = _check_module
sys.modules[__name__ + ".results"] = results

__all__ = ["CheckReport", "PerformanceUnavailable", "all_passed", "check", "check_rung", "compare",
           "format_table", "info", "predict", "results", "summarize", "time_ms"]


def __getattr__(name):
    """``workbench.predict`` (:mod:`workbench.model`) loads on first use: it brings the
    ahead-of-time compiler, which a plain ``import workbench`` does not need."""
    if name == "predict":
        from .model import predict
        return predict
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")
