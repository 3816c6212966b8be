"""The training step's part of the GPU report: a short run of each kernel set, side by side.

The issue's goal compares step times of the workbench kernels with eager PyTorch on
``gpu-moe-small``; a lent GPU session is minutes long, so this runs a few steps of each
(eager, same seed and data) and reports the median step time of the steps after the
first :data:`WARMUP`. The same comparison takes other runs too: the GPU report's FP8 part
(:mod:`workbench.gpu_report_fp8`) puts bf16 against FP8 recipes on ``gpu-dense-1b``. Each run's tuning pass, before its first step, already ran the
model's kernels once (Triton's JIT compiles, the tuners' timing); the first steps still
warm the optimizer's kernels and the allocator.
``torch.compile`` runs are left to ``workbench train --compile``: compiling alone would
take most of a session.
"""
from __future__ import annotations

import statistics

from . import store
from .loop import run

PRESET = "gpu-moe-small"
KERNEL_SETS = ("torch", "workbench")
STEPS = 8
WARMUP = 3


def median_step_ms(rows: list[dict]) -> float:
    """The median step time after the warm-up steps (all steps when there are no more)."""
    timed = rows[WARMUP:] or rows
    return statistics.median(r["step_ms"] for r in timed)


def compare(out, steps: int = STEPS, preset: str = PRESET, runs: dict[str, dict] | None = None) -> list[dict]:
    """Train ``steps`` steps of each run, saving every row to ``out`` (a .json of training
    rows) after each run; returns one summary dict per run: its median step ms, tokens/s,
    MFU, last loss, the tuning pass's seconds (apart from the steps), and against the first
    run the speedup and the last loss's relative difference.

    ``runs``: label -> keyword arguments of :func:`.loop.run` beyond preset, steps and seed
    (``kernels``, ``fp8``); default, each of :data:`KERNEL_SETS` by its name."""
    rows, summary = [], []
    for label, how in (runs or {k: dict(kernels=k) for k in KERNEL_SETS}).items():
        mine = run(preset=preset, steps=steps, seed=0, progress=False, **how)
        rows += mine
        store.save(rows, out)
        ms = median_step_ms(mine)
        last = mine[-1]
        summary.append(dict(run=label, step_ms=ms,
                            tokens_per_s=last["tokens_per_s"] * last["step_ms"] / ms,
                            mfu=None if last["mfu"] is None else last["mfu"] * last["step_ms"] / ms,
                            loss=last["loss"], tuning_s=last["tuning_s"]))
    for s in summary:
        s["speedup"] = summary[0]["step_ms"] / s["step_ms"]
        s["loss_rel_diff"] = (s["loss"] - summary[0]["loss"]) / summary[0]["loss"]
    return summary
