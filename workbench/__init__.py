"""The harness every notebook uses: correctness, timing, results, CLI.

    >>> import workbench
    >>> reports = workbench.check("gemm")                   # doctest: +SKIP
    >>> workbench.all_passed(reports)                      # doctest: +SKIP
    True
"""
from . import results
from .check import CheckReport, all_passed, check, check_rung, compare, summarize
from .environment import describe as info
from .table import format_table
from .timing import PerformanceUnavailable, time_ms

__all__ = ["CheckReport", "PerformanceUnavailable", "all_passed", "check", "check_rung", "compare",
           "format_table", "info", "predict", "results", "summarize", "time_ms"]


def __getattr__(name):
    """``workbench.predict`` (:mod:`workbench.model`) loads on first use: it brings the
    ahead-of-time compiler, which a plain ``import workbench`` does not need."""
    if name == "predict":
        from .model import predict
        return predict
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")
