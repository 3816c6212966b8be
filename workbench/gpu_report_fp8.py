"""The FP8 part of ``workbench gpu-report``: the FP8 training issue's two goals on a GPU.

GEMM (:func:`gemm`): at :data:`SHAPE` (8192^3), the workbench's own bf16 top GEMM rung
(:func:`kernels.gemm.ops.best_rung`: v6) and each FP8 GEMM rung with the scales a recipe
gives it (:data:`CASES`: ``gemm_fp8`` v2, the rung ``kernels.matmul_fp8`` runs, per tensor,
per row/column and per 1 x 128 and 128 x 128 block; ``gemm_mxfp4`` v0 on MXFP8 operands), the GEMM
rungs at :data:`LAYOUT`, a Linear's forward (B K-contiguous: the layout FP8 matrix cores take,
which a row-major B's bytes would have to be transposed into through LDS), in one run, each timed by
:func:`workbench.harness.bench.bench` (``ref`` first, so every row also has its ratio to the
library) into the report's results file. A rung that cannot run here is skipped with the
reason: MXFP8 wherever the matrix cores do not take MX scales
(:data:`kernels.gemm_mxfp4.formats.NATIVE_ARCHS`; e.g. sm_90, where Triton would emulate
it on the bf16 ones). Each FP8 rung's speed-up is the bf16 rung's time over its own, held
against :data:`GEMM_GOAL`.

Training (:func:`train`): :data:`TRAIN_PRESET` on the workbench kernels in bf16 against
the same under ``--fp8`` :data:`TRAIN_RECIPES`, by :func:`workbench.train.quick.compare`
(same seed and batches; median step time after the warm-up steps, each run's tuning pass
reported apart from its steps): the step-time ratio against :data:`STEP_GOAL` and the last
loss's relative difference against the CPU goal's bound (:data:`workbench.train.fp8_parity.GOAL`).

A training run cannot stop midway, and a GEMM case only between cases (its compiles and the
top rung's tuning come first), so each part starts only if its reserve (:data:`GEMM_RESERVE_S`,
:data:`TRAIN_RESERVE_S`) is left of the report's budget; otherwise it is named among what
the budget left out. A goal not met is a verdict, not a failure of the report.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

import kernels
from kernels.gemm.ops import best_rung
from kernels.gemm_fp8 import fp8_dtype
from kernels.gemm_mxfp4.formats import MXFP8, NATIVE_ARCHS

from .gpu_report_goals import met
from .harness.bench import Budget, bench, shape_label
from .harness.results import Recorder, ResultRow
from .harness.table import format_table
from .train import fp8_parity
from .train import quick as train_quick

SHAPE = (8192, 8192, 8192)
GEMM_GOAL = 1.6          # FP8 GEMM rung over the bf16 top rung, at SHAPE
STEP_GOAL = 1.3          # FP8 training step over the bf16 workbench step
# The two reserves are estimates, not measurements (no GPU has run this section yet): replace
# them from the first report's log (its tuning_s and wall time).
GEMM_RESERVE_S = 60.0    # JIT compiles and the top rung's tuning at SHAPE, then ~10 timed cases
TRAIN_PRESET = "gpu-dense-1b"
TRAIN_RECIPES = ("blockwise", "rowwise")
TRAIN_STEPS = train_quick.STEPS
TRAIN_RESERVE_S = 180.0  # three runs of the 1B model: each builds, tunes (JIT) and takes its steps
BF16_RUN = "bf16 (workbench)"


@dataclass(frozen=True)
class Case:
    """One FP8 GEMM rung with the scales of a recipe: ``input_args`` go to the op's
    ``make_inputs``; ``dtype`` None is this GPU's e4m3 (:func:`kernels.gemm_fp8.fp8_dtype`)."""

    recipe: str
    op: str
    rung: str
    input_args: dict = field(default_factory=dict)
    dtype: torch.dtype | None = None


# tensorwise and rowwise on v2, the rung kernels.matmul_fp8 runs for them (its best_rung: scales
# constant along K compile to v1's epilogue there), so the verdict is on what training runs; at
# LAYOUT, the forward's (x @ w.t(): B K-contiguous, as FP8 matrix cores and torch._scaled_mm take
# it), the bf16 rung too
LAYOUT = "NT"
CASES = (
    Case("tensorwise", "gemm_fp8", "v2", {"granularity": "tensor", "layout": LAYOUT}),
    Case("rowwise", "gemm_fp8", "v2", {"granularity": "channel", "layout": LAYOUT}),
    Case("blockwise", "gemm_fp8", "v2", {"granularity": "block128x128", "layout": LAYOUT}),
    Case("mxfp8", "gemm_mxfp4", "v0", dtype=MXFP8),
)


def why_not(case: Case) -> str | None:
    """Why ``case`` cannot be timed on this GPU, or None when it can."""
    here = kernels.backend.current()
    if case.dtype == MXFP8 and here.arch not in NATIVE_ARCHS:
        return (f"no MX matrix cores on {here.arch} (native on {', '.join(NATIVE_ARCHS)}; "
                "Triton would emulate tl.dot_scaled on the bf16 ones)")
    if not kernels.get(case.op, case.rung).runs_here():
        return f"{case.op} {case.rung} does not run on {here.name} ({here.arch})"
    return None


def _measured(rows: list[ResultRow], rung: str) -> ResultRow | None:
    return next((r for r in rows if r.rung == rung), None)


def _verdict(row: ResultRow | None, base: ResultRow | None) -> tuple[float | None, str]:
    if row is None:
        return None, "not run: time budget spent"
    if not row.ok:
        return None, f"error: {row.error}"
    if base is None or not base.ok:
        return None, "no bf16 time to compare with"
    speedup = base.ms / row.ms
    return speedup, met(speedup >= GEMM_GOAL)


def gemm(recorder: Recorder, budget: Budget, progress: bool = True) -> list[dict] | None:
    """Time the bf16 top rung and every FP8 case at :data:`SHAPE` into ``recorder``; print
    and return one verdict per case (None, and the section named in ``budget.skipped``,
    when less than :data:`GEMM_RESERVE_S` is left)."""
    title = f"FP8 GEMM at {shape_label(SHAPE)} (bf16 top rung against each FP8 rung)"
    if budget.remaining() < GEMM_RESERVE_S:
        budget.skipped.append(title)
        return None
    top = best_rung("gemm", torch.bfloat16)
    print(f"\n{title}; goal: each FP8 rung >= {GEMM_GOAL}x the bf16 rung's speed")
    timed = dict(shapes=[SHAPE], progress=progress, out=recorder, budget=budget, passes=["forward"])
    base = _measured(bench("gemm", dtypes=[torch.bfloat16], rungs=[top.label], input_args={"layout": LAYOUT},
                           **timed), top.label)
    table = []
    for case in CASES:
        rung = kernels.get(case.op, case.rung)
        line = dict(recipe=case.recipe, op=case.op, rung=f"{case.rung} {rung.name}", ms=None,
                    tflops=None)
        why = why_not(case)
        if why is None:
            row = _measured(bench(case.op, dtypes=[case.dtype or fp8_dtype()], rungs=[case.rung],
                                  input_args=case.input_args, **timed), case.rung)
            speedup, verdict = _verdict(row, base)
            if row is not None and row.ok:
                line.update(ms=row.ms, tflops=row.tflops)
        else:
            speedup, verdict = None, f"skipped: {why}"
        table.append({**line, f"vs bf16 {top.label}": speedup, "goal": f">= {GEMM_GOAL}x",
                      "verdict": verdict})
    bf16 = (f"{base.ms:.3f} ms, {base.tflops:.0f} TFLOP/s" if base is not None and base.ok
            else "not measured" if base is None else f"error: {base.error}")
    print(f"bf16 gemm {top.label} ({top.name}): {bf16}")
    print(format_table(table))
    return table


def train(path: Path, budget: Budget) -> bool:
    """The bf16 workbench step against each of :data:`TRAIN_RECIPES` (those installed),
    rows saved to ``path``; print the summary with its verdicts. False if it did not run
    (the budget: named in ``budget.skipped``) or failed."""
    title = f"FP8 training step ({TRAIN_PRESET}, bf16 vs fp8 {' and '.join(TRAIN_RECIPES)})"
    if budget.remaining() < TRAIN_RESERVE_S:
        budget.skipped.append(title)
        return False
    recipes, not_here = fp8_parity.runnable(TRAIN_RECIPES)
    if not recipes:   # no FP8 run to compare: the bf16 run alone would train the 1B model for nothing
        print(f"\n{title}: not run, " + "; ".join(f"{label}: {why}" for label, why in not_here.items()))
        return False
    print(f"\n{title}: {TRAIN_STEPS} eager steps per run, median after {train_quick.WARMUP} "
          f"warm-up steps; tuning_s: each run's tuning pass, before its steps and not in them")
    for label, why in not_here.items():
        print(f"{label}: not run, {why}")
    runs = {BF16_RUN: dict(kernels="workbench"),
            **{fp8_parity.label(r): dict(kernels="workbench", fp8=r) for r in recipes}}
    try:
        path.parent.mkdir(exist_ok=True)
        summary = train_quick.compare(path, steps=TRAIN_STEPS, preset=TRAIN_PRESET, runs=runs)
    except Exception as exc:   # a failed run is reported, and the exit status says so
        print(f"FP8 training step failed: {type(exc).__name__}: {exc}")
        return False
    step_goal, loss_goal = f"step >= {STEP_GOAL}x", f"loss within {fp8_parity.GOAL:.0%}"
    for s in summary[1:]:
        s[step_goal] = met(s["speedup"] >= STEP_GOAL)
        s[loss_goal] = met(abs(s["loss_rel_diff"]) <= fp8_parity.GOAL)
    print(format_table(summary, list(summary[-1])))
    meeting = [s["run"] for s in summary[1:] if s[step_goal] == s[loss_goal] == "met"]
    print(f"goal (an FP8 recipe's {step_goal} bf16's, its last {loss_goal} of bf16's): "
          + (f"met by {', '.join(meeting)}" if meeting else "not met"))
    print(f"wrote {path}")
    return True
