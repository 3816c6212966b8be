"""Grading: the learner's rung faces the same harness as the package's, then a speed target.

A kernel exercise passes when the learner's rung passes :func:`workbench.check.check_rung`
(fresh random inputs, poisoned output, float64 reference) at every shape and dtype the
exercise names, under the CPU guards (:mod:`.guards`) that name an out-of-bounds program
or a racing thread. On a GPU it must then be about as fast as the previous rung or
faster (the idea it adds must pay); on the CPU the interpreter's times mean nothing, and
the verdict says the speed was not checked. A correct kernel's verdict also shows the
performance model's time for the learner's file beside the rung below's, on MI300X
(:func:`predicted_line`): shown, on a CPU or a GPU, and never graded.
"""
from __future__ import annotations

import functools
import inspect
import itertools
import math
from numbers import Number
from types import ModuleType

import torch

import kernels
from kernels.registry import Rung

from ... import isa
from ...model import rung as rung_model
from ...harness.check import check_rung
from .guards import OutOfBounds, SharedMemoryRace, cpu_guards
from .model import AnswerExercise, KernelExercise, Verdict

NOISE = 0.95   # timings within 5 % count as equal
MODEL_TARGET = "gfx942"   # the model's line predicts the learner's rung for this target's first GPU (MI300X)


def _root_cause(error: BaseException) -> BaseException:
    """The learner's error inside the interpreter's or simulator's wrapping."""
    while error.__cause__ is not None and not isinstance(error, (OutOfBounds, SharedMemoryRace)):
        error = error.__cause__
    return error


def _previous(entry: Rung) -> Rung | None:
    """The rung to beat: the nearest lower one that runs here and computes what this one does
    (a backward rung is not timed against a forward-only one); None for a ladder's first."""
    lower = [r for r in kernels.variants(entry.op, include_ref=False)
             if r.rung < entry.rung and r.backward == entry.backward and r.runs_here()]
    return lower[-1] if lower else None


def _speed(exercise: KernelExercise, entry: Rung) -> tuple[bool, str]:
    here = kernels.backend.current()
    if not here.is_gpu:
        return True, "speed: not checked (no GPU here; the CPU interpreter's times say nothing about a GPU)"
    from ...harness.timing import time_ms

    previous = _previous(entry)
    if previous is None:
        return True, f"speed: not checked (no lower rung {'with a backward ' if entry.backward else ''}to beat)"
    spec = kernels.spec(exercise.op)
    name = rung_model.representative(exercise.op)[0]
    dtype = next(d for d in entry.dtypes if previous.supports(d))
    inputs = spec.make_inputs(spec.bench_shapes[name], dtype, device=here.device, seed=0)
    mine = time_ms(entry.bind(*inputs)).median_ms
    theirs = time_ms(previous.bind(*inputs)).median_ms
    ratio = theirs / mine
    line = (f"speed at {name} ({dtype_name(dtype)}): {ratio:.2f}x {previous.title} "
            f"({mine:.3f} ms vs {theirs:.3f} ms); target >= {exercise.speed_target:.2f}x")
    return ratio >= exercise.speed_target * NOISE, line


def predicted_line(entry: Rung) -> str:
    """The model's time for the learner's rung (compiled from their file) beside the rung
    below's, at the op's representative shape on MI300X; labelled as shown, not graded."""
    dtype = isa.default_dtype(entry, MODEL_TARGET)
    try:
        found = rung_model.step(entry.op, entry.label, dtype, rung_model.gpu_for(MODEL_TARGET),
                                source=inspect.getsourcefile(entry.fn))
    except RuntimeError as error:   # the ahead-of-time compile of the file failed
        return (f"Model (shown, not graded): your {entry.label} does not compile ahead of time for "
                f"{MODEL_TARGET}: {str(error).splitlines()[0]}")
    return f"{found.text()} (Shown, not graded.)"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def grade_kernel(exercise: KernelExercise, module: ModuleType, captured: list[Rung]) -> Verdict:
    if exercise.grade is not None:
        return exercise.grade(module, captured)
    return harness_verdict(exercise, captured)


def harness_verdict(exercise: KernelExercise, captured: list[Rung]) -> Verdict:
    """The learner's rung (captured from their file) against the harness, then the speed target.

    An exercise with its own ``grade`` can call this first and then check its idea, for a
    rung whose TODO version would still be correct (a program order, a pipeline depth)."""
    entries = [r for r in captured if r.op == exercise.op and r.label == exercise.rung]
    if not entries:
        return Verdict(False, f"the file declares no {exercise.op} {exercise.rung} rung: keep its "
                              f"@rung(...) decorator as it was")
    entry = entries[0]
    spec = kernels.spec(exercise.op)
    shapes = exercise.shapes or tuple(spec.smoke_shapes[:2])
    dtypes = exercise.dtypes or entry.dtypes[:1]
    reports = []
    for shape, dtype, seed in itertools.product(shapes, dtypes, exercise.seeds or (None,)):
        try:
            with cpu_guards(entry.kind):
                report = check_rung(entry, shape, dtype, seed=seed)
        except NotImplementedError as error:
            return Verdict(False, f"not done yet: {error}", tuple(reports))
        except Exception as error:  # the learner's kernel broke: say how, and where
            cause = _root_cause(error)
            return Verdict(False, f"at shape {shape}, {dtype_name(dtype)}: "
                                  f"{type(cause).__name__}: {cause}", tuple(reports))
        reports.append(report)
        if not report.passed:
            return Verdict(False, f"at shape {shape}, {dtype_name(dtype)}: {report.message}",
                           tuple(reports))
    fast_enough, speed = _speed(exercise, entry)
    checked = (f"{len(reports)} check{'' if len(reports) == 1 else 's'} ({', '.join(map(str, shapes))}; "
               f"{', '.join(map(dtype_name, dtypes))}) passed")
    model_line = functools.partial(predicted_line, entry)
    if not fast_enough:
        return Verdict(False, f"correct ({checked}), but too slow", tuple(reports), speed, model_line)
    return Verdict(True, checked, tuple(reports), speed, model_line)


def with_idea(harness: Verdict, missing: str | None, seen: str) -> Verdict:
    """A correct rung judged on its idea too: ``missing`` says what the idea's own check did
    not find (None: it found it), ``seen`` what it saw when it passed."""
    if missing:
        return Verdict(False, f"correct ({harness.message}), but {missing}", harness.reports, harness.speed,
                       harness.predict)
    return Verdict(harness.passed, f"{harness.message}; {seen}", harness.reports, harness.speed,
                   harness.predict)


def _matches(given, expected, tolerance: float) -> bool:
    if isinstance(expected, str):
        return isinstance(given, str) and given.strip().lower() == expected.strip().lower()
    if isinstance(expected, (list, tuple)):
        return (isinstance(given, (list, tuple)) and len(given) == len(expected)
                and all(_matches(g, e, tolerance) for g, e in zip(given, expected)))
    if isinstance(expected, Number) and isinstance(given, Number) and not isinstance(given, bool):
        return math.isclose(given, expected, rel_tol=tolerance, abs_tol=0.0 if tolerance else 1e-12)
    return given == expected


def grade_answer(exercise: AnswerExercise, given) -> Verdict:
    if given is None:
        return Verdict(False, f"no answer given: check({exercise.key!r}, answer=...)")
    expected = exercise.answer()
    if _matches(given, expected, exercise.tolerance):
        return Verdict(True, f"{given!r} is right. {exercise.explain}".strip())
    within = f" (within {exercise.tolerance:.0%})" if exercise.tolerance else ""
    return Verdict(False, f"{given!r} is not the answer{within}; try the next hint")
