"""FP8 training comparison: the high-precision run against each FP8 recipe, losses overlaid.

All runs start from one seed, so they see the same weights and batches; the distance
between the curves is what the recipe's quantization costs. The table gives each
recipe's last loss relative to high precision and the issue's goal (1 % for rowwise,
blockwise and mxfp8). On a GPU the step times and MFU (FP8 GEMMs at the FP8 peak) of
each run are shown; on the CPU interpreter only losses, never a time.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import ipywidgets as w

import kernels

from .. import train
from ..harness.table import html_table
from ..train import fp8_parity
from . import training_rows as tr
from .panel import Panel
from ..views.render import notes_html
from .training import loss_chart


@dataclass
class FP8Result:
    preset: str
    source: str
    rows: dict[str, list[dict]]
    parity: list[dict]
    table: list[dict]
    charts: dict
    notes: list[str] = field(default_factory=list)

    def parts(self) -> list:
        return [html_table(self.parity, caption=f"{self.preset}: loss of each FP8 recipe against high precision"),
                html_table(self.table, tr.summary_columns(self.source), caption="runs"),
                notes_html(self.notes), *self.charts.values()]


class FP8TrainingComparison(Panel):
    """``FP8TrainingComparison().set(preset="cpu-smoke", recipes=("rowwise",), steps=5).run()``"""

    def __init__(self, preset: str | None = None, recipes=None, steps: int | None = None, seed: int = 0):
        on_gpu = kernels.backend.current().is_gpu
        self.preset = w.Dropdown(options=list(train.PRESETS), description="preset",
                                 value="gpu-dense-1b" if on_gpu else "cpu-smoke")
        self.recipes = w.SelectMultiple(options=kernels.fp8.names(), description="recipes",
                                        value=("tensorwise", "delayed", "rowwise"))
        self.steps = w.BoundedIntText(value=20 if on_gpu else 5, min=1, max=100_000, description="steps")
        self.seed = w.IntText(value=0, description="seed")
        super().__init__("FP8 training: high precision vs each recipe",
                         [self.preset, self.recipes, self.steps, self.seed])
        self.set(preset=preset, recipes=recipes, steps=steps, seed=seed)

    def set(self, preset=None, recipes=None, steps=None, seed=None) -> "FP8TrainingComparison":
        if preset is not None:
            self.preset.value = train.preset(preset).name
        if recipes is not None:
            self.recipes.value = tuple(kernels.fp8.get(r).name for r in recipes)
        for control, value in ((self.steps, steps), (self.seed, seed)):
            if value is not None:
                control.value = value
        return self

    def compute(self) -> FP8Result:
        runs, skipped = fp8_parity.compare(self.preset.value, self.recipes.value, self.steps.value,
                                           self.seed.value)
        measured = all(tr.is_gpu(rows) for rows in runs.values())
        first = runs[fp8_parity.HIGH][0]
        notes = [f"{recipe} did not run: {why}" for recipe, why in skipped.items()]
        notes.append(f"Measured here on {first['gpu']}: MFU counts each FP8 layer's three GEMMs at "
                     "the FP8 peak." if measured else
                     f"Ran on the {first['backend']} backend ({first['dtype']}): the losses are real; "
                     "step times of interpreted kernels are not performance and are not shown.")
        chart = loss_chart(runs).properties(title="Training loss per step: high precision and FP8 recipes "
                                                   "(same seed, same batches)")
        return FP8Result(self.preset.value, "measured" if measured else "interpreter", runs,
                         fp8_parity.parity_table(runs), [tr.summary(label, rows) for label, rows in runs.items()],
                         {"loss": chart}, notes)
