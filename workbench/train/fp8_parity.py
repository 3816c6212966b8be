"""Loss parity of FP8 recipes against the high-precision run: one seed, the same batches.

The issue's goal on the CPU preset: the loss after the run within 1 % (relative) of the
high-precision run for rowwise, blockwise and mxfp8; tensorwise and delayed are reported
as they come. :func:`compare` trains the high-precision model and each recipe from one
seed; :func:`parity_table` says how far each ended from it. A recipe whose kernels are
not installed (:attr:`kernels.fp8.recipe.Recipe.needs`) is reported, not run.
"""
from __future__ import annotations

import kernels

from .loop import run

GOAL = 0.01
GOAL_RECIPES = ("rowwise", "blockwise", "mxfp8")
HIGH = "high precision"


def compare(preset="cpu-smoke", recipes=("tensorwise", "delayed", "rowwise"), steps: int = 10,
            seed: int = 0, kernels_choice="torch", **kw) -> tuple[dict[str, list[dict]], dict[str, str]]:
    """Rows of the high-precision run and of each recipe (by label), and why any did not run."""
    runs, skipped = {HIGH: run(preset, kernels_choice, steps, seed, progress=False, **kw)}, {}
    for recipe in recipes:
        needs = kernels.fp8.get(recipe).needs
        if needs:
            skipped[recipe] = f"needs {needs}"
            continue
        runs[f"fp8 {recipe}"] = run(preset, kernels_choice, steps, seed, fp8=recipe, progress=False, **kw)
    return runs, skipped


def parity_table(runs: dict[str, list[dict]]) -> list[dict]:
    """Per run: its last loss, the relative difference to the high-precision run's, the
    largest per-step difference, and whether the issue's 1 % goal applies and holds."""
    base = runs[HIGH]
    table = []
    for label, rows in runs.items():
        recipe = rows[0]["fp8"]
        rel = (rows[-1]["loss"] - base[-1]["loss"]) / base[-1]["loss"]
        goal = recipe in GOAL_RECIPES
        table.append(dict(run=label, steps=len(rows), last_loss=rows[-1]["loss"], rel_diff=rel,
                          max_abs_diff=max(abs(a["loss"] - b["loss"]) for a, b in zip(rows, base)),
                          goal="within 1 %" if goal else "reported",
                          meets_goal=(abs(rel) <= GOAL) if goal else None))
    return table
