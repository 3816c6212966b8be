"""The Binder launch: CPU-only, interpreter selected, notebook extras installed."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BINDER = Path(__file__).resolve().parent.parent / "binder"


def test_start_selects_the_interpreter():
    env = {k: v for k, v in os.environ.items() if k not in ("KERNELS_BACKEND", "TRITON_INTERPRET")}
    result = subprocess.run([str(BINDER / "start"), sys.executable, "-c",
                             "import kernels; print(kernels.backend.current().name)"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "interpreter"


def test_install_takes_cpu_torch_and_the_interpreter_and_notebook_extras():
    requirements = (BINDER / "requirements.txt").read_text()
    assert "download.pytorch.org/whl/cpu" in requirements
    post_build = (BINDER / "postBuild").read_text()
    assert '".[cpu,notebook]"' in post_build
    assert os.access(BINDER / "postBuild", os.X_OK) and os.access(BINDER / "start", os.X_OK)
