"""Importing a kernel file someone wrote (a learner's exercise copy, an engineer's file for
``workbench grade``, the ISA inspector's ``source=``) as rungs, afresh each time.

The file is imported under a fresh module name, so an edit is always seen, and any rung it
declares is captured (:func:`kernels.registry.capturing_rungs`) instead of joining the
package's ladder. It lives in the harness because every layer above reads such files: the
ISA inspector compiles them, the model predicts them, exercises and ``grade`` judge them.
"""
from __future__ import annotations

import importlib.util
import itertools
import linecache
import sys
import traceback
from pathlib import Path
from types import ModuleType

import kernels
from kernels.registry import Rung, capturing_rungs

_fresh = itertools.count()
_current: dict[Path, str] = {}   # a file's path -> the module name of its newest import


class KernelFileError(Exception):
    """The file could not be imported; the message points at its line."""


def import_file(path: Path, op: str | None) -> tuple[ModuleType, list[Rung]]:
    """Import the file at ``path`` afresh; return it and the rungs it declared (captured, never
    added to the package's ladder). ``op``: the package's ladder for it is loaded first."""
    path = Path(path)
    if not path.exists():
        raise KernelFileError(f"{path} does not exist: load the exercise first")
    if op is not None:
        kernels.spec(op)  # the package first, so only the learner's own rungs are captured
    name = f"workbench_learner_{path.stem}_{next(_fresh)}"
    # An older import of this file is superseded: out of sys.modules it is freed (with its
    # launch-plan caches) once its caller drops it, so a notebook's hundredth check does not
    # hold ninety-nine stale copies.
    sys.modules.pop(_current.pop(path.resolve(), ""), None)
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
        raise KernelFileError(f"{path.name} does not import: {type(error).__name__}: {error}{where}") from error
    _current[path.resolve()] = name
    return module, captured
