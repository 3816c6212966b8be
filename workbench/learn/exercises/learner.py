"""The learner's copy of a kernel exercise: where it lives, and importing it as a rung.

The copy is a plain file (``gemm_v2.py`` in :func:`workdir`): JupyterLab opens it, an
editor opens it anywhere, and Triton needs kernels to live in a file it can read the source
of. There is one copy per exercise, whatever the working directory: a notebook (run in
``notebooks/``) and a terminal (run anywhere) grade the same file. It is imported afresh
each time, its rungs captured (:func:`workbench.harness.kernel_file.import_file`, here by
its exercise names ``import_file`` and ``LearnerError``).
"""
from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path


from ...harness.kernel_file import KernelFileError as LearnerError, import_file  # noqa: F401 (the exercises' names)
from . import progress, source
from .model import KernelExercise

PROJECT = "amd-kernel-workbench"   # pyproject.toml's name: how a checkout is recognised


def workdir() -> Path:
    """``$WORKBENCH_EXERCISES_DIR``; else ``exercises/`` at the top of the checkout this
    package is imported from (JupyterLab's file browser shows it beside ``notebooks/``, git
    ignores it); else, for an installed package, ``exercises/`` beside the progress file."""
    if os.environ.get("WORKBENCH_EXERCISES_DIR"):
        return Path(os.environ["WORKBENCH_EXERCISES_DIR"])
    root = Path(__file__).resolve().parents[3]
    if _is_checkout(root):
        return root / "exercises"
    return progress.progress_path().parent / "exercises"


def _is_checkout(root: Path) -> bool:
    """Whether ``root`` holds this project's pyproject.toml (Python 3.10 has no tomllib)."""
    try:
        text = (root / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return False
    return re.search(rf'^name\s*=\s*"{PROJECT}"', text, re.MULTILINE) is not None


def default_path(exercise: KernelExercise) -> Path:
    return workdir() / (exercise.key.replace("/", "_") + ".py")


def template(exercise: KernelExercise) -> str:
    """The learner's starting file: the rung with its idea replaced by the TODO stubs."""
    task = "\n".join("# " + line for line in textwrap.wrap(exercise.task, 88))
    header = (f"# Exercise {exercise.key}: {exercise.title}\n#\n{task}\n#\n"
              f'# Check it: workbench.exercises.check("{exercise.key}"), or `workbench exercise '
              f'check {exercise.key}`.\n# Hints: workbench.exercises.hints("{exercise.key}"), or '
              f"`workbench exercise hint {exercise.key}`.\n")
    return header + source.render(exercise.module, exercise.todo)


def write(exercise: KernelExercise, path: Path | None = None, overwrite: bool = False) -> Path:
    """Write the starting file (never over a learner's work unless asked) and return its path."""
    path = Path(path) if path else default_path(exercise)
    if path.exists() and not overwrite:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(template(exercise), encoding="utf-8")
    return path


