"""The learner's copy of a kernel exercise: where it lives, and importing it as a rung.

The copy is a plain file (``gemm_v2.py`` in :func:`workdir`): JupyterLab opens it, an
editor opens it anywhere, and Triton needs kernels to live in a file it can read the source
of. There is one copy per exercise, whatever the working directory: a notebook (run in
``notebooks/``) and a terminal (run anywhere) grade the same file. It is
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
import re
import textwrap
import traceback
from pathlib import Path
from types import ModuleType

import kernels
from kernels.registry import Rung, capturing_rungs

from . import progress, source
from .model import KernelExercise

PROJECT = "amd-kernel-workbench"   # pyproject.toml's name: how a checkout is recognised

_fresh = itertools.count()


class LearnerError(Exception):
    """The learner's file could not be imported; the message points at its line."""


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
