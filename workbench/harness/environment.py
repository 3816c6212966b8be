"""What a result was measured with: GPU, backend, versions, commit, time."""
from __future__ import annotations

import datetime as _dt
import importlib.metadata
import subprocess
from pathlib import Path

import torch

import kernels


def package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def triton_version() -> str:
    try:
        import triton
        return triton.__version__
    except ImportError:
        return "not installed"


def commit() -> str:
    """The git commit of this checkout (with "+dirty" for local changes), or "unknown"."""
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def describe() -> dict:
    """Everything ``workbench info`` prints, as a dict."""
    here = kernels.backend.current()
    return {
        "backend": here.name,
        "device": here.device_name,
        "arch": here.arch,
        "compute_units": here.compute_units,
        "torch": torch.__version__,
        "torch_hip": torch.version.hip or "-",
        "torch_cuda": torch.version.cuda or "-",
        "triton": triton_version(),
        "numba": package_version("numba"),
        "numba_cuda": package_version("numba-cuda"),
        "numba_hip": package_version("numba-hip"),
        "commit": commit(),
    }
