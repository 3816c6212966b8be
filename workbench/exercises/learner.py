"""The learner's copy of a kernel exercise: where it lives, and importing it as a rung.

The copy is a plain file (``exercises/gemm_v2.py`` under the working directory, or
``$WORKBENCH_EXERCISES_DIR``): JupyterLab opens it beside the notebook, an editor opens it
anywhere, and Triton needs kernels to live in a file it can read the source of. It is
imported under a fresh module name each time, so an edit is always seen, and any rung it
declares is captured (:func:`kernels.registry.capturing_rungs`) instead of joining the
package's ladder.
"""
from __future__ import annotations

import importlib.util
import itertools
import linecache
import os
import sys
import textwrap
import traceback
from pathlib import Path
from types import ModuleType

import kernels
from kernels.registry import Rung, capturing_rungs

from . import source
from .model import KernelExercise

_fresh = itertools.count()


class LearnerError(Exception):
    """The learner's file could not be imported; the message points at its line."""


def workdir() -> Path:
    return Path(os.environ.get("WORKBENCH_EXERCISES_DIR") or Path.cwd() / "exercises")


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


def import_file(path: Path, op: str | None) -> tuple[ModuleType, list[Rung]]:
    """Import the learner's file; return it and the rungs it declared."""
    path = Path(path)
    if not path.exists():
        raise LearnerError(f"{path} does not exist: load the exercise first")
    if op is not None:
        kernels.spec(op)  # the package first, so only the learner's own rungs are captured
    name = f"workbench_learner_{path.stem}_{next(_fresh)}"
    linecache.checkcache(str(path))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module   # Triton and dataclasses look their module up by name
    try:
        with capturing_rungs(name) as captured:
            spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[name]
        frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == str(path)]
        where = f" (line {frames[-1].lineno}: {frames[-1].line})" if frames else ""
        raise LearnerError(f"{path.name} does not import: {type(error).__name__}: {error}{where}") from error
    return module, captured
