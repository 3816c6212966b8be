"""Which Triton releases this package works with, and the check ``import kernels`` makes.

A user does not choose their Triton freely: on ROCm it is the ``pytorch-triton-rocm`` that
their torch brings, on NVIDIA the ``triton`` of their torch wheel. So the range is stated,
proven, and checked at import, where a wrong version gives one clear message instead of a
compile error deep inside some kernel later.

On GPU backends (``hip``, ``cuda``), by what ``make compat`` showed (it compiles every
Triton rung for gfx942, gfx950 and sm90 under each release from PyPI; README "Supported
Triton versions" has its matrix):

* :data:`GPU_RANGE`: every rung compiles on every target. Quiet.
* :data:`PARTIAL`: older minors under which only the listed (rung, target) pairs fail.
  Import warns, naming them: every other rung is usable, and refusing the whole package
  would refuse a GPU image whose torch brings such a Triton (torch 2.11 brings 3.6). On one
  of the :data:`TARGETS` it names only that target's pairs, and is quiet if there are none.
* Anything older raises :class:`UnsupportedTritonError`: ``make compat`` could not show that
  it compiles the rungs (under 3.3 most kernel modules need a GPU driver just to import).
* Newer than the range warns: not tried yet, and nothing says it breaks.

The CPU interpreter needs :data:`INTERPRETER_MIN`: an older interpreter fails on every loop
with a runtime bound under NumPy >= 2.4 (it converts 1-element arrays to scalars, which
NumPy 2.4 removed). That only warns, because on a CPU machine the other use of Triton,
compiling rungs ahead of time for a GPU (the ISA inspector, ``make compat`` itself), works
under the releases above.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import warnings
from pathlib import Path

GPU_RANGE = ((3, 8), (3, 9))
"""(oldest, newest) Triton minor under which every rung compiles for gfx942, gfx950, sm90."""
PARTIAL = {
    (3, 4): ("gemm_mxfp4 v0 @ gfx942", "grouped_gemm_mxfp8 v0 @ gfx942"),
    (3, 5): ("gemm_mxfp4 v0 @ gfx942", "grouped_gemm_mxfp8 v0 @ gfx942"),
    (3, 6): ("gemm_mxfp4 v0 @ gfx942", "grouped_gemm_mxfp8 v0 @ gfx942"),
    (3, 7): ("gemm_mxfp4 v0 @ gfx942", "grouped_gemm_mxfp8 v0 @ gfx942"),
}
"""Minors below :data:`GPU_RANGE` -> the (rung @ target) compiles that fail under them."""
TARGETS = ("gfx942", "gfx950", "sm90")
"""The targets ``make compat`` compiles for (``workbench.isa.TARGETS``)."""
INTERPRETER_MIN = (3, 9)
"""The oldest Triton whose interpreter runs the kernels under NumPy >= 2.4."""


class UnsupportedTritonError(ImportError):
    """The installed Triton is older than any release the rungs were shown to compile under."""


class TritonVersionWarning(UserWarning):
    """Some rungs fail to compile under the installed Triton, or it is newer than any checked,
    or too old for the interpreter."""


def minor(version: str) -> tuple[int, int]:
    """(major, minor) of a version string, local builds included ("3.4.0+rocm6.4", torch's
    "2.11.0+cu130"): Triton's, and torch's for :mod:`kernels.torch_version`."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if not found:
        raise ValueError(f"cannot read a version from {version!r}")
    return int(found[1]), int(found[2])


def _name(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def gpu_range_text() -> str:
    """The GPU range as the README states it, e.g. "3.8 to 3.9"."""
    return f"{_name(GPU_RANGE[0])} to {_name(GPU_RANGE[1])}"


def oldest() -> tuple[int, int]:
    """The oldest minor under which rungs were shown to compile (some left out, if PARTIAL)."""
    return min([*PARTIAL, GPU_RANGE[0]])


def installed_version() -> str | None:
    """The version of the ``triton`` that ``import triton`` would load, without importing it
    (``import kernels`` stays cheap: Triton loads with the first kernel); None if there is none.

    Read from the dist-info beside the package that lists ``triton/__init__.py``, whatever
    the distribution's name (ROCm's is ``pytorch-triton-rocm``). A source checkout has none,
    and two distributions in one folder (pip's ``triton`` unpacked over ROCm's) cannot say
    whose files won: then only the module can tell, and it is imported.
    """
    spec = importlib.util.find_spec("triton")
    if spec is None or spec.origin is None:
        return None
    owners = [info for info in Path(spec.origin).parent.parent.glob("*.dist-info")
              if "triton" in info.name.lower() and (info / "RECORD").is_file()
              and "\ntriton/__init__.py," in "\n" + (info / "RECORD").read_text()]
    if len(owners) == 1:
        return importlib.metadata.PathDistribution(owners[0]).version
    import triton

    return triton.__version__


def check(backend: str, version: str | None, arch: str = "") -> None:
    """Raise or warn, as the module docstring says, for Triton ``version`` on ``backend`` and
    its ``arch`` ("gfx942", "sm_90"; None version: no Triton is installed, which the first
    kernel's ``import triton`` reports)."""
    if version is None:
        return
    installed = minor(version)
    if backend == "interpreter":
        if installed < INTERPRETER_MIN:
            warnings.warn(
                f"Triton {version} is installed, but the CPU interpreter needs Triton >= "
                f"{_name(INTERPRETER_MIN)}: older interpreters fail on every kernel loop with a "
                "runtime bound under NumPy >= 2.4. Install the `cpu` extra "
                f"(pip install 'triton>={_name(INTERPRETER_MIN)}'). Compiling rungs ahead of "
                f"time for GPUs (the ISA inspector) works with Triton {_name(oldest())} and newer.",
                TritonVersionWarning, stacklevel=3)
        return
    upgrade = (f"Install a torch whose Triton is {_name(GPU_RANGE[0])} or newer: on ROCm a newer "
               "ROCm torch (it brings pytorch-triton-rocm), on NVIDIA a newer torch, or "
               f"pip install 'triton>={_name(GPU_RANGE[0])}'.")
    if installed in PARTIAL:
        target = arch.replace("sm_", "sm")
        missing = [case for case in PARTIAL[installed]
                   if target not in TARGETS or case.endswith(f" @ {target}")]
        if missing:
            warnings.warn(
                f"Triton {version} is older than {gpu_range_text()}, the releases every rung "
                f"compiles under; with it these do not compile: {', '.join(missing)} (every "
                f"other rung does). {upgrade}", TritonVersionWarning, stacklevel=3)
    elif installed < GPU_RANGE[0]:
        raise UnsupportedTritonError(
            f"Triton {version} is installed, but the kernels need Triton {gpu_range_text()} on a "
            f"GPU ({_name(oldest())} with some rungs left out); no older release was shown to "
            f"compile them (make compat). {upgrade}")
    elif installed > GPU_RANGE[1]:
        warnings.warn(
            f"Triton {version} is newer than the newest release the kernels were checked with "
            f"({gpu_range_text()}); `make compat` compiles every rung under it to check.",
            TritonVersionWarning, stacklevel=3)
