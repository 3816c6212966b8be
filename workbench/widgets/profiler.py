"""Ladder profiler: the chosen rungs of one op at one shape, checked and placed on a roofline.

On a GPU it measures (``workbench.harness.bench``, ``ref`` in the same run) and checks. Without
one it checks in the interpreter at a small shape and shows only numbers that came from
a GPU: recorded rows (with GPU and date) or, failing those, the performance model's
predictions (``workbench.predict``), labelled "model". Interpreter times are never shown:
they say nothing about a GPU. Beside measured or recorded numbers, ``model_ms`` and
``bound`` give the model's time and binding resource, so a reader sees where they part.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import ipywidgets as w

import kernels
import roofline

from ..harness import results
from ..harness.bench import bench, shape_label
from ..harness.check import CheckReport, check_rung
from .controls import (ShapePicker, check_shape, dtype_label, dtype_options, dtype_picker,
                       op_picker, resolve_rung, rung_options, to_dtype)
from ..harness.ceilings import measure_ceilings
from .ladder_rows import (elsewhere, error_notes, gpu_matches, ladder_cells, ladder_chart_rows,
                          latest_run, model_point, model_summary, performance)
from .model_rows import model_columns, model_notes, model_numbers, model_points, predictions
from .panel import Panel
from ..harness.table import html_table
from ..views.render import notes_html

COLUMNS = ["rung", "name", "check", "checked_at", "ms", "model_ms", "tflops", "gbps", "pct_of_roof",
           "vs_prev", "vs_ref", "bound", "source", "gpu", "date"]
MODEL_COLUMNS = ["gpu", "dtype", "intensity", "ridge", "attainable_tflops", "bound", "source"]


@dataclass
class LadderResult:
    """``source``: "measured" (here, now), "recorded" (shipped GPU rows) or "model"."""

    op: str
    shape: tuple
    dtype: str
    gpu: str
    source: str
    table: list[dict]
    model: dict | None
    charts: dict
    notes: list[str] = field(default_factory=list)
    checks: list[CheckReport] = field(default_factory=list)

    def parts(self) -> list:
        caption = (f"{self.op} {shape_label(self.shape)} {self.dtype} on the {self.gpu} "
                   f"roofline; performance numbers: {self.source}")
        model = [html_table([self.model], MODEL_COLUMNS,
                            caption="roofline model at this shape (HBM roof; not a measurement)")
                 ] if self.model else []
        return [html_table(self.table, COLUMNS, caption=caption), *model,
                notes_html(self.notes), *self.charts.values()]


class LadderProfiler(Panel):
    """``LadderProfiler(op="gemm").set(rungs=["v2", "ref"], gpu="MI300X").run().table``"""

    def __init__(self, op: str = "gemm", rungs=None, shape: tuple | str | None = None,
                 dtype: str | None = None, gpu: str = "MI300X"):
        self.op = op_picker(op)
        self.rungs = w.SelectMultiple(options=rung_options(op), description="rungs", rows=7)
        self.shape = ShapePicker(op, shape)
        self.dtype = dtype_picker(op)
        self.gpu = w.Dropdown(options=roofline.gpus(), description="GPU spec")
        self.progress = w.IntProgress(description="progress", min=0, max=1)
        self.op.observe(self._op_changed, "value")
        super().__init__("Ladder profiler", [self.op, self.rungs, self.shape.box, self.dtype,
                                             self.gpu], [self.progress])
        self.rungs.value = [value for _, value in self.rungs.options]
        self.set(rungs=rungs, dtype=dtype, gpu=gpu)

    def _op_changed(self, change) -> None:
        self.rungs.options = rung_options(change["new"])
        self.rungs.value = [value for _, value in self.rungs.options]
        self.shape.load(change["new"])
        self.dtype.options = dtype_options(change["new"])

    def set(self, op=None, rungs=None, shape=None, dtype=None, gpu=None) -> "LadderProfiler":
        """Write the controls; ``shape`` is a tuple or a preset name, ``gpu`` any spec alias."""
        if op is not None:
            self.op.value = op
        if rungs is not None:
            self.rungs.value = [resolve_rung(self.op.value, r) for r in rungs]
        if shape is not None:
            self.shape.set(shape)
        if dtype is not None:
            self.dtype.value = dtype_label(to_dtype(dtype))
        if gpu is not None:
            self.gpu.value = roofline.spec(gpu).name
        return self

    def _chosen(self) -> list:
        """The selected rungs in ladder order, always with ``ref``: every ratio needs it."""
        return [r for _, r in self.rungs.options if r in self.rungs.value or r.rung is None]

    def compute(self) -> LadderResult:
        op, shape, dtype = self.op.value, self.shape.value, to_dtype(self.dtype.value)
        gpu, chosen, spec = roofline.spec(self.gpu.value), self._chosen(), kernels.spec(op)
        labels, label = [r.label for r in chosen], shape_label(shape)
        notes: list[str] = []
        try:
            model = model_summary(gpu, spec.flops(shape), spec.bytes_moved(shape, dtype), dtype)
        except ValueError as error:   # the GPU lacks this dtype
            model = None
            notes.append(str(error))
        on_gpu = kernels.backend.current().is_gpu
        self.progress.value, self.progress.max = 0, 2 * len(chosen) + on_gpu
        checks, cells = self._check(chosen, shape, dtype, notes)
        if on_gpu:
            run, source = self._measured(op, shape, dtype, chosen, notes), "measured"
            self.progress.value += 1
        else:
            run, source = self._recorded(op, label, dtype_label(dtype), gpu, notes)
        found, missing = predictions(op, labels, shape, roofline.dtype_name(dtype), gpu.name, self._step)
        perf = (performance(run, labels, gpu, model["intensity"], source) if run else
                ladder_cells(model_numbers(found, spec.bytes_moved(shape, dtype)), labels, gpu,
                             model["intensity"], source)) if model else {}
        notes += error_notes(run) + model_notes(found, missing)
        if run and found and not gpu_matches(gpu, run[0].gpu):
            notes.append(f"model_ms is the model's time on {gpu.name}; the measured rows come from "
                         f"{run[0].gpu}.")
        if run and not any(r.rung == "ref" and r.ok for r in run):
            notes.append("That run has no measured ref row: no speedups vs ref and no ladder chart.")
        beside = model_columns(found)
        table = [{"rung": r.label, "name": r.name, **cells[r.label], **dict.fromkeys(COLUMNS[4:]),
                  **perf.get(r.label, {}), **beside.get(r.label, {})} for r in chosen]
        ceilings = self._ceilings(gpu, on_gpu, notes)
        charts = self._charts(gpu, run, labels, model, op, shape, dtype, source, ceilings, found)
        return LadderResult(op, shape, dtype_label(dtype), gpu.name, source, table, model, charts,
                            notes, checks)

    def _step(self) -> None:
        self.progress.value += 1

    def _check(self, chosen, shape, dtype, notes):
        small, note = check_shape(shape)
        notes += [note] if note else []
        checks, cells = [], {}
        for rung in chosen:
            why = (f"no {dtype_label(dtype)}" if dtype not in rung.dtypes
                   else None if rung.runs_here() else "not on this backend")
            if why:
                cells[rung.label] = dict(check=f"not run ({why})", checked_at=None)
            else:
                report = check_rung(rung, small, dtype)
                checks.append(report)
                cells[rung.label] = dict(check="pass" if report.passed else "FAIL",
                                         checked_at=shape_label(small))
            self.progress.value += 1
        return checks, cells

    @staticmethod
    def _measured(op, shape, dtype, chosen, notes):
        numbered = [r.label for r in chosen if r.rung is not None]
        run = bench(op, [shape], [dtype], numbered or ["ref"], progress=False, passes=["forward"])
        notes.append(f"Performance numbers: measured here on {run[0].gpu}, "
                     f"{run[0].timestamp[:10]}, ref timed in the same run. Rungs without "
                     "numbers were not timed (no kernel for this dtype here, or too slow at "
                     "this shape).")
        return run

    @staticmethod
    def _recorded(op, label, dtype, gpu, notes):
        notes.append("No GPU here: kernels ran in the CPU interpreter for correctness only; "
                     "interpreter times say nothing about a GPU and are not shown.")
        shipped = results.load_recorded()
        run = latest_run(shipped, gpu, op, label, dtype)
        if run:
            notes.append(f"Performance numbers: recorded on {run[0].gpu} on "
                         f"{run[0].timestamp[:10]} (shipped with the workbench), "
                         "not measured here.")
            return run, "recorded"
        notes.append(f"No recorded GPU results for {op} {label} {dtype} on {gpu.name}; showing "
                     "the performance model's predictions where it has them (labelled model).")
        other = elsewhere(shipped, op)
        if other:
            notes.append("Recorded results exist for: " + "; ".join(other))
        return [], "model"

    @staticmethod
    def _ceilings(gpu, on_gpu: bool, notes: list[str]) -> dict | None:
        """Measured roofs to draw beside the datasheet ones: only when this machine is that GPU.

        Measured once per GPU and cached (``workbench.harness.ceilings``), the way rocprof-compute
        and Nsight Compute put empirical ceilings next to the peak ones.
        """
        here = kernels.backend.current()
        if not (on_gpu and gpu_matches(gpu, here.device_name)):
            return None
        ceilings = measure_ceilings()
        notes.append(f"Dashed roofs: measured on {ceilings['gpu']} on {ceilings['date'][:10]} "
                     "(a device copy and a large torch.matmul), beside the datasheet roofs.")
        return ceilings

    @staticmethod
    def _charts(gpu, run, labels, model, op, shape, dtype, source, ceilings=None, found=None) -> dict:
        """Points: the run's rows; without any, the predicted rungs (``found``) at their
        predicted height; without those, the attainable TFLOP/s on the roof."""
        if model is None:
            return {}
        spec, label = kernels.spec(op), shape_label(shape)
        flops, bytes_moved = spec.flops(shape), spec.bytes_moved(shape, dtype)
        points = ([roofline.point(gpu, r.rung, flops, bytes_moved, r.ms, dtype, source, op=op,
                                  shape=label, date=r.timestamp[:10])
                   for r in run if r.rung in labels and r.ok]
                  or model_points(found or {}, labels, flops, bytes_moved, op, label)
                  or [model_point(model, op, label)])
        charts = {"roofline": roofline.chart(gpu, points, dtypes=[dtype], ceilings=ceilings)}
        if any(r.rung == "ref" and r.ok for r in run):   # bars are drawn relative to ref
            charts["ladder"] = roofline.ladder_chart(ladder_chart_rows(run, labels, source))
        return charts
