"""JupyterLab saves widget state with a notebook only when jupyterlab-manager's ``saveState``
setting is on; without it a notebook reopened after a run shows "Error displaying widget:
model not found" (``tests/test_browser.py`` reopens notebook 90 to see it). The project
ships the setting as JupyterLab app settings, ``binder/overrides.json``, and both of its
environments install it: Binder's postBuild and the Makefile's venv.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OVERRIDES = ROOT / "binder" / "overrides.json"
TARGET = "share/jupyter/lab/settings/overrides.json"


def test_overrides_turn_on_saving_widget_state():
    assert json.loads(OVERRIDES.read_text()) == {"@jupyter-widgets/jupyterlab-manager:plugin": {"saveState": True}}


def test_binder_installs_the_overrides_into_its_prefix():
    post_build = (ROOT / "binder" / "postBuild").read_text()
    assert 'settings="$(python -c \'import sys; print(sys.prefix)\')/share/jupyter/lab/settings"' in post_build
    assert 'cp binder/overrides.json "$settings/overrides.json"' in post_build


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")
def test_the_makefile_venv_gets_the_overrides(tmp_path):
    dry_run = subprocess.run(["make", "-n", "-B", "setup", f"VENV={tmp_path}"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    assert dry_run.returncode == 0, dry_run.stderr
    assert f"cp binder/overrides.json {tmp_path}/{TARGET}" in dry_run.stdout
