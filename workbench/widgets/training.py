"""Training comparison: one preset trained by two kernel sets, losses overlaid, times side by side.

Both sets start from the same seed, so they see the same weights and batches and their
loss curves should lie on top of each other: the gap (max |Δloss|) is the parity check.
On a GPU the step times, tokens/s, MFU and the profiler's per-op times are measured and
shown side by side. On the CPU interpreter only the losses and the names of the ops that
ran are shown, never a time: interpreted kernels say nothing about a GPU. GPU results
recorded earlier (``workbench/recorded/train/``) are shown with their GPU and date.
A set that cannot run (a GPU out of memory, a kernel that refuses a shape) is reported
in the result, and the other set still runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import altair as alt
import ipywidgets as w

import kernels

from .. import train
from ..harness.table import html_table
from ..train import ops
from . import training_rows as tr
from .panel import Panel
from ..views.render import notes_html

SETS = ("A", "B")
BREAKDOWN = "per-op time (ms): median over steps 2..N of each op's self time"


@dataclass
class TrainingResult:
    """``rows`` and ``errors`` by set label ("A: torch"); ``source``: "measured" or "interpreter"."""

    preset: str
    source: str
    rows: dict[str, list[dict]]
    errors: dict[str, str]
    parity: float | None
    table: list[dict]
    ops: list[dict]
    recorded: list[dict]
    charts: dict
    notes: list[str] = field(default_factory=list)

    def parts(self) -> list:
        parts = [html_table(self.table, tr.summary_columns(self.source), caption=f"{self.preset}: kernel sets A and B")]
        if self.parity is not None:
            parts.append(f"<p><b>loss parity</b>: max |Δloss| over {self.steps} steps = "
                         f"{self.parity:.3g}</p>")
        parts += [notes_html(self.notes), *self.charts.values()]
        if self.ops:
            parts.append(html_table(self.ops, caption=(
                f"{BREAKDOWN}, measured here" if self.source == "measured" else
                "ops each set ran, busiest first (CPU interpreter: names only, its times are "
                "not performance)")))
        if self.recorded:
            parts.append(html_table(self.recorded, tr.RECORDED, caption=(
                "recorded GPU training runs (shipped with the workbench, not measured here)")))
        return parts

    @property
    def steps(self) -> int:
        return min((len(rows) for rows in self.rows.values()), default=0)


def workbench_set() -> dict[str, str]:
    """Every op on the workbench kernels: the default set B."""
    return ops.resolve("workbench")


def _impl_pickers() -> dict[str, w.Dropdown]:
    return {op: w.Dropdown(options=ops.IMPLS, description=op, layout=w.Layout(width="220px"))
            for op in ops.OPS}


class TrainingComparison(Panel):
    """``TrainingComparison().set(preset="cpu-smoke", a="torch", b={"gemm": "workbench"}, steps=5).run()``"""

    def __init__(self, preset: str | None = None, a="torch", b=None, steps: int | None = None,
                 seed: int = 0, profile: bool = True):
        on_gpu = kernels.backend.current().is_gpu
        self.preset = w.Dropdown(options=list(train.PRESETS), description="preset",
                                 value="gpu-moe-small" if on_gpu else "cpu-smoke")
        self.sets = {name: _impl_pickers() for name in SETS}
        self.steps = w.BoundedIntText(value=20 if on_gpu else 5, min=1, max=100_000, description="steps")
        self.seed = w.IntText(value=0, description="seed")
        self.profile = w.Checkbox(value=True, description="profile ops")
        self.progress = w.IntProgress(description="sets run", min=0, max=len(SETS))
        rows = [w.HBox([w.HTML(f"<b>set {name}</b>&nbsp;"), *pickers.values()])
                for name, pickers in self.sets.items()]
        super().__init__("Training step: kernel set A vs B",
                         [self.preset, *rows, self.steps, self.seed, self.profile], [self.progress])
        self.set(preset=preset, a=a, b=b or workbench_set(), steps=steps, seed=seed, profile=profile)

    def set(self, preset=None, a=None, b=None, steps=None, seed=None, profile=None) -> "TrainingComparison":
        """Write the controls; ``a`` and ``b`` are "torch", "workbench" or a mapping per op."""
        if preset is not None:
            self.preset.value = train.preset(preset).name
        for name, choice in zip(SETS, (a, b)):
            if choice is not None:
                for op, impl in ops.resolve(choice).items():
                    self.sets[name][op].value = impl
        for control, value in ((self.steps, steps), (self.seed, seed), (self.profile, profile)):
            if value is not None:
                control.value = value
        return self

    def kernel_sets(self) -> dict[str, dict[str, str]]:
        """The chosen sets by label ("A: torch", "B: gemm=workbench, attention=torch, moe=torch")."""
        chosen = {name: {op: p.value for op, p in pickers.items()} for name, pickers in self.sets.items()}
        return {f"{name}: {ops.wrappable(ops.label(impls))}": impls for name, impls in chosen.items()}

    def compute(self) -> TrainingResult:
        preset, runs, errors = self.preset.value, {}, {}
        self.progress.value = 0
        for label, impls in self.kernel_sets().items():
            try:
                runs[label] = train.run(preset, impls, steps=self.steps.value, seed=self.seed.value,
                                        profile=self.profile.value, progress=False)
            except Exception as error:   # a set that cannot run is a result to show, not a crash
                errors[label] = f"{type(error).__name__}: {error}"
            self.progress.value += 1
        measured = bool(runs) and all(tr.is_gpu(rows) for rows in runs.values())
        recorded = tr.recorded_rows()
        notes = [f"set {label} did not run: {why}" for label, why in errors.items()]
        notes += self._where(runs, measured) + self._recorded_notes(recorded)
        parity = tr.loss_parity(*runs.values()) if len(runs) == 2 else None
        charts = {"loss": loss_chart(runs)} if runs else {}
        if measured and self.profile.value:
            charts["breakdown"] = breakdown_chart(tr.breakdown(runs), f"{BREAKDOWN}, measured here")
        recorded_ops = tr.breakdown(tr.recorded_runs(recorded))
        if recorded_ops:
            charts["recorded_breakdown"] = breakdown_chart(recorded_ops, f"{BREAKDOWN}, recorded")
        ops_table = ((tr.breakdown(runs) if measured else tr.ops_that_ran(runs))
                     if self.profile.value else [])
        return TrainingResult(preset, "measured" if measured else "interpreter", runs, errors, parity,
                              [tr.summary(label, rows) for label, rows in runs.items()], ops_table,
                              tr.recorded_summary(recorded), charts, notes)

    @staticmethod
    def _where(runs: dict, measured: bool) -> list[str]:
        if not runs:
            return []
        first = next(iter(runs.values()))[0]
        if measured:
            return [f"Measured here on {first['gpu']}, {first['timestamp'][:10]} ({first['dtype']}): "
                    "step times are medians over steps 2..N (step 1 also pays for autotuning "
                    "and compilation)."]
        return [f"Ran on the {first['backend']} backend ({first['dtype']}, CPU): the losses are "
                "real; step times of interpreted kernels are not performance and are not shown."]

    @staticmethod
    def _recorded_notes(recorded: dict) -> list[str]:
        runs = tr.recorded_runs(recorded)
        if not runs:
            return ["No GPU training results are recorded yet (workbench/recorded/train/ has "
                    "none): there are no GPU step times to show."]
        return [f"Recorded GPU runs, not measured here: {'; '.join(runs)}."]


def loss_chart(runs: dict[str, list[dict]]) -> alt.Chart:
    """Loss per step, one line per kernel set; dashes keep a curve visible under its twin."""
    values = [dict(set=label, step=r["step"], loss=r["loss"]) for label, rows in runs.items() for r in rows]
    return alt.Chart(alt.Data(values=values), title="Training loss per step, kernel sets A and B "
                     "(same seed, same batches)").mark_line(point=True).encode(
        x=alt.X("step:Q", title="step", axis=alt.Axis(tickMinStep=1)),
        y=alt.Y("loss:Q", title="loss", scale=alt.Scale(zero=False)),
        color=alt.Color("set:N", title="kernel set"),
        strokeDash=alt.StrokeDash("set:N", title="kernel set"),
        tooltip=["set:N", "step:Q", alt.Tooltip("loss:Q", format=".6f")],
    ).properties(width=420, height=220)


def breakdown_chart(table: list[dict], title: str) -> alt.Chart:
    """Per-op ms of each run in its own panel, side by side, ops in the table's order."""
    order = [row["op"] for row in table]
    values = [dict(op=row["op"], run=label, ms=ms) for row in table
              for label, ms in row.items() if label != "op" and ms is not None]
    return alt.Chart(alt.Data(values=values), title=title).mark_bar().encode(
        x=alt.X("ms:Q", title="ms per step"),
        y=alt.Y("op:N", sort=order, title=None),
        column=alt.Column("run:N", title=None),
        tooltip=["run:N", "op:N", alt.Tooltip("ms:Q", format=".3f")],
    ).properties(width=260)
