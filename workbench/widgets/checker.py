"""Correctness checker: one rung, one shape, one dtype, with a map of where it is wrong.

A pass/fail verdict says little when a kernel fails; the worst index and a heat map of
the error show *which* tiles are wrong (an edge tile, one K step, unwritten rows), which
usually names the bug.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import ipywidgets as w

import kernels

from ..harness.check import CheckReport, check_rung
from .controls import (ShapePicker, check_shape, choose_rung, dtype_label, dtype_options,
                       dtype_picker, op_picker, rung_options, to_dtype)
from ..views.heatmap import error_heatmap
from .panel import Panel
from ..harness.table import html_table
from ..views.render import notes_html, scroll_x

COLUMNS = ["rung", "shape", "dtype", "layout", "passed", "error", "allowed", "baseline_error",
           "mismatches", "numel", "worst_index", "worst_value", "worst_expected"]


@dataclass
class CheckResult:
    report: CheckReport
    table: list[dict]
    charts: dict
    notes: list[str] = field(default_factory=list)

    def parts(self) -> list:
        return [scroll_x(html_table(self.table, COLUMNS, caption=self.report.message)),
                notes_html(self.notes), *self.charts.values()]


class CorrectnessChecker(Panel):
    """``CorrectnessChecker(op="gemm").set(rung="v2", shape=(37, 29, 53)).run().report``"""

    def __init__(self, op: str = "gemm", rung="v2", shape: tuple | None = None,
                 dtype: str | None = None, layout: str = "row"):
        self.op = op_picker(op)
        self.rung = w.Dropdown(options=rung_options(op), description="rung")
        self.shape = ShapePicker(op, shape)
        self.dtype = dtype_picker(op)
        self.layout = w.Dropdown(options=["row", "col"], value=layout, description="layout")
        self.op.observe(self._op_changed, "value")
        super().__init__("Correctness checker",
                         [self.op, self.rung, self.shape.box, self.dtype, self.layout])
        self.set(rung=rung, dtype=dtype)

    def _op_changed(self, change) -> None:
        self.rung.options = rung_options(change["new"])
        self.shape.load(change["new"])
        self.dtype.options = dtype_options(change["new"])

    def set(self, op=None, rung=None, shape=None, dtype=None, layout=None) -> "CorrectnessChecker":
        """Write the controls; ``rung`` may also be a hand-made ``kernels.registry.Rung``."""
        if op is not None:
            self.op.value = op
        if rung is not None:
            choose_rung(self.rung, self.op.value, rung)
        if shape is not None:
            self.shape.set(shape)
        if dtype is not None:
            self.dtype.value = dtype_label(to_dtype(dtype))
        if layout is not None:
            self.layout.value = layout
        return self

    def compute(self) -> CheckResult:
        rung, dtype = self.rung.value, to_dtype(self.dtype.value)
        if dtype not in rung.dtypes:
            raise ValueError(f"{rung.title} does not support {self.dtype.value}; it takes "
                             f"{', '.join(dtype_label(d) for d in rung.dtypes)}")
        if not rung.runs_here():
            raise ValueError(f"{rung.title} does not run on the {kernels.backend.current().name} "
                             "backend")
        shape, note = check_shape(self.shape.value)
        report = check_rung(rung, shape, dtype, layout=self.layout.value)
        return CheckResult(report, [report.row()], {"error_map": error_heatmap(report)},
                           [note] if note else [])
