"""Training comparison: one preset trained by two kernel sets, or in high precision and under
each FP8 recipe; losses overlaid, times side by side.

Every run starts from the same seed, so all see the same weights and batches. Comparing
kernel sets A and B (``compare="sets"``), the loss curves should lie on top of each other:
the gap (max |Δloss|) is the parity check. Comparing FP8 recipes (``compare="fp8"``), set A's
kernels train in high precision and under each recipe (:func:`kernels.fp8.convert`); the
distance between the curves is what the recipe's quantization costs, and a table gives each
recipe's last loss against high precision with the issue's 1 % goal
(:mod:`workbench.train.fp8_parity`); on a GPU, MFU counts the FP8 GEMMs at the FP8 peak. The
layers kept in high precision are a control too (convert's default, or, say, without
``*shared_experts`` to quantize the MoE layers' shared experts as DeepSeek-V3 does).
On a GPU the step times, tokens/s, MFU and the profiler's per-op times are measured and
shown side by side. On the CPU interpreter only the losses and the names of the ops that
ran are shown, never a time: interpreted kernels say nothing about a GPU. GPU results
recorded earlier (``workbench/recorded/train/``) are shown with their GPU and date.
A run that cannot go (a GPU out of memory, a kernel that refuses a shape, a recipe whose
kernels are not installed) is reported in the result, and the others still run.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import altair as alt
import ipywidgets as w

import kernels

from .. import train
from ..harness.table import html_table
from ..train import fp8_layers, fp8_parity, ops
from . import training_rows as tr
from .panel import Panel
from ..views.render import notes_html

SETS = ("A", "B")
COMPARE = {"kernel sets A vs B": "sets", "high precision vs FP8 recipes (set A's kernels)": "fp8"}
BREAKDOWN = "per-op time (ms): median over steps 2..N of each op's self time"


@dataclass
class TrainingResult:
    """``rows`` and ``errors`` by run label ("A: torch", or "high precision" and "fp8 rowwise");
    ``source``: "measured" or "interpreter"; ``fp8``: each recipe's loss against high precision
    (:func:`workbench.train.fp8_parity.parity_table`; empty when comparing kernel sets)."""

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
    fp8: list[dict] = field(default_factory=list)

    def parts(self) -> list:
        parts = [html_table(self.fp8, caption=f"{self.preset}: loss of each FP8 recipe against high precision")
                 ] if self.fp8 else []
        parts.append(html_table(self.table, tr.summary_columns(self.source), caption=f"{self.preset}: runs"))
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
    return {op: w.Dropdown(options=ops.IMPLS, description=op, layout=w.Layout(width="190px"))
            for op in ops.OPS}


class TrainingComparison(Panel):
    """``TrainingComparison().set(preset="cpu-smoke", a="torch", b={"gemm": "workbench"}, steps=5).run()``,
    or ``.set(compare="fp8", recipes=("tensorwise", "rowwise"))`` for high precision against each
    recipe (``fp8_keep=(...)``: the layers every recipe leaves in high precision)."""

    def __init__(self, preset: str | None = None, a="torch", b=None, steps: int | None = None,
                 seed: int = 0, profile: bool = True, compare: str = "sets", recipes=None, fp8_keep=None):
        on_gpu = kernels.backend.current().is_gpu
        self.preset = w.Dropdown(options=list(train.PRESETS), description="preset",
                                 value="gpu-moe-small" if on_gpu else "cpu-smoke")
        self.compare = w.ToggleButtons(options=list(COMPARE.items()), description="compare")
        self.sets = {name: _impl_pickers() for name in SETS}
        self.recipes = w.SelectMultiple(options=kernels.fp8.names(), value=("tensorwise", "delayed", "rowwise"),
                                        description="FP8 recipes")
        self.fp8_keep = w.Text(value=fp8_layers.text(kernels.fp8.KEEP_HIGH_PRECISION),
                               description="kept in high precision", style={"description_width": "initial"},
                               layout=w.Layout(width="420px"))
        self.steps = w.BoundedIntText(value=20 if on_gpu else 5, min=1, max=100_000, description="steps")
        self.seed = w.IntText(value=0, description="seed")
        self.profile = w.Checkbox(value=True, description="profile ops")
        self.progress = w.IntProgress(description="runs done", min=0, max=len(SETS))
        rows = [w.HBox([w.HTML(f"<b>set {name}</b>&nbsp;"), *pickers.values()],
                       layout=w.Layout(flex_flow="row wrap"))   # six pickers wrap in a narrow notebook
                for name, pickers in self.sets.items()]
        super().__init__("Training step: kernel sets A vs B, or high precision vs FP8 recipes",
                         [self.preset, self.compare, *rows, self.recipes, self.fp8_keep, self.steps, self.seed,
                          self.profile],
                         [self.progress])
        self.set(preset=preset, a=a, b=b or workbench_set(), steps=steps, seed=seed, profile=profile,
                 compare=compare, recipes=recipes, fp8_keep=fp8_keep)
        self.compare.observe(lambda _: self._enable_mode_controls(), names="value")
        self._enable_mode_controls()

    def _enable_mode_controls(self) -> None:
        """Set B's pickers serve only A vs B, the recipes and kept layers only the FP8 comparison."""
        fp8 = self.compare.value == "fp8"
        for picker in self.sets["B"].values():
            picker.disabled = fp8
        self.recipes.disabled = self.fp8_keep.disabled = not fp8

    def set(self, preset=None, a=None, b=None, steps=None, seed=None, profile=None, compare=None,
            recipes=None, fp8_keep=None) -> "TrainingComparison":
        """Write the controls; ``a`` and ``b`` are "torch", "workbench" or a mapping per op;
        ``compare`` is "sets" (A against B) or "fp8" (set A in high precision against set A
        under each of ``recipes``, names from :func:`kernels.fp8.names`, each keeping the layers
        ``fp8_keep`` names in high precision: names or patterns as convert takes them, ``()``
        for none)."""
        if preset is not None:
            self.preset.value = train.preset(preset).name
        if compare is not None:
            if compare not in COMPARE.values():
                raise ValueError(f"compare must be one of {tuple(COMPARE.values())}, got {compare!r}")
            self.compare.value = compare
        if recipes is not None:
            self.recipes.value = tuple(kernels.fp8.get(r).name for r in recipes)
        if fp8_keep is not None:
            self.fp8_keep.value = fp8_layers.text(fp8_layers.checked(fp8_keep))
        for name, choice in zip(SETS, (a, b)):
            if choice is not None:
                for op, impl in ops.resolve(choice).items():
                    self.sets[name][op].value = impl
        for control, value in ((self.steps, steps), (self.seed, seed), (self.profile, profile)):
            if value is not None:
                control.value = value
        return self

    def kernel_sets(self) -> dict[str, dict[str, str]]:
        """The chosen sets by label (:func:`workbench.train.ops.label`: "A: torch",
        "B: gemm=workbench, attention=torch, ...")."""
        chosen = {name: {op: p.value for op, p in pickers.items()} for name, pickers in self.sets.items()}
        return {f"{name}: {ops.wrappable(ops.label(impls))}": impls for name, impls in chosen.items()}

    def plan(self) -> tuple[dict[str, tuple[dict[str, str], str | None]], dict[str, str]]:
        """The runs to train, label -> (kernels per op, FP8 recipe or None), and the runs that
        cannot go here (label -> why): the two sets, or set A plain and under each recipe."""
        chosen = self.kernel_sets()
        if self.compare.value == "sets":
            return {label: (impls, None) for label, impls in chosen.items()}, {}
        impls = next(iter(chosen.values()))
        ok, skipped = fp8_parity.runnable(self.recipes.value)
        return {fp8_parity.label(r): (impls, r) for r in (None, *ok)}, skipped

    def compute(self) -> TrainingResult:
        preset, runs = self.preset.value, {}
        plan, errors = self.plan()
        self.progress.value, self.progress.max = 0, len(plan)
        for label, (impls, recipe) in plan.items():
            try:
                runs[label] = train.run(preset, impls, steps=self.steps.value, seed=self.seed.value,
                                        profile=self.profile.value, fp8=recipe, progress=False,
                                        fp8_keep=None if recipe is None else self._fp8_keep())
            except Exception as error:   # a run that cannot go is a result to show, not a crash
                errors[label] = f"{type(error).__name__}: {error}"
            self.progress.value += 1
        measured = bool(runs) and all(tr.is_gpu(rows) for rows in runs.values())
        recorded = tr.recorded_rows()
        fp8 = self.compare.value == "fp8"
        notes = [f"{'' if fp8 else 'set '}{label} did not run: {why}" for label, why in errors.items()]
        notes += self._where(runs, measured, fp8) + self._recorded_notes(recorded)
        parity = tr.loss_parity(*runs.values()) if len(runs) == 2 and not fp8 else None
        charts = {"loss": loss_chart(runs, (
            "Training loss per step: high precision and FP8 recipes (same seed, same batches)" if fp8 else
            "Training loss per step, kernel sets A and B (same seed, same batches)"))} if runs else {}
        if measured and self.profile.value:
            charts["breakdown"] = breakdown_chart(tr.breakdown(runs), f"{BREAKDOWN}, measured here")
        recorded_ops = tr.breakdown(tr.recorded_runs(recorded))
        if recorded_ops:
            charts["recorded_breakdown"] = breakdown_chart(recorded_ops, f"{BREAKDOWN}, recorded")
        ops_table = ((tr.breakdown(runs) if measured else tr.ops_that_ran(runs))
                     if self.profile.value else [])
        fp8_table = fp8_parity.parity_table(runs) if fp8 and fp8_parity.HIGH in runs else []
        return TrainingResult(preset, "measured" if measured else "interpreter", runs, errors, parity,
                              [tr.summary(label, rows) for label, rows in runs.items()], ops_table,
                              tr.recorded_summary(recorded), charts, notes, fp8_table)

    def _fp8_keep(self) -> tuple[str, ...] | None:
        """The control's list, None where it is convert's default (which names layers some
        models lack, the shared experts, without a warning)."""
        keep = fp8_layers.parse(self.fp8_keep.value)
        return None if keep == tuple(kernels.fp8.KEEP_HIGH_PRECISION) else keep

    @staticmethod
    def _where(runs: dict, measured: bool, fp8: bool = False) -> list[str]:
        if not runs:
            return []
        first = next(iter(runs.values()))[0]
        if measured:
            return [f"Measured here on {first['gpu']}, {first['timestamp'][:10]} ({first['dtype']}): "
                    "step times are medians over steps 2..N (step 1 also pays for autotuning "
                    "and compilation)." + (" MFU counts each FP8 layer's three GEMMs at the FP8 peak."
                                           if fp8 else "")]
        return [f"Ran on the {first['backend']} backend ({first['dtype']}, CPU): the losses are "
                "real; step times of interpreted kernels are not performance and are not shown."]

    @staticmethod
    def _recorded_notes(recorded: dict) -> list[str]:
        runs = tr.recorded_runs(recorded)
        if not runs:
            return ["No GPU training results are recorded yet (workbench/recorded/train/ has "
                    "none): there are no GPU step times to show."]
        return [f"Recorded GPU runs, not measured here: {'; '.join(runs)}."]


def loss_chart(runs: dict[str, list[dict]], title: str) -> alt.Chart:
    """Loss per step, one line per run; dashes keep a curve visible under its twin."""
    values = [dict(set=label, step=r["step"], loss=r["loss"]) for label, rows in runs.items() for r in rows]
    return alt.Chart(alt.Data(values=values), title=title).mark_line(point=True).encode(
        x=alt.X("step:Q", title="step", axis=alt.Axis(tickMinStep=1)),
        y=alt.Y("loss:Q", title="loss", scale=alt.Scale(zero=False)),
        color=alt.Color("set:N", title="run"),
        strokeDash=alt.StrokeDash("set:N", title="run"),
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
