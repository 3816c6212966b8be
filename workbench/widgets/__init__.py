"""Notebook widgets: ladder profiler, ISA viewer, correctness checker, training comparison
(and its FP8 side), flash cards.

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
from .training_fp8 import FP8Result, FP8TrainingComparison

__all__ = ["CheckResult", "CorrectnessChecker", "FP8Result", "FP8TrainingComparison", "FlashCards", "IsaResult", "IsaViewer", "LadderProfiler",
           "LadderResult", "TrainingComparison", "TrainingResult"]
