"""Notebook widgets: ladder profiler, ISA viewer, correctness checker, training comparison
(kernel sets A vs B, or high precision vs FP8 recipes), flash cards.

Each is a class with a Python API (``set``, ``run``, the returned result) that displays
as its widget; tests and headless notebooks drive the API, users click.

    >>> from workbench.widgets import LadderProfiler             # doctest: +SKIP
    >>> LadderProfiler(op="gemm").set(rungs=["v2", "ref"]).run().table   # doctest: +SKIP
"""
from .checker import CheckResult, CorrectnessChecker
from .flashcards import FlashCards
from .isa_viewer import IsaResult, IsaViewer
from .profiler import LadderProfiler, LadderResult
from .training import TrainingComparison, TrainingResult

__all__ = ["CheckResult", "CorrectnessChecker", "FlashCards", "IsaResult", "IsaViewer", "LadderProfiler",
           "LadderResult", "TrainingComparison", "TrainingResult"]
