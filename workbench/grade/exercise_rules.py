"""An exercise's own rules as a graded section: ``workbench grade FILE --exercise OP/vN``.

Some exercises judge an idea the harness cannot see, because the idea's wrong answers are
numerically right: GEMM v3's program order, v4's peeled hot loop, v6's work units, FP8
v1's FP8 matrix instructions, attention v3's skipped tiles and saved log-sum-exp, the
grouped and MoE rungs' races. With ``--exercise`` the grade runs the exercise's own
checker (:func:`workbench.learn.exercises.grading.grade_kernel`: its harness at its shapes and
seeds, then its idea) on the file, in the file's process, and the file passes only if
that passes too, failing with the exercise's own reason. The exercise also sets what the
grade checks by default: its op, its rung's callable, its shapes, dtypes and first seed.
An exercise without an op (a helper such as grouped GEMM v2's schedule, a collective) is
graded by its rules alone.
"""
from __future__ import annotations

from pathlib import Path


def exercise(key: str):
    """The kernel exercise ``key`` (a clear error for an unknown key or a question)."""
    from ..learn.exercises import get
    from ..learn.exercises.model import KernelExercise

    found = get(key)
    if not isinstance(found, KernelExercise):
        raise ValueError(f"{key} is a question, not a kernel exercise: nothing to grade a file against")
    return found


def defaults(key: str) -> dict:
    """What an exercise sets when the grade does not: op, entry, shapes, dtypes, seed."""
    import kernels

    found = exercise(key)
    if found.op is None:
        return {"op": None}
    return {"op": found.op, "entry": kernels.get(found.op, found.rung).fn.__name__,
            "shapes": list(found.shapes) or None,
            "dtypes": [str(d).removeprefix("torch.") for d in found.dtypes] or None,
            "seed": found.seeds[0] if found.seeds else None}


def judge(key: str, file: str | Path) -> dict:
    """The exercise's checker on ``file``: {"key", "passed", "message"} (its speed line too,
    where it has one: on a GPU an exercise also has a speed target)."""
    from ..learn.exercises import learner
    from ..learn.exercises.grading import grade_kernel

    found = exercise(key)
    try:
        module, captured = learner.import_file(Path(file), found.op)
    except learner.LearnerError as error:
        return {"key": key, "passed": False, "message": str(error)}
    verdict = grade_kernel(found, module, captured)
    return {"key": key, "passed": verdict.passed, "message": verdict.message, "speed": verdict.speed}
