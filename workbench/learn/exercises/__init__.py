"""Auto-graded exercises: every rung of every ladder, with hints, on the correctness harness.

    >>> from workbench import exercises                               # doctest: +SKIP
    >>> exercises.list_exercises()            # key, title, kind, passed, attempts, hints
    >>> exercises.load("gemm/v2")             # writes exercises/gemm_v2.py (a rung with a TODO)
    >>> exercises.check("gemm/v2")            # the harness judges your copy
    >>> exercises.hints("gemm/v2").widget()   # three hints, one per click
    >>> exercises.check("gemm/v2-mfma", answer=8)  # questions take an answer instead

A kernel exercise is a rung of the package with its one idea cut out (:mod:`.source`):
the package's rung is the solution and the learner's copy never imports it. Progress is
kept in a JSON file in the user's config folder (:mod:`.progress`).
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from . import learner, progress
from .catalog import all_exercises
from .grading import grade_answer, grade_kernel
from .hint_ladder import HintLadder
from .model import AnswerExercise, Exercise, KernelExercise, Verdict

__all__ = ["AnswerExercise", "Exercise", "HintLadder", "KernelExercise", "Verdict", "check",
           "get", "hints", "list_exercises", "load", "progress_widget"]


@lru_cache(maxsize=1)
def _catalog() -> dict[str, Exercise]:
    return all_exercises()


def get(key: str) -> Exercise:
    try:
        return _catalog()[key]
    except KeyError:
        raise KeyError(f"no exercise {key!r}; there are: {', '.join(_catalog())}") from None


def list_exercises(progress_file=None) -> list[dict]:
    """One row per exercise, in learning-path order, with the learner's progress."""
    done = progress.load(progress_file)
    return [dict(key=e.key, title=e.title, kind=e.kind,
                 passed=done.get(e.key, {}).get("passed", False),
                 attempts=done.get(e.key, {}).get("attempts", 0),
                 hints=done.get(e.key, {}).get("hints", 0)) for e in _catalog().values()]


def load(key: str, path: str | Path | None = None, overwrite: bool = False, into_cell: bool = False):
    """Start an exercise: a kernel exercise's file (returned), or an answer exercise's question.

    ``into_cell`` puts ``%%writefile <path>`` and the file into the next notebook cell, so
    the learner edits it there and running the cell saves it. An existing file is kept
    unless ``overwrite``: loading again never throws work away."""
    exercise = get(key)
    if isinstance(exercise, AnswerExercise):
        return exercise.question
    file = learner.write(exercise, path, overwrite)
    if into_cell:
        from IPython import get_ipython
        shell = get_ipython()
        if shell is None:
            raise RuntimeError("into_cell needs a notebook or IPython; edit the file instead")
        shell.set_next_input(f"%%writefile {file}\n" + file.read_text(encoding="utf-8"), replace=False)
    return file


def check(key: str, path: str | Path | None = None, answer=None, progress_file=None) -> Verdict:
    """Grade the learner's copy (or answer), record the attempt, and return the verdict.

    Grading the same file or answer again shows the verdict without counting a new attempt."""
    exercise = get(key)
    if isinstance(exercise, AnswerExercise):
        verdict = grade_answer(exercise, answer)
        graded = repr(answer).encode()
    else:
        file = Path(path) if path else learner.default_path(exercise)
        graded = file.read_bytes() if file.is_file() else b""
        try:
            module, captured = learner.import_file(file, exercise.op)
        except learner.LearnerError as error:
            verdict = Verdict(False, str(error))
        else:
            verdict = grade_kernel(exercise, module, captured)
    progress.record_attempt(key, verdict.passed, verdict.message, progress_file,
                            graded=hashlib.sha256(graded).hexdigest())
    return verdict


def hints(key: str, progress_file=None) -> HintLadder:
    return HintLadder(get(key), progress_file)


def progress_widget(progress_file=None):
    from .widgets import ProgressWidget
    return ProgressWidget(lambda: list_exercises(progress_file))
