"""ISA viewer: what a rung compiles to on an AMD (or NVIDIA) target, alone or beside another.

Compiled ahead of time by :mod:`workbench.isa`, so it works on a laptop: the point is
to see MFMA instructions, LDS traffic, registers and occupancy change from one rung to
the next, which no timing on a CPU could show.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import ipywidgets as w
import torch

import kernels

from .. import isa
from .controls import choose_rung, dtype_label, dtype_options, op_picker, rung_options, to_dtype
from .panel import Panel
from ..harness.table import html_table

NONE = "(none)"


def _inspectable(rung) -> bool:
    """Rungs with an ahead-of-time description (Triton): SIMT and library rungs have none."""
    return rung.aot is not None


@dataclass
class IsaResult:
    """``table``: the summary row, or the metric-by-metric comparison of two reports."""

    reports: list
    table: list[dict]
    charts: dict = field(default_factory=dict)

    def parts(self) -> list:
        """Summary first; then the hot loops, side by side, each scrolling in its own box
        (so a wide sm90 loop never pushes the other off the page); the full listings folded."""
        if len(self.reports) > 1:
            summary = html_table(self.table, caption="ISA comparison")
        else:
            summary = html_table([dict(metric=k, value=v) for k, v in self.table[0].items()],
                                 caption="ISA summary")
        loops = "".join(f"<div style='flex:1;min-width:0'>{r.loop_html()}</div>"
                        for r in self.reports)
        return [summary, f"<div style='display:flex;gap:1em'>{loops}</div>",
                "".join(r.listing_html() for r in self.reports)]


class IsaViewer(Panel):
    """``IsaViewer(op="gemm").set(rung="v2", target="gfx942").run().table[0]``"""

    def __init__(self, op: str = "gemm", rung=None, target: str = "gfx942", dtype=None,
                 compare_rung=None):
        self.op = op_picker(op)
        self.rung = w.Dropdown(description="rung")
        # The default label box (80 px) cuts "compare with" to "compare …": size it to its text.
        self.compare_rung = w.Dropdown(description="compare with",
                                       style={"description_width": "initial"})
        self.target = w.Dropdown(options=list(isa.TARGETS), value=target, description="target")
        self.dtype = w.Dropdown(description="dtype")
        self.op.observe(lambda change: self._load(change["new"]), "value")
        super().__init__("ISA viewer", [self.op, self.rung, self.compare_rung, self.target,
                                        self.dtype])
        self._load(op)
        self.set(rung=rung, dtype=dtype, compare_rung=compare_rung)

    def _load(self, op: str) -> None:
        options = rung_options(op, _inspectable)
        self.rung.options = options
        self.compare_rung.options = [(NONE, None), *options]
        self.rung.index = self.compare_rung.index = 0
        self.dtype.options = dtype_options(op)
        default = torch.bfloat16 if torch.bfloat16 in kernels.spec(op).dtypes else None
        self.dtype.value = dtype_label(default) if default else self.dtype.options[0]

    def set(self, op=None, rung=None, target=None, dtype=None, compare_rung=None) -> "IsaViewer":
        """Write the controls; ``compare_rung=""`` clears the comparison."""
        if op is not None:
            self.op.value = op
        if rung is not None:
            choose_rung(self.rung, self.op.value, rung)
        if compare_rung == "":
            self.compare_rung.value = None
        elif compare_rung is not None:
            choose_rung(self.compare_rung, self.op.value, compare_rung)
        if target is not None:
            self.target.value = isa.normalize_target(target)
        if dtype is not None:
            self.dtype.value = dtype_label(to_dtype(dtype))
        return self

    def compute(self) -> IsaResult:
        op, target, dtype = self.op.value, self.target.value, to_dtype(self.dtype.value)
        rungs = [r for r in (self.rung.value, self.compare_rung.value) if r is not None]
        reports = [isa.inspect(op, r.label, target=target, dtype=dtype) for r in rungs]
        table = isa.compare(*reports) if len(reports) == 2 else [reports[0].summary()]
        return IsaResult(reports, table)
