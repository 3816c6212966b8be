"""The Binder launch: CPU-only, interpreter selected, notebook extras installed.

repo2docker reads ``binder/``: ``runtime.txt`` picks the Python, ``requirements.txt`` is
installed first (before the repository is in place, hence torch only), ``postBuild`` then
installs the package, and ``start`` wraps every process the user's session runs. The fast
tests check that these four agree with each other and with ``pyproject.toml``; the slow
one builds them the way Binder does, in a fresh virtual environment, and runs notebook 00.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

ROOT = Path(__file__).resolve().parent.parent
BINDER = ROOT / "binder"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _requirements() -> tuple[list[str], list[Requirement]]:
    """(pip options, requirements) of binder/requirements.txt, comments dropped."""
    lines = [line.split("#")[0].strip() for line in (BINDER / "requirements.txt").read_text().splitlines()]
    options = [line for line in lines if line.startswith("-")]
    return options, [Requirement(line) for line in lines if line and not line.startswith("-")]


def _post_build_extras() -> set[str]:
    found = re.findall(r'pip install [^\n]*-e "\.\[([\w,]+)\]"', (BINDER / "postBuild").read_text())
    assert len(found) == 1, "postBuild should install the checkout once, with its extras"
    return set(found[0].split(","))


def test_start_selects_the_interpreter():
    env = {k: v for k, v in os.environ.items() if k not in ("KERNELS_BACKEND", "TRITON_INTERPRET")}
    result = subprocess.run([str(BINDER / "start"), sys.executable, "-c",
                             "import kernels; print(kernels.backend.current().name)"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "interpreter"


def test_install_takes_cpu_torch_and_the_interpreter_and_notebook_extras():
    options, _ = _requirements()
    assert f"--extra-index-url {CPU_INDEX}" in options
    assert _post_build_extras() == {"cpu", "notebook"}
    assert os.access(BINDER / "postBuild", os.X_OK) and os.access(BINDER / "start", os.X_OK)


def test_runtime_python_satisfies_requires_python():
    runtime = (BINDER / "runtime.txt").read_text().strip()
    match = re.fullmatch(r"python-(\d+\.\d+)", runtime)
    assert match, f"runtime.txt should read python-X.Y, got {runtime!r}"
    assert SpecifierSet(PYPROJECT["requires-python"]).contains(match.group(1) + ".0")


def test_requirements_pin_the_cpu_wheel_of_the_tested_torch():
    """torch is the only requirement (the rest comes with the package in postBuild); it is
    pinned to the Makefile's release, CPU build, and satisfies the package's own range."""
    _, requirements = _requirements()
    assert [r.name for r in requirements] == ["torch"]
    pins = list(requirements[0].specifier)
    assert len(pins) == 1 and pins[0].operator == "==", "pin one exact torch"
    tested = re.search(r"^TORCH \?= torch==(\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert pins[0].version == f"{tested}+cpu"
    declared = next(Requirement(d) for d in PYPROJECT["dependencies"] if d.startswith("torch"))
    assert declared.specifier.contains(pins[0].version)


def test_post_build_extras_exist_and_bring_the_notebook_runner():
    extras = PYPROJECT["optional-dependencies"]
    assert _post_build_extras() <= set(extras)
    names = {Requirement(d).name for extra in _post_build_extras() for d in extras[extra]}
    # triton for the interpreter, numba-cuda for the SIMT simulator, jupyterlab and
    # ipykernel so `start jupyter ...` finds a server, nbconvert and a kernel.
    assert {"triton", "numba-cuda", "jupyterlab", "ipykernel", "ipywidgets"} <= names


def _reachable(url: str) -> bool:
    host = url.split("/")[2]
    try:
        socket.getaddrinfo(host, 443)
        return True
    except OSError:
        return False


def _tracked_copy(dest: Path) -> Path:
    """The checkout's tracked files (what Binder clones), with their working-tree contents."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True,
                           timeout=60).stdout.decode().split("\0")
    for name in filter(None, files):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    return dest


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.runs_notebook("00_start_here.ipynb")
def test_binder_build_in_a_fresh_venv_runs_notebook_00(tmp_path):
    """requirements.txt, postBuild from the repository root, then notebook 00 under start
    (every cell: nbconvert stops at an error, so nbmake need not run it again).

    Where PyTorch's CPU index cannot be reached (an offline CI machine), the same pinned
    wheel must come from pip's local sources (``PIP_FIND_LINKS``, e.g. this machine's
    /opt/wheels): the index line is left out of a copy of requirements.txt, so pip does
    not spend minutes retrying a host it cannot resolve. pip's cache is used as usual for
    requirements.txt; postBuild passes --no-cache-dir, as it does on Binder. The torch install
    skips compiling bytecode (--no-compile; tens of CPU seconds for torch alone), which
    changes nothing the notebook checks: Python compiles what it imports. postBuild's install
    skips it too, through pip's environment (``PIP_COMPILE=false``, the value of its
    ``--compile`` switch; the file itself is run as Binder runs it).
    """
    repo = _tracked_copy(tmp_path / "repo")
    env = {k: v for k, v in os.environ.items()
           if k not in ("KERNELS_BACKEND", "TRITON_INTERPRET", "PYTHONPATH", "VIRTUAL_ENV")}
    venv.create(tmp_path / "venv", with_pip=True)
    env["PATH"] = f"{tmp_path / 'venv' / 'bin'}{os.pathsep}{env['PATH']}"
    requirements = BINDER / "requirements.txt"
    if not _reachable(CPU_INDEX):
        offline = tmp_path / "requirements-offline.txt"
        offline.write_text("".join(line for line in requirements.read_text().splitlines(True)
                                   if CPU_INDEX not in line))
        requirements = offline
        print(f"{CPU_INDEX} is unreachable: the pinned torch comes from pip's local sources")

    def step(name, command):
        start = time.monotonic()
        result = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"{name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        print(f"{name}: {time.monotonic() - start:.0f} s")

    step("requirements.txt", ["python", "-m", "pip", "install", "-q", "--no-compile", "-r", str(requirements)])
    env["PIP_COMPILE"] = "false"
    step("postBuild", [str(repo / "binder" / "postBuild")])
    step("notebook 00", [str(repo / "binder" / "start"), "jupyter", "nbconvert", "--execute",
                         "--to", "notebook", "notebooks/00_start_here.ipynb",
                         "--output-dir", str(tmp_path), "--output", "executed"])
    executed = (tmp_path / "executed.ipynb").read_text()
    assert '"output_type": "error"' not in executed
    assert "interpreter" in executed    # workbench.info() printed the backend start selected
