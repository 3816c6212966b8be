"""``workbench gpu-report``: the one command a GPU owner runs to record this GPU.

It measures the ceilings (a device copy and a large matmul), runs the quick suite (check
every rung, then time it with ``ref`` in the same run) and writes the rows, as they are
measured, to ``workbench/recorded/<gpu>-<date>.json``: the folder whose files ship with
the package, so the file can be committed as it is. Then it prints the ladder table,
every row with its ratio to ``ref`` and error rows with their message. Then, each if the
budget allows: the FP8 GEMM rungs against the bf16 top rung at 8192^3, rows into the same
file (:mod:`workbench.gpu_report_fp8`); a short training run of each kernel set
(:mod:`workbench.train.quick`) to ``recorded/train/<gpu>-<date>.json``, where notebook 04
shows it; the FP8 training step against bf16 to ``recorded/train/<gpu>-<date>-fp8.json``;
the top rungs' goals judged from what ran (:mod:`workbench.gpu_report_goals`); then, while
the budget lasts, the performance model beside each measured row of the quick
suite it covers (:mod:`workbench.model.measured`; ``workbench predict --against FILE`` redoes
it later, anywhere, from the file). ``--sections`` runs some of these alone (:data:`SECTIONS`).

A lent GPU session is short, so a time budget bounds the run: once it is spent no new
case starts, and the report names the cases it left out. Without a GPU it refuses
(exit code 2) and measures nothing.
"""
from __future__ import annotations

import sys
from pathlib import Path

import kernels

from . import gpu_report_fp8 as fp8, gpu_report_goals as goals
from .harness import environment, results
from .harness.bench import Budget
from .harness.ceilings import cache_path, measure_ceilings
from .harness.check import summarize
from .harness.suite import run_suite
from .harness.table import format_table
from .harness.timing import PerformanceUnavailable, require_gpu
from .train import quick as train_quick

RECORDED = Path(__file__).resolve().parent / "recorded"
BUDGET_S = 300.0   # with the gpu-marked tests, `make gpu` stays under 8 minutes
TRAIN_RESERVE_S = 90.0   # what the training step needs: JIT compiles, tuning, 2 x 8 steps
COLUMNS = ("op", "rung", "name", "shape", "dtype", "pass", "ms", "tflops", "gbps", "vs_ref")
SECTIONS = ("suite", "fp8-gemm", "train", "fp8-train")
"""What a report runs, in this order: ``suite`` (ceilings, quick suite, ladder, and last the
model beside its rows), ``fp8-gemm`` and ``fp8-train`` (:mod:`workbench.gpu_report_fp8`),
``train`` (the kernel sets' training step). ``make gpu`` runs them all; a lent session with
little time may ask for a few (``--sections fp8-gemm fp8-train``)."""


def report_path(gpu: str, day: str, folder: Path | None = None) -> Path:
    """``<folder>/<gpu slug>-<day>.json`` (default folder: :data:`RECORDED`); a second run
    that day gets ``-2``, ``-3``..., so no earlier run is overwritten."""
    folder = folder or RECORDED
    stem = f"{cache_path(gpu).stem}-{day}"   # the GPU's slug, as the ceilings cache spells it
    path, n = folder / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = folder / f"{stem}-{n}.json"
    return path


def _print_ceilings() -> None:
    try:
        c = measure_ceilings(force=True)
    except Exception as exc:   # the report goes on: ceilings are drawn beside, not needed
        print(f"ceilings: not measured ({type(exc).__name__}: {exc})")
        return
    peaks = ", ".join(f"{dtype} {tflops:.0f} TFLOP/s" for dtype, tflops in c["peak_tflops"].items())
    print(f"measured ceilings: HBM copy {c['hbm_tbps']:.2f} TB/s; matmul {peaks} "
          f"(cached in {cache_path(c['gpu'])})")


def gpu_report(budget_s: float = BUDGET_S, folder: Path | None = None, progress: bool = True,
               sections=SECTIONS) -> int:
    """The chosen :data:`SECTIONS`, in their order; 0 when every check passed, every case was
    measured and every chosen section ran, 1 when not (the file still holds what was
    measured), 2 without a GPU."""
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise ValueError(f"unknown sections {unknown}; sections: {', '.join(SECTIONS)}")
    try:
        require_gpu()
    except PerformanceUnavailable as exc:
        print(f"workbench gpu-report: {exc}", file=sys.stderr)
        return 2
    budget = Budget(budget_s)
    here = kernels.backend.current()
    path = report_path(here.device_name, environment.now()[:10], folder)
    print(f"GPU report: {here.device_name} ({here.name}, {here.arch}), commit "
          f"{environment.commit()}, budget {budget_s:.0f} s, sections "
          + ", ".join(s for s in SECTIONS if s in sections))
    recorder = results.Recorder(path)
    reports, rows, ran = [], [], []
    if "suite" in sections:
        reports, rows = _suite(recorder, budget, progress)
        ran.append(bool(reports))
    if "fp8-gemm" in sections:
        fp8.gemm(recorder, budget, progress)
    train_summary = None
    if "train" in sections:
        train_summary = _train_step(budget, path.parent / "train" / path.name)
        ran.append(train_summary is not None)
    if "fp8-train" in sections:
        ran.append(fp8.train(path.parent / "train" / f"{path.stem}-fp8.json", budget))
    if "suite" in sections or "train" in sections:
        print("\n" + goals.report(rows, train_summary))
    if "suite" in sections:
        _model_against(rows, budget)
    if budget.skipped:
        print(f"time budget of {budget_s:.0f} s spent; not run: " + "; ".join(budget.skipped))
    print(f"wrote {path}" if recorder.rows else "no rows: nothing written")
    failed = [r for r in reports if not r.passed]
    errors = [r for r in recorder.rows if not r.ok]
    return 0 if not (failed or errors or budget.skipped) and all(ran) else 1


def _suite(recorder: results.Recorder, budget: Budget, progress: bool):
    """Ceilings, then the quick suite into ``recorder`` and its tables; (reports, rows)."""
    _print_ceilings()
    print(f"\nquick suite, rows written to {recorder.path} as they are measured")
    reports, rows = run_suite("quick", out=recorder, progress=progress, budget=budget)
    print(format_table(summarize(reports)))
    print("\nLadder (vs_ref = ref's time / the rung's time, same shape, dtype, pass and run):")
    print(format_table(results.table(rows, COLUMNS)))
    failed = [r for r in reports if not r.passed]
    errors = [r for r in rows if not r.ok]
    print(f"\n{len(rows) - len(errors)} rows measured, {len(errors)} error rows, "
          f"{len(failed)} of {len(reports)} checks failed")
    return reports, rows


def _train_step(budget: Budget, path: Path) -> list[dict] | None:
    """The short training comparison's summary, unless less than :data:`TRAIN_RESERVE_S` of
    the budget is left (it cannot stop midway); None if it did not run or failed."""
    if budget.remaining() < TRAIN_RESERVE_S:
        budget.skipped.append(f"training step ({train_quick.PRESET}, {' vs '.join(train_quick.KERNEL_SETS)})")
        return None
    print(f"\ntraining step: {train_quick.PRESET}, {train_quick.STEPS} eager steps per kernel set, "
          f"median after {train_quick.WARMUP} warm-up steps")
    try:
        path.parent.mkdir(exist_ok=True)
        summary = train_quick.compare(path)
    except Exception as exc:   # a failed run is reported, and the exit status says so
        print(f"training step failed: {type(exc).__name__}: {exc}")
        return None
    print(format_table(summary))
    print(f"wrote {path}")
    return summary


def _model_against(rows, budget: Budget) -> None:
    """Each prediction compiles its rung for this GPU's target on the CPU, so it runs last
    and stops when the budget is spent (the cases left say so)."""
    from .model import measured

    print("\n" + measured.report(*measured.compare(rows, stop=lambda: budget.remaining() <= 0)))
