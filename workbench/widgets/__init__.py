"""Notebook widgets: ladder profiler, ISA viewer, correctness checker, training comparison
(kernel sets A vs B, or high precision vs FP8 recipes), flash cards.

ipywidgets only. May import every workbench package below it (harness .. learn); nothing in
workbench imports it but the tools (cli, gpu_report, grade). The exercise widgets live
beside the exercises (:mod:`workbench.learn.exercises.widgets`); what a widget draws as
static HTML or a chart comes from :mod:`workbench.views.render`.

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
