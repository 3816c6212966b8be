"""`make gpu` on a bare GPU image: the test suite must collect without the notebook tooling.

A lent GPU machine has torch, triton, numba and the test runner (pytest, pytest-xdist,
pytest-timeout, hypothesis) but not the notebook extra nor what it brings: no ipywidgets,
altair, Jupyter, nbformat, nbclient, IPython or jsonschema, and no network to install them
(``make gpu SYSTEM_PYTHON=1``). A test module that imports one of those at the top would stop
that run at collection, before any GPU test ran. This collects the whole suite in a
subprocess where every module that only the notebook tooling brings is unimportable: the
dependency closure of the notebook extra and of nbmake and playwright, less that of what such
an image has (the package's base requirements, triton, the ``cuda`` extra and the test runner).
Checking the extras' names alone missed ``nbformat``, which ``tests/test_notebook_00.py``
imported at the top: collection failed on a copy of the GPU image's torch 2.11 and triton 3.6.
"""
from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "amd-kernel-workbench"
ON_THE_IMAGE = ("triton", "pytest", "pytest-xdist", "pytest-timeout", "hypothesis")
"""Besides the package's base requirements and its ``cuda`` extra."""
NOTEBOOK_TOOLING = ("nbmake", "playwright")
"""Besides the ``notebook`` extra: the dev extra's tools that only notebooks need."""

BLOCKER = '''\
"""Makes the notebook tooling unimportable, as on a bare GPU image."""
import sys


class _NoNotebookTooling:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _NoNotebookTooling())
'''


def _requirements(name: str, extra: str = "") -> list[str]:
    """The installed distribution's requirements that apply with ``extra`` (none if absent)."""
    try:
        texts = metadata.requires(name) or []
    except metadata.PackageNotFoundError:
        return []
    wanted = []
    for text in texts:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate({"extra": extra}):
            wanted.append(requirement.name)
    return wanted


def _closure(names) -> set[str]:
    """The distributions ``names`` need, themselves included, by canonical name."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name not in seen:
            seen.add(name)
            todo += _requirements(name)
    return seen


def notebook_only_modules() -> set[str]:
    """Top-level modules whose every distribution only the notebook tooling brings."""
    requested = [name for name in _requirements(PACKAGE, "notebook")
                 if canonicalize_name(name) not in _closure(_requirements(PACKAGE))]
    if not requested:
        pytest.skip(f"{PACKAGE} is not installed with its requirements' metadata (pip install -e .)")
    kept = _closure([*_requirements(PACKAGE), *_requirements(PACKAGE, "cuda"), *ON_THE_IMAGE])
    brought = _closure([*requested, *NOTEBOOK_TOOLING]) - kept
    return {module for module, dists in metadata.packages_distributions().items()
            if all(canonicalize_name(dist) in brought for dist in dists)}


def test_the_blocked_modules_are_the_notebook_tooling_and_not_the_image_s_own():
    blocked = notebook_only_modules()
    assert {"ipywidgets", "altair", "nbformat", "nbclient", "IPython", "jsonschema"} <= blocked
    assert not {"torch", "triton", "numba", "numpy", "pytest", "hypothesis", "yaml", "jinja2"} & blocked


def test_suite_collects_without_the_notebook_tooling(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCKER.format(blocked=sorted(notebook_only_modules())))
    path = os.pathsep.join(p for p in (str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "KERNELS_BACKEND": "interpreter"}
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu",
                          "-p", "no:cacheprovider", "-p", "no:nbmake", "tests"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode in (0, 5), run.stdout[-3000:] + run.stderr[-3000:]   # 5: none selected
    assert "error" not in run.stdout.lower().split("collected")[-1], run.stdout[-3000:]
