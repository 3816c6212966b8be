"""`make gpu` on a bare GPU image: the test suite must collect without the notebook extra.

A lent GPU machine has torch, triton, numba and pytest but no ipywidgets, altair,
vl-convert or Jupyter, and no network to install them (``make gpu SYSTEM_PYTHON=1``).
A test module that imports one of those at the top would stop that run at collection,
before any GPU test ran. This collects the whole suite in a subprocess where those
packages are unimportable.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_EXTRA = ("ipywidgets", "altair", "vl_convert", "nbmake", "jupyterlab", "ipykernel")

BLOCKER = f'''\
"""Makes the notebook extra unimportable, as on a bare GPU image."""
import sys


class _NoNotebookExtra:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {NOTEBOOK_EXTRA!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _NoNotebookExtra())
'''


def test_suite_collects_without_the_notebook_extra(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    path = os.pathsep.join(p for p in (str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "KERNELS_BACKEND": "interpreter"}
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu",
                          "-p", "no:cacheprovider", "-p", "no:nbmake", "tests"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode in (0, 5), run.stdout[-3000:] + run.stderr[-3000:]   # 5: none selected
    assert "error" not in run.stdout.lower().split("collected")[-1], run.stdout[-3000:]
