"""One rung of a ladder, everything a reader needs in one place: the notebooks' page.

:func:`view_rung` gathers the rung's idea (its docstring), the diff to the rung below
(or, for the first rung, its source without the docstring the page already shows once),
correctness in every dtype it claims at a
small shape, the AMD ISA summary, where its performance numbers come from
(measured here, recorded on a named GPU, or none yet), and the performance model's
predicted speed-up over the rung below with the resource that binds each
(:mod:`.rung_model`: labelled model; "no model" where it does not cover the rung).
The result renders as HTML in a notebook and as text in a terminal, and tests read
its fields.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field

import torch

import kernels
from kernels.registry import Rung

from .. import isa
from ..harness import results
from ..model import rung as rung_model
from ..harness.check import CheckReport, check_rung
from .source import Code, rung_diff, rung_source
from ..harness.table import format_table, html_table


@dataclass(repr=False)
class RungView:
    rung: Rung
    doc: str
    code: Code                       # diff to the rung below, or the first rung's source (no docstring)
    checks: list[CheckReport]
    isa_summary: dict | None         # None for rungs that are not Triton kernels
    isa_note: str
    recorded: list[results.ResultRow] = field(default_factory=list)
    model: rung_model.ModelStep | None = None   # predicted beside the rung below

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(r.passed for r in self.checks)

    def _check_rows(self) -> list[dict]:
        return [dict(dtype=r.dtype, shape="x".join(map(str, r.shape)), layout=r.layout,
                     passed=r.passed, error=r.error, allowed=r.allowed) for r in self.checks]

    def _recorded_rows(self) -> list[dict]:
        return results.table(self.recorded, ("gpu", "date", "shape", "dtype", "pass", "ms", "tflops",
                                              "vs_ref"))

    def _performance_text(self) -> str:
        if self.recorded:
            found = "Recorded on a GPU (not measured here):\n" + format_table(self._recorded_rows())
        else:
            found = ("No GPU result for this rung yet: none measured here (no GPU) and none recorded. "
                     f"`workbench bench {self.rung.op}` on a GPU records them.")
        return found + (f"\n\n{self.model.text()}" if self.model else "")

    def __repr__(self) -> str:
        verdict = "all pass" if self.passed else "FAILED" if self.checks else "not run here"
        return f"<RungView {self.rung.op} {self.rung.title}: {len(self.checks)} checks, {verdict}>"

    def __str__(self) -> str:
        parts = [f"== {self.rung.op} {self.rung.title} ==", self.doc, str(self.code),
                 "Correctness:", format_table(self._check_rows()), "ISA: " + self.isa_note]
        if self.isa_summary:
            parts.append(format_table([dict(metric=k, value=v) for k, v in self.isa_summary.items()]))
        parts.append(self._performance_text())
        return "\n\n".join(parts)

    def _repr_html_(self) -> str:
        isa_rows = [dict(metric=k, value=v) for k, v in (self.isa_summary or {}).items()]
        # Each heading is a paragraph of its own: inline after the ISA note (no table for a
        # SIMT rung) it would run into the next heading on one line.
        return "".join([
            f"<h3>{html.escape(self.rung.op)} {html.escape(self.rung.title)}</h3>",
            f"<pre>{html.escape(self.doc)}</pre>",
            "<p><b>Code</b></p>", self.code._repr_html_(),
            "<p><b>Correctness</b></p>", html_table(self._check_rows()),
            f"<p><b>ISA</b> <i>{html.escape(self.isa_note)}</i></p>",
            html_table(isa_rows) if isa_rows else "",
            f"<p><b>Performance</b></p><pre>{html.escape(self._performance_text())}</pre>",
        ])


def page_code(rung: Rung) -> Code:
    """The page's code: the diff to the rung below, or the first rung's source without the
    docstring the page shows already."""
    diff = rung_diff(rung)
    return Code(diff, diff=True) if diff else Code(rung_source(rung, docstring=False))


def _isa(rung: Rung, target: str, dtype: torch.dtype) -> tuple[dict | None, str]:
    why = isa.why_no_isa(rung)
    if why:
        return None, f"no ISA for {rung.title}: {why}"
    return isa.inspect(rung.op, rung.label, target, dtype).summary(), \
        f"{target}, {str(dtype).replace('torch.', '')}, compiled ahead of time (no GPU needed)"


def view_rung(op: str, which: int | str, shape: tuple, target: str = "gfx942",
              isa_dtype: torch.dtype = torch.bfloat16, gpu: str | None = None) -> RungView:
    """Gather one rung's page; ``gpu`` filters the recorded results (e.g. "MI300X") and is
    the GPU the model predicts for (default: the first known GPU of ``target``), in
    ``isa_dtype`` where the rung takes it."""
    rung = kernels.get(op, which)
    code = page_code(rung)
    checks = [check_rung(rung, shape, d, layout=lay) for d in rung.dtypes if rung.supports(d)
              for lay in ("row", "col")] if rung.runs_here() else []
    dtype = isa_dtype if isa_dtype in rung.dtypes else rung.dtypes[0]
    summary, note = _isa(rung, target, dtype)
    recorded = [r for r in results.load_recorded(gpu) if r.op == op and r.rung == rung.label]
    predicted = rung_model.step(op, rung.label, dtype, gpu or rung_model.gpu_for(target))
    return RungView(rung, rung.doc, code, checks, summary, note, recorded, predicted)
